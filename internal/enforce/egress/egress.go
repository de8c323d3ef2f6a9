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
// Sockets in another network namespace than the agent's are sent to the
// listeners the agent opened in theirs (netns.go, internal/nslisten).
package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/rules/egressrules"
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
)

// egressrules' count must be the kernel's: a constant overflow fails the
// build when they differ.
const _ = uint(len(egressCidrVal{}.R)-egressrules.MaxRangesPerPrefix) + uint(egressrules.MaxRangesPerPrefix-len(egressCidrVal{}.R))

// Flags of struct net_config (EGRESS_F_* in bpf/egress.c).
const (
	flagRecordOnly uint32 = 1
	flagProxy4     uint32 = 2
	flagProxy6     uint32 = 4
	flagResolvers  uint32 = 8
	flagUnix       uint32 = 16
	flagForeign    uint32 = 32
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
	// foreignErr is nil when sockets made outside a sandbox are judged
	// (foreign.go).
	foreignErr error
	opts       Options

	mu        sync.Mutex
	sandboxes map[uint32]*sandboxState
	total     int // entries in egress_admit
	links     map[uint64][]link.Link
	// home is the agent's netns cookie (0: unknown, every socket is
	// treated as the agent's); netns.go.
	home uint64
	// onNetns is called on each ReasonNetns refusal (OnNetnsRefused).
	onNetns atomic.Pointer[func()]
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
	unix        unixPrograms
	foreign     foreignPrograms     // attached to the cgroup v2 root (foreign.go)
	foreignUnix foreignUnixPrograms // the same for unix sockets (6.7+)
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
	o.closeForeign()
	return o.egressMaps.Close()
}

// programs lists the hook group's programs with their attach types.
func (o *objects) programs() []namedProgram {
	return []namedProgram{
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
	// An older agent's answered addresses, without port spans, and its
	// client records keyed by source port alone: no program reads them
	// any more.
	for _, old := range []string{"egress_allow", "egress_dns_clients", "egress_relay_conns"} {
		if err := os.Remove(filepath.Join(enforce.MapPinDir(e.pinDir), old)); err != nil && !errors.Is(err, os.ErrNotExist) {
			e.objs.Close()
			return nil, fmt.Errorf("load egress: remove the old map %s: %w", old, err)
		}
	}
	if err := e.setHome(); err != nil {
		e.objs.Close()
		return nil, fmt.Errorf("load egress: %w", err)
	}
	e.loadForeign(spec, copts)
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
	return e.attachAt(abs, dir, e.objs.attachable(), cg)
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
