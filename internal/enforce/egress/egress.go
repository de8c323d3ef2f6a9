// Package egress binds a sandbox's network egress to DNS answers, in the
// kernel (bpf/egress.c): cgroup socket-address programs on each sandbox root
// redirect every DNS query (TCP and UDP port 53, any address) to the DNS
// proxy and show the client the server it asked, and refuse connections and
// datagrams to any address the proxy did not answer for that sandbox (until
// the admission, min(TTL, the policy's cap) plus a grace period, expires; and
// only on the ports and protocols the policy allows for the name answered),
// unless a CIDR or loopback service rule of the policy allows it.
//
// The proxy learns which sandbox asked from the client's source port, which
// the kernel side records (see Egress.LookupClient); after an allowed answer
// it calls Egress.Admit with the answer's addresses, TTL and port spans.
package egress

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/enforce"
)

// Group is the hook group name: links are pinned under
// enforce.LinkPinDir(pinDir, Group).
const Group = "egress"

// Kernel limits, mirrored from bpf/egress.c.
const (
	// MaxAllowEntries is the capacity of the answered-address map, shared
	// by all sandboxes.
	MaxAllowEntries = 65536
	// MaxRangesPerPrefix bounds the port ranges one CIDR can carry after
	// rules with overlapping prefixes are merged.
	MaxRangesPerPrefix = 8
)

// Flags of struct net_config (EGRESS_F_* in bpf/egress.c).
const (
	flagRecordOnly uint32 = 1
	flagProxy4     uint32 = 2
	flagProxy6     uint32 = 4
	flagResolvers  uint32 = 8
	flagUnix       uint32 = 16
)

// Protocol bits of struct port_range.
const (
	protoBitTCP uint32 = 1
	protoBitUDP uint32 = 2
)

// Options configure the egress hook group.
type Options struct {
	// MaxAddresses caps the answered addresses kept per sandbox; beyond it
	// the earliest-expiring one is evicted (and counted). Default 4096.
	MaxAddresses int
	// Grace is added to every answer's TTL before its addresses are
	// refused again. Default 30s.
	Grace time.Duration
	// Notify receives events produced in Go (allowlist overflow). Optional.
	Notify func(audit.Event)
}

// Egress is the loaded egress hook group.
type Egress struct {
	objs   objects
	pinDir string
	// unixErr is nil when the unix socket programs loaded (kernel 6.7+).
	unixErr error
	opts    Options

	mu        sync.Mutex
	sandboxes map[uint32]*sandboxState
	total     int // entries in egress_admit
	links     map[uint64][]link.Link
}

// sandboxState mirrors what the kernel holds for one sandbox.
type sandboxState struct {
	// allowed maps an answered address to its admission (admit.go).
	allowed  map[netip.Addr]*admission
	cidrKeys map[egressCidrKey]struct{}
	unixKeys map[egressUnixKey]struct{}
	overflow uint64
}

// objects are the loaded maps and programs: the inet programs always, the
// unix ones where the kernel has cgroup unix socket hooks (6.7+).
type objects struct {
	egressMaps
	inetPrograms
	unix unixPrograms
}

type inetPrograms struct {
	EgressConnect4     *ebpf.Program `ebpf:"egress_connect4"`
	EgressConnect6     *ebpf.Program `ebpf:"egress_connect6"`
	EgressGetpeername4 *ebpf.Program `ebpf:"egress_getpeername4"`
	EgressGetpeername6 *ebpf.Program `ebpf:"egress_getpeername6"`
	EgressRecvmsg4     *ebpf.Program `ebpf:"egress_recvmsg4"`
	EgressRecvmsg6     *ebpf.Program `ebpf:"egress_recvmsg6"`
	EgressSendmsg4     *ebpf.Program `ebpf:"egress_sendmsg4"`
	EgressSendmsg6     *ebpf.Program `ebpf:"egress_sendmsg6"`
}

type unixPrograms struct {
	EgressConnectUnix *ebpf.Program `ebpf:"egress_connect_unix"`
	EgressSendmsgUnix *ebpf.Program `ebpf:"egress_sendmsg_unix"`
}

func (o *objects) Close() error {
	for _, p := range o.programs() {
		if p.prog != nil {
			p.prog.Close()
		}
	}
	return o.egressMaps.Close()
}

