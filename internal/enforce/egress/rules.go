package egress

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"

	"github.com/watcherhq/watcher/internal/enforce/rules/egressrules"
)

// protoBits are the protocol bits of struct port_range for p.
func protoBits(p egressrules.Protocol) uint32 {
	switch p {
	case egressrules.ProtoTCP:
		return protoBitTCP
	case egressrules.ProtoUDP:
		return protoBitUDP
	}
	return protoBitTCP | protoBitUDP
}

// SetSandbox sets the egress configuration of sandbox id (the id of the
// shared sandboxes map). New CIDR entries are in force before stale ones are
// removed.
func (e *Egress) SetSandbox(id uint32, cfg egressrules.SandboxConfig) error {
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
	if cfg.RefuseForeign {
		nc.Flags |= flagForeign
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
func cidrEntries(id uint32, rules []egressrules.Rule) (map[egressCidrKey]egressCidrVal, error) {
	type norm struct {
		p    netip.Prefix // IPv4 as IPv4-mapped, bits counted in the 128-bit form
		rule egressrules.Rule
	}
	var ns []norm
	for _, r := range rules {
		if !r.Prefix.IsValid() {
			return nil, fmt.Errorf("rule %d: invalid prefix", r.ID)
		}
		lo, hi := r.Ports.Bounds()
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
			if v.N == egressrules.MaxRangesPerPrefix {
				return nil, fmt.Errorf("prefix %s: more than %d port ranges apply", n.rule.Prefix, egressrules.MaxRangesPerPrefix)
			}
			lo, hi := m.rule.Ports.Bounds()
			v.R[v.N] = egressPortRange{Lo: lo, Hi: hi, Protos: protoBits(m.rule.Protocol), RuleId: m.rule.ID}
			v.N++
		}
		out[key] = v
	}
	return out, nil
}