// programs lists the hook group's programs with their attach types.
func (o *objects) programs() []struct {
	name   string
	prog   *ebpf.Program
	attach ebpf.AttachType
} {
	return []struct {
		name   string
		prog   *ebpf.Program
		attach ebpf.AttachType
	}{
		{"connect4", o.EgressConnect4, ebpf.AttachCGroupInet4Connect},
		{"connect6", o.EgressConnect6, ebpf.AttachCGroupInet6Connect},
		{"sendmsg4", o.EgressSendmsg4, ebpf.AttachCGroupUDP4Sendmsg},
		{"sendmsg6", o.EgressSendmsg6, ebpf.AttachCGroupUDP6Sendmsg},
		{"recvmsg4", o.EgressRecvmsg4, ebpf.AttachCGroupUDP4Recvmsg},
		{"recvmsg6", o.EgressRecvmsg6, ebpf.AttachCGroupUDP6Recvmsg},
		{"getpeername4", o.EgressGetpeername4, ebpf.AttachCgroupInet4GetPeername},
		{"getpeername6", o.EgressGetpeername6, ebpf.AttachCgroupInet6GetPeername},
		{"connect_unix", o.unix.EgressConnectUnix, ebpf.AttachCgroupUnixConnect},
		{"sendmsg_unix", o.unix.EgressSendmsgUnix, ebpf.AttachCgroupUnixSendmsg},
	}
}

// Load loads the egress programs; their maps are pinned by name beside the
// engine's shared maps, so a restarted agent adopts the answered addresses,
// the rules and the DNS client records already in force.
func Load(eng *enforce.Engine, opts Options) (*Egress, error) {
	if opts.MaxAddresses <= 0 {
		opts.MaxAddresses = 4096
	}
	if opts.MaxAddresses > MaxAllowEntries {
		return nil, fmt.Errorf("load egress: max addresses %d above the kernel map's %d", opts.MaxAddresses, MaxAllowEntries)
	}
	if opts.Grace <= 0 {
		opts.Grace = 30 * time.Second
	}
	e := &Egress{pinDir: eng.PinDir(), opts: opts, sandboxes: map[uint32]*sandboxState{}, links: map[uint64][]link.Link{}}
	spec, err := loadEgress()
	if err != nil {
		return nil, fmt.Errorf("load egress: %w", err)
	}
	copts := eng.CollectionOptions()
	if err := spec.LoadAndAssign(&e.objs.egressMaps, copts); err != nil {
		return nil, fmt.Errorf("load egress: %w", err)
	}
	// The programs use the maps just loaded (pinned by name, but the
	// replacement makes it explicit for unpinned ones too).
	copts.MapReplacements = map[string]*ebpf.Map{}
	for name := range spec.Maps {
		if m := e.objs.mapByName(name); m != nil {
			copts.MapReplacements[name] = m
		}
	}
	if err := spec.LoadAndAssign(&e.objs.inetPrograms, copts); err != nil {
		e.objs.Close()
		return nil, fmt.Errorf("load egress: %w", err)
	}
	if err := spec.LoadAndAssign(&e.objs.unix, copts); err != nil {
		e.unixErr = fmt.Errorf("cgroup unix socket hooks (kernel 6.7+): %w", err)
	}
	if lo, hi, err := ephemeralPorts(); err == nil {
		if err := e.objs.EgressEphemeral.Put(uint32(0), egressPortSpan{Lo: lo, Hi: hi}); err != nil {
			e.objs.Close()
			return nil, fmt.Errorf("load egress: set port range: %w", err)
		}
	}
	if err := e.adopt(); err != nil {
		e.objs.Close()
		return nil, fmt.Errorf("load egress: %w", err)
	}
	// An older agent's answered addresses, without port spans: no
	// program reads them any more.
	if err := os.Remove(filepath.Join(enforce.MapPinDir(e.pinDir), "egress_allow")); err != nil && !errors.Is(err, os.ErrNotExist) {
		e.objs.Close()
		return nil, fmt.Errorf("load egress: remove the old answered-address map: %w", err)
	}
	return e, nil
}

// ephemeralPorts reads the kernel's local port range, so DNS client sockets
// bound by the connect hooks get ports from the same range as the kernel's.
func ephemeralPorts() (uint16, uint16, error) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, 0, err
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, 0, fmt.Errorf("ip_local_port_range: %q", b)
	}
	lo, err1 := strconv.ParseUint(f[0], 10, 16)
	hi, err2 := strconv.ParseUint(f[1], 10, 16)
	if err1 != nil || err2 != nil || lo == 0 || hi < lo {
		return 0, 0, fmt.Errorf("ip_local_port_range: %q", b)
	}
	return uint16(lo), uint16(hi), nil
}

// adopt rebuilds the Go mirror of the pinned maps (a restarted agent).
func (e *Egress) adopt() error {
	var k egressAllowKey
	var v egressAdmitVal
	it := e.objs.EgressAdmit.Iterate()
	for it.Next(&k, &v) {
		st := e.state(k.SandboxId)
		// Which names admitted it is not in the map: a reload keeps it
		// (as if Allow made it) until it expires, within the cap.
		st.allowed[wordsToAddr(k.Addr)] = &admission{val: v, names: []string{""}}
		e.total++
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read answered addresses: %w", err)
	}
	var ck egressCidrKey
	var cv egressCidrVal
	cit := e.objs.EgressCidr.Iterate()
	for cit.Next(&ck, &cv) {
		e.state(ck.SandboxId).cidrKeys[ck] = struct{}{}
	}
	if err := cit.Err(); err != nil {
		return fmt.Errorf("read cidr rules: %w", err)
	}
	var uk egressUnixKey
	var uv uint32
	uit := e.objs.EgressUnix.Iterate()
	for uit.Next(&uk, &uv) {
		e.state(uk.SandboxId).unixKeys[uk] = struct{}{}
	}
	if err := uit.Err(); err != nil {
		return fmt.Errorf("read unix paths: %w", err)
	}
	return nil
}

func (e *Egress) state(id uint32) *sandboxState {
	st := e.sandboxes[id]
	if st == nil {
		st = &sandboxState{allowed: map[netip.Addr]*admission{}, cidrKeys: map[egressCidrKey]struct{}{}, unixKeys: map[egressUnixKey]struct{}{}}
		e.sandboxes[id] = st
	}
	return st
}

// Attach attaches the programs to the cgroup at path (a sandbox root; its
// descendants inherit them) and pins the links. Links already pinned for
// this cgroup (a previous agent) are replaced after the new ones are
// attached, so enforcement has no gap.
func (e *Egress) Attach(path string) error {
	abs, err := cgroupfs.Abs(path)
	if err != nil {
		return fmt.Errorf("attach egress: %w", err)
	}
	cg, err := cgroupfs.ID(abs)
	if err != nil {
		return fmt.Errorf("attach egress: %w", err)
	}
	dir := filepath.Join(enforce.LinkPinDir(e.pinDir, Group), strconv.FormatUint(cg, 10))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("attach egress: %w", err)
	}
	var fresh []link.Link
	fail := func(err error) error {
		for _, l := range fresh {
			l.Close()
		}
		return fmt.Errorf("attach egress to %s: %w", abs, err)
	}
	progs := e.objs.attachable()
	for _, p := range progs {
		l, err := link.AttachCgroup(link.CgroupOptions{Path: abs, Attach: p.attach, Program: p.prog})
		if err != nil {
			return fail(fmt.Errorf("%s: %w", p.name, err))
		}
		fresh = append(fresh, l)
	}
	// Every new link is in force: now drop the old pins and pin the new.
	for i, p := range progs {
		pin := filepath.Join(dir, p.name)
		if old, err := link.LoadPinnedLink(pin, nil); err == nil {
			old.Unpin()
			old.Close()
		} else if !errors.Is(err, os.ErrNotExist) {
			os.Remove(pin)
		}
		if err := fresh[i].Pin(pin); err != nil {
			return fail(fmt.Errorf("pin %s: %w", p.name, err))
		}
	}
	e.mu.Lock()
	for _, l := range e.links[cg] {
		l.Close()
	}
	e.links[cg] = fresh
	e.mu.Unlock()
	return nil
}

// Detach removes the programs from the cgroup at path (or its id, when the
// cgroup is already gone: pass the id as a decimal string).
func (e *Egress) Detach(path string) error {
	cg, err := strconv.ParseUint(path, 10, 64)
	if err != nil {
		abs, err := cgroupfs.Abs(path)
		if err != nil {
			return fmt.Errorf("detach egress: %w", err)
		}
		if cg, err = cgroupfs.ID(abs); err != nil {
			return fmt.Errorf("detach egress: %w", err)
		}
	}
	dir := filepath.Join(enforce.LinkPinDir(e.pinDir, Group), strconv.FormatUint(cg, 10))
	var errs []error
	for _, p := range e.objs.programs() {
		pin := filepath.Join(dir, p.name)
		l, err := link.LoadPinnedLink(pin, nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", p.name, err))
			continue
		}
		if err := l.Unpin(); err != nil {
			errs = append(errs, err)
		}
		l.Close()
	}
	e.mu.Lock()
	for _, l := range e.links[cg] {
		l.Close()
	}
	delete(e.links, cg)
	e.mu.Unlock()
	os.Remove(dir)
	if len(errs) > 0 {
		return fmt.Errorf("detach egress: %w", errors.Join(errs...))
	}
	return nil
}

// Close releases file descriptors; pinned links and maps (and so
// enforcement) stay.
func (e *Egress) Close() error {
	e.mu.Lock()
	for _, ls := range e.links {
		for _, l := range ls {
			l.Close()
		}
	}
	e.links = map[uint64][]link.Link{}
	e.mu.Unlock()
	return e.objs.Close()
}

// Protocol selects the transport a rule applies to.
type Protocol uint8

// Protocols.
const (
	ProtoAny Protocol = iota
	ProtoTCP
	ProtoUDP
)

func (p Protocol) bits() uint32 {
	switch p {
	case ProtoTCP:
		return protoBitTCP
	case ProtoUDP:
		return protoBitUDP
	}
	return protoBitTCP | protoBitUDP
}

// PortRange is an inclusive range of destination ports; the zero value
// means every port.
type PortRange struct {
	Lo, Hi uint16
}

func (r PortRange) bounds() (uint16, uint16) {
	if r.Lo == 0 && r.Hi == 0 {
		return 0, 65535
	}
	return r.Lo, r.Hi
}

// Rule allows destinations in Prefix on Ports over Protocol, whatever DNS
// answered.
type Rule struct {
	// ID is reported in events (0 for none).
	ID       uint32
	Prefix   netip.Prefix
	Ports    PortRange
	Protocol Protocol
}

// SandboxConfig is one sandbox's egress configuration.
type SandboxConfig struct {
	// RecordOnly allows every refused operation but records it.
	RecordOnly bool
	// Proxy4 and Proxy6 are where DNS over IPv4 and IPv6 is redirected. An
	// unset one makes DNS over that family fail (EPERM).
	Proxy4, Proxy6 netip.AddrPort
	// DNSRuleID is reported when DNS is refused for lack of a proxy.
	DNSRuleID uint32
	// Rules allow destinations without DNS (CIDRs, loopback services).
	Rules []Rule
	// ResolverPorts refuses the ports of other name resolution (DNS over
	// TLS and QUIC 853, 784, 8853; mDNS 5353; LLMNR 5355; NetBIOS 137)
	// even at answered addresses; only Rules open them.
	ResolverPorts bool
	// RestrictUnix limits unix socket connects and datagrams to UnixPaths
	// (where the kernel has the hooks: Egress.UnixErr).
	RestrictUnix bool
	// UnixPaths are the socket paths allowed with RestrictUnix: a path
	// ending in "/" allows everything below it, others that socket only.
	UnixPaths []string
}

// SetSandbox sets the egress configuration of sandbox id (the id of the
// shared sandboxes map). New CIDR entries are in force before stale ones are
// removed.
func (e *Egress) SetSandbox(id uint32, cfg SandboxConfig) error {
	if id == 0 {
		return errors.New("set egress sandbox: id must be > 0")
	}
	nc := egressNetConfig{DnsRuleId: cfg.DNSRuleID}
	if cfg.RecordOnly {
		nc.Flags |= flagRecordOnly
	}
	if cfg.Proxy4.IsValid() {
		a := cfg.Proxy4.Addr().Unmap()
		if !a.Is4() {
			return fmt.Errorf("set egress sandbox %d: proxy4 %s is not IPv4", id, cfg.Proxy4)
		}
		nc.Flags |= flagProxy4
		b := a.As4()
		nc.ProxyIp4 = binary.NativeEndian.Uint32(b[:])
		nc.ProxyPort4 = htons(cfg.Proxy4.Port())
	}
	if cfg.Proxy6.IsValid() {
		a := cfg.Proxy6.Addr()
		if !a.Is6() || a.Is4In6() {
			return fmt.Errorf("set egress sandbox %d: proxy6 %s is not IPv6", id, cfg.Proxy6)
		}
		nc.Flags |= flagProxy6
		nc.ProxyIp6 = addrToWords(a)
		nc.ProxyPort6 = htons(cfg.Proxy6.Port())
	}
	if cfg.ResolverPorts {
		nc.Flags |= flagResolvers
	}
	if cfg.RestrictUnix {
		nc.Flags |= flagUnix
	}
	entries, err := cidrEntries(id, cfg.Rules)
	if err != nil {
		return fmt.Errorf("set egress sandbox %d: %w", id, err)
	}
	unixEntries, err := unixEntries(id, cfg.UnixPaths, cfg.DNSRuleID)
	if err != nil {
		return fmt.Errorf("set egress sandbox %d: %w", id, err)
	}

	e.mu.Lock()
	defer e.mu.Unlock()
	st := e.state(id)
	for k, v := range entries {
		if err := e.objs.EgressCidr.Put(k, v); err != nil {
			return fmt.Errorf("set egress sandbox %d: cidr: %w", id, err)
		}
		st.cidrKeys[k] = struct{}{}
	}
	for k := range st.cidrKeys {
		if _, keep := entries[k]; keep {
			continue
		}
		if err := e.objs.EgressCidr.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("set egress sandbox %d: cidr: %w", id, err)
		}
		delete(st.cidrKeys, k)
	}
	if err := e.setUnixLocked(id, st, unixEntries); err != nil {
		return fmt.Errorf("set egress sandbox %d: %w", id, err)
	}
	if err := e.objs.EgressConfigs.Put(id, nc); err != nil {
		return fmt.Errorf("set egress sandbox %d: %w", id, err)
	}
	return nil
}

// RemoveSandbox deletes the sandbox's configuration, rules and answered
// addresses: processes still in a cgroup with the programs attached are
// then refused everything (no policy).
func (e *Egress) RemoveSandbox(id uint32) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	var errs []error
	del := func(m *ebpf.Map, k any) {
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, err)
		}
	}
	del(e.objs.EgressConfigs, id)
	del(e.objs.EgressRelayCfg, id)
	if st := e.sandboxes[id]; st != nil {
		for k := range st.cidrKeys {
			del(e.objs.EgressCidr, k)
		}
		for k := range st.unixKeys {
			del(e.objs.EgressUnix, k)
		}
		for a := range st.allowed {
			del(e.objs.EgressAdmit, egressAllowKey{SandboxId: id, Addr: addrToWords(a)})
			e.total--
		}
		delete(e.sandboxes, id)
	}
	if len(errs) > 0 {
		return fmt.Errorf("remove egress sandbox %d: %w", id, errors.Join(errs...))
	}
	return nil
}

// cidrEntries turns rules into LPM trie entries. A lookup finds only the
// longest matching prefix, so each prefix carries the ranges of every rule
// whose prefix contains it.
func cidrEntries(id uint32, rules []Rule) (map[egressCidrKey]egressCidrVal, error) {
	type norm struct {
		p    netip.Prefix // IPv4 as IPv4-mapped, bits counted in the 128-bit form
		rule Rule
	}
	var ns []norm
	for _, r := range rules {
		if !r.Prefix.IsValid() {
			return nil, fmt.Errorf("rule %d: invalid prefix", r.ID)
		}
		lo, hi := r.Ports.bounds()
		if lo > hi {
			return nil, fmt.Errorf("rule %d: port range %d-%d is empty", r.ID, lo, hi)
		}
		p := r.Prefix.Masked()
		if p.Addr().Is4() {
			p = netip.PrefixFrom(netip.AddrFrom16(p.Addr().As16()), 96+p.Bits())
		}
		ns = append(ns, norm{p: p, rule: r})
	}
	out := map[egressCidrKey]egressCidrVal{}
	for _, n := range ns {
		key := egressCidrKey{Prefixlen: 32 + uint32(n.p.Bits()), SandboxId: id, Addr: addrToWords(n.p.Addr())}
		if _, done := out[key]; done {
			continue
		}
		var v egressCidrVal
		for _, m := range ns {
			if m.p.Bits() > n.p.Bits() || !m.p.Contains(n.p.Addr()) {
				continue
			}
			if v.N == MaxRangesPerPrefix {
				return nil, fmt.Errorf("prefix %s: more than %d port ranges apply", n.rule.Prefix, MaxRangesPerPrefix)
			}
			lo, hi := m.rule.Ports.bounds()
			v.R[v.N] = egressPortRange{Lo: lo, Hi: hi, Protos: m.rule.Protocol.bits(), RuleId: m.rule.ID}
			v.N++
		}
		out[key] = v
	}
	return out, nil
}

// Client is what the kernel recorded about a DNS client socket.
type Client struct {
	SandboxID uint32
	// SandboxCgroup is the sandbox root's cgroup id.
	SandboxCgroup uint64
	// Server is the address the client sent its query to, before the
	// redirect (the proxy itself when it asked the proxy directly).
	Server netip.AddrPort
	// PID is the process (tgid) that last sent from the socket.
	PID uint32
	// Seen is when the kernel last recorded a query from the socket.
	Seen time.Time
}

// LookupClient tells which sandbox sent a query that reached the proxy from
// src over network ("udp" or "tcp", with or without a 4/6 suffix). Queries
// from sandboxes always pass the hooks, which record the source port before
// the packet is sent; a port recorded for a sandbox and later reused outside
// any sandbox still maps to that sandbox (the stricter policy) until a
// sandbox reuses it.
func (e *Egress) LookupClient(network string, src netip.AddrPort) (Client, bool) {
	var proto uint16
	switch strings.TrimRight(network, "46") {
	case "udp":
		proto = unix.IPPROTO_UDP
	case "tcp":
		proto = unix.IPPROTO_TCP
	default:
		return Client{}, false
	}
	var c egressDnsClient
	if err := e.objs.EgressDnsClients.Lookup(egressDnsClientKey{Port: src.Port(), Proto: proto}, &c); err != nil {
		return Client{}, false
	}
	if local := wordsToAddr(c.LocalAddr); local.IsValid() && !local.IsUnspecified() && local.Unmap() != src.Addr().Unmap() {
		return Client{}, false
	}
	return Client{
		SandboxID:     c.SandboxId,
		SandboxCgroup: c.SandboxCg,
		Server:        netip.AddrPortFrom(wordsToAddr(c.OrigAddr), ntohs(c.OrigPort)),
		PID:           c.Pid,
		Seen:          time.Now().Add(-time.Duration(bootNanos() - c.TsNs)),
	}, true
}

// Stats are the hook group's counters.
type Stats struct {
	DNSRedirects   uint64 // queries redirected to the proxy
	Denied         uint64 // refused operations
	Recorded       uint64 // operations record-only mode let through
	AllowedAnswer  uint64 // allowed by an answered address
	AllowedRule    uint64 // allowed by a CIDR or service rule
	Addresses      int    // answered addresses held, all sandboxes
	Overflow       uint64 // unexpired addresses evicted because a sandbox's share was full
	OverflowBySbox map[uint32]uint64
}

// Stats returns the counters.
func (e *Egress) Stats() (Stats, error) {
	var s Stats
	dst := []*uint64{&s.DNSRedirects, &s.Denied, &s.Recorded, &s.AllowedAnswer, &s.AllowedRule}
	for i, p := range dst {
		var per []uint64
		if err := e.objs.EgressCounters.Lookup(uint32(i), &per); err != nil {
			return s, fmt.Errorf("egress stats: %w", err)
		}
		for _, v := range per {
			*p += v
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	s.Addresses = e.total
	s.OverflowBySbox = map[uint32]uint64{}
	for id, st := range e.sandboxes {
		s.Overflow += st.overflow
		if st.overflow > 0 {
			s.OverflowBySbox[id] = st.overflow
		}
	}
	return s, nil
}

// addrToWords lays an address out as the kernel keys it: 16 bytes in
// network order, IPv4 as IPv4-mapped.
func addrToWords(a netip.Addr) [4]uint32 {
	b := a.As16()
	var w [4]uint32
	for i := range w {
		w[i] = binary.NativeEndian.Uint32(b[4*i:])
	}
	return w
}

func wordsToAddr(w [4]uint32) netip.Addr {
	var b [16]byte
	for i := range w {
		binary.NativeEndian.PutUint32(b[4*i:], w[i])
	}
	a := netip.AddrFrom16(b)
	if a.Is4In6() {
		return a.Unmap()
	}
	return a
}

func htons(p uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], p)
	return binary.NativeEndian.Uint16(b[:])
}

func ntohs(p uint16) uint16 { return htons(p) }

// bootNanos is CLOCK_BOOTTIME, the clock of bpf_ktime_get_boot_ns.
func bootNanos() uint64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts)
	return uint64(ts.Nano())
}
