package plan

// The network section: egress (connect/sendmsg programs), its side doors,
// and the DNS proxy's policy.

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/watcherhq/watcher/internal/dnsproxy"
	"github.com/watcherhq/watcher/internal/enforce/rules/cgrouprules"
	"github.com/watcherhq/watcher/internal/enforce/rules/egressrules"
	"github.com/watcherhq/watcher/internal/gateway"
	"github.com/watcherhq/watcher/internal/namerelay"
	"github.com/watcherhq/watcher/internal/policy"
)

var (
	loopback4 = netip.MustParsePrefix("127.0.0.0/8")
	loopback6 = netip.MustParsePrefix("::1/128")
)

func egressProto(p policy.Protocol, def egressrules.Protocol) egressrules.Protocol {
	switch p {
	case policy.ProtoTCP:
		return egressrules.ProtoTCP
	case policy.ProtoUDP:
		return egressrules.ProtoUDP
	case policy.ProtoAny:
		return egressrules.ProtoAny
	}
	return def
}

// admissionScope is what a sandbox's allowed answers admit.
func admissionScope(eg *policy.Egress) (*egressrules.Scope, error) {
	scope := &egressrules.Scope{Cap: eg.AdmissionTTLCap.Duration}
	for _, n := range eg.NamePorts {
		ns := egressrules.NameSpans{Pattern: n.Name}
		proto := egressProto(n.Protocol, egressrules.ProtoTCP)
		for _, pr := range n.Ports {
			lo, hi, err := pr.Bounds()
			if err != nil {
				return nil, fmt.Errorf("egress name_ports %q: %w", n.Name, err)
			}
			ns.Spans = append(ns.Spans, egressrules.PortSpan{Lo: lo, Hi: hi, Protocol: proto})
		}
		scope.Names = append(scope.Names, ns)
	}
	return scope, nil
}

func (c *compiler) network(sb *policy.Sandbox, sid uint32) error {
	record := sb.Mode == policy.ModeRecord
	cfg := egressrules.SandboxConfig{
		RecordOnly: record,
		Proxy4:     c.env.DNSProxy4,
		Proxy6:     c.env.DNSProxy6,
		DNSRuleID:  c.rules.ID("dns-redirect"),
	}
	eg := &sb.Egress
	for _, s := range eg.Loopback {
		name := "loopback:" + s.Name
		if s.Name == "" {
			name = fmt.Sprintf("loopback:%d", s.Port)
		}
		id := c.rules.ID(name)
		ports := egressrules.PortRange{Lo: uint16(s.Port), Hi: uint16(s.Port)}
		proto := egressProto(s.Protocol, egressrules.ProtoTCP)
		cfg.Rules = append(cfg.Rules,
			egressrules.Rule{ID: id, Prefix: loopback4, Ports: ports, Protocol: proto},
			egressrules.Rule{ID: id, Prefix: loopback6, Ports: ports, Protocol: proto})
		c.add(sb, fmt.Sprintf("egress loopback %s (port %d)", s.Name, s.Port), policy.ActionAllow,
			layer{mech: MechCgroupBPF, notes: []string{"127.0.0.0/8 and ::1"}})
	}
	for _, r := range eg.Allow {
		pfx, err := policy.ParseCIDR(r.CIDR)
		if err != nil {
			return fmt.Errorf("egress allow %q: %w", r.CIDR, err)
		}
		id := c.rules.ID("egress:" + pfx.String())
		proto := egressProto(r.Protocol, egressrules.ProtoAny)
		ranges := []egressrules.PortRange{{}} // every port
		if len(r.Ports) > 0 {
			ranges = ranges[:0]
			for _, pr := range r.Ports {
				lo, hi, err := pr.Bounds()
				if err != nil {
					return fmt.Errorf("egress allow %s: %w", pfx, err)
				}
				ranges = append(ranges, egressrules.PortRange{Lo: lo, Hi: hi})
			}
		}
		for _, pr := range ranges {
			cfg.Rules = append(cfg.Rules, egressrules.Rule{ID: id, Prefix: pfx, Ports: pr, Protocol: proto})
		}
		c.add(sb, "egress allow "+pfx.String(), policy.ActionAllow, layer{mech: MechCgroupBPF})
	}
	def := eg.Default
	if def == "" {
		def = policy.EgressResolved
	}
	defNote := []string{"connect/sendmsg programs on the sandbox cgroups"}
	switch def {
	case policy.EgressAllow:
		id := c.rules.ID("egress-default-allow")
		for _, p := range []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")} {
			cfg.Rules = append(cfg.Rules, egressrules.Rule{ID: id, Prefix: p})
		}
		defNote = append(defNote, "every destination allowed")
	case policy.EgressResolved:
		c.names(sb, sid)
		grace := time.Duration(eg.GraceSeconds) * time.Second
		c.plan.ResolvedEgress[sb.Name] = grace
		c.plan.GraceMax = max(c.plan.GraceMax, grace)
		scope, err := admissionScope(eg)
		if err != nil {
			return err
		}
		c.plan.Admission[sb.Name] = scope
		defNote = append(defNote, fmt.Sprintf("other destinations only at addresses the DNS proxy answered, on TCP 80 and 443 (and the ports egress.name_ports lists for a name), for min(TTL, %s) plus %s",
			scope.TTL(time.Duration(1<<62)), grace))
	case policy.EgressDeny:
		defNote = append(defNote, "other destinations refused, even when resolved")
	}
	if def != policy.EgressAllow {
		c.sideDoors(sb, sid, &cfg)
	}
	if err := checkRanges(cfg.Rules); err != nil {
		return err
	}
	c.plan.Egress[sid] = cfg
	egAction := policy.ActionBlock
	if def == policy.EgressAllow {
		egAction = policy.ActionAllow
	}
	c.add(sb, "egress default "+string(def), egAction, layer{mech: MechCgroupBPF, notes: defNote})

	// DNS: redirected in the kernel, judged by the proxy.
	d := &sb.DNS
	sp := &dnsproxy.SandboxPolicy{
		Allow:           slices.Clone(d.Allow),
		Deny:            slices.Clone(d.Deny),
		Default:         string(d.Default),
		HighCardinality: slices.Clone(d.Detection.HighCardinality),
		RateLimit:       dnsproxy.RateLimit{QPS: float64(d.Detection.RateLimit)},
		LocalAllow:      localAllowOf(cfg.Rules),
		RecordOnly:      record,
		Detection: dnsproxy.Detection{
			Mode:             "off",
			Window:           dnsproxy.Duration(d.Detection.Window.Duration),
			MaxDistinctNames: d.Detection.MaxDistinctNames,
			MaxInfoBits:      float64(d.Detection.InfoBudgetBits),
		},
	}
	if d.Detection.Enabled {
		sp.Detection.Mode = "enforce"
		if d.Detection.Action == policy.ActionRecord || record {
			sp.Detection.Mode = "record"
		}
	}
	var dnsNotes []string
	for _, fam := range []struct {
		name  string
		proxy netip.AddrPort
	}{{"IPv4", c.env.DNSProxy4}, {"IPv6", c.env.DNSProxy6}} {
		if fam.proxy.IsValid() {
			dnsNotes = append(dnsNotes, fmt.Sprintf("DNS over %s redirected in the kernel to the proxy at %s", fam.name, fam.proxy))
		} else {
			dnsNotes = append(dnsNotes, fmt.Sprintf("DNS over %s refused (no proxy address)", fam.name))
		}
	}
	dnsNotes = append(dnsNotes,
		fmt.Sprintf("proxy: default %s, %d allowed, %d denied names, detection %s", orDNS(d.Default), len(d.Allow), len(d.Deny), sp.Detection.Mode))
	if def != policy.EgressAllow {
		dnsNotes = append(dnsNotes, fmt.Sprintf("answers with loopback, private, link-local, unique-local, metadata or host addresses refused (DNS rebinding) outside %d explicit egress networks; such addresses are never admitted by an answer", len(sp.LocalAllow)))
	}
	if record {
		// The lists record instead of refuse (RecordOnly): every name is
		// answered, and what they would refuse is a would-refuse record.
		dnsNotes = append(dnsNotes, "mode: record: every name is answered; names the lists would refuse are recorded as such")
	}
	c.plan.DNS.Sandboxes[sb.Name] = sp
	dnsAction := policy.ActionBlock
	if sp.Default == string(policy.DNSAllow) && len(sp.Deny) == 0 && !d.Detection.Enabled {
		dnsAction = policy.ActionAllow
	}
	c.add(sb, "dns", dnsAction, layer{mech: MechCgroupBPF, notes: dnsNotes})
	return nil
}

// localAllowOf is the DNS proxy's local allowance of a sandbox: answers may
// carry local addresses (loopback, private, metadata...) only inside the
// networks its explicit egress rules name (egress.allow, loopback services,
// every network for egress default allow); anything else is DNS rebinding.
func localAllowOf(rules []egressrules.Rule) []netip.Prefix {
	var out []netip.Prefix
	for _, r := range rules {
		if p := r.Prefix.Masked(); !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

// sideDoors closes the ways around the connect/sendmsg hooks and the DNS
// proxy for a sandbox whose egress is not allow: ping sockets (their
// unconnected sendto runs no cgroup hook), other resolvers' ports at
// answered addresses, and unix sockets of host resolvers and brokers.
func (c *compiler) sideDoors(sb *policy.Sandbox, sid uint32, cfg *egressrules.SandboxConfig) {
	cfg.ResolverPorts = true
	c.add(sb, "egress: other resolvers' ports", policy.ActionBlock, layer{mech: MechCgroupBPF,
		notes: []string{"DNS over TLS/QUIC (853, 784, 8853), mDNS 5353, LLMNR 5355, NetBIOS 137 refused even at answered addresses unless egress.allow names them; DoH (443) to an allowed name is the policy's call"}})

	pingNote := "cgroup/sock_create: SOCK_DGRAM ICMP and ICMPv6 (ping) sockets, whose unconnected sendto no connect/sendmsg hook sees"
	if !c.cgroupOK {
		c.add(sb, "egress: ping sockets", policy.ActionBlock, layer{mech: MechNone, notes: []string{"cgroup BPF unavailable: " + c.env.CgroupBPF.Error()}})
	} else {
		c.plan.Sockets = append(c.plan.Sockets, cgrouprules.PingSocketRules(sid, c.rules.ID("ping-sockets"))...)
		c.add(sb, "egress: ping sockets", policy.ActionBlock, layer{mech: MechCgroupBPF, notes: []string{pingNote}})
	}

	cfg.RefuseForeign = true
	if c.env.ForeignSockets != nil {
		c.add(sb, "egress: sockets made outside", policy.ActionBlock, layer{mech: MechNone,
			notes: []string{"not judged here (" + c.env.ForeignSockets.Error() + "): a socket inherited or passed in from outside connects unjudged"}})
	} else {
		c.add(sb, "egress: sockets made outside", policy.ActionBlock, layer{mech: MechCgroupBPF,
			notes: []string{"programs on the cgroup v2 root refuse connect and addressed sends on a socket made outside the sandbox (inherited, SCM_RIGHTS, pidfd_getfd)",
				"a socket already connected when it came in is not judged: its sends run no hook"}})
	}

	cfg.RestrictUnix = true
	for _, w := range sb.Workspace {
		cfg.UnixPaths = append(cfg.UnixPaths, strings.TrimSuffix(w, "/")+"/")
	}
	cfg.UnixPaths = append(cfg.UnixPaths, sb.Egress.Unix...)
	cfg.UnixPaths = append(cfg.UnixPaths, c.env.AbsentProbeSockets...)
	if sb.Tools.Enabled {
		// The sandbox's own tool gateway, and no other sandbox's.
		cfg.UnixPaths = append(cfg.UnixPaths, gateway.SocketPath(c.p.Agent.SocketDir, sb.Name))
	}
	unixNote := []string{fmt.Sprintf("cgroup/connect_unix and sendmsg_unix: only %d workspace and egress.unix paths; abstract, relative and '..' paths refused", len(cfg.UnixPaths)),
		"judged on the path as passed, before the kernel resolves it: a symlink inside an allowed directory to a host socket passes (the peer the kernel found is judged on the egress: unix peers line)"}
	if len(c.env.AbsentProbeSockets) > 0 {
		unixNote = append(unixNote, "left connectable because no such socket exists on this host (the C library probes them on every lookup): "+
			strings.Join(c.env.AbsentProbeSockets, ", ")+"; re-checked at every policy reload")
	}
	if c.env.UnixSockets != nil && c.hook("unix_stream_connect") && c.hook("unix_may_send") {
		c.add(sb, "egress: unix sockets", policy.ActionBlock, layer{mech: MechLSM,
			notes: []string{"no cgroup unix socket hooks here (" + c.env.UnixSockets.Error() + "): the lsm unix hooks judge every peer (egress: unix peers)"}})
	} else if c.env.UnixSockets != nil {
		c.add(sb, "egress: unix sockets", policy.ActionBlock, layer{mech: MechNone,
			notes: []string{"this kernel cannot refuse unix socket connects (" + c.env.UnixSockets.Error() + "); the backstop kills connects to peers outside the paths (egress: unix peers)"}})
	} else {
		c.add(sb, "egress: unix sockets", policy.ActionBlock, layer{mech: MechCgroupBPF, notes: unixNote})
	}
}

func orDNS(d policy.DNSDefault) string {
	if d == "" {
		return "deny"
	}
	return string(d)
}

// checkRanges refuses rule sets the egress maps cannot hold: a prefix
// carries the port ranges of every rule whose network contains it, at most
// egressrules.MaxRangesPerPrefix (checked here so a bad policy is refused at
// compile time, naming the network).
func checkRanges(rules []egressrules.Rule) error {
	norm := func(p netip.Prefix) netip.Prefix {
		p = p.Masked()
		if p.Addr().Is4() {
			return netip.PrefixFrom(netip.AddrFrom16(p.Addr().As16()), 96+p.Bits())
		}
		return p
	}
	for _, n := range rules {
		np := norm(n.Prefix)
		count := 0
		for _, m := range rules {
			mp := norm(m.Prefix)
			if mp.Bits() <= np.Bits() && mp.Contains(np.Addr()) {
				count++
			}
		}
		if count > egressrules.MaxRangesPerPrefix {
			return fmt.Errorf("egress: %d port ranges apply to %s (rules on it and on the networks containing it), at most %d fit",
				count, n.Prefix, egressrules.MaxRangesPerPrefix)
		}
	}
	return nil
}

// NameBinding is a sandbox's name binding (policy egress.names), applied
// by the agent's relay (internal/namerelay).
type NameBinding struct {
	Sandbox      string
	RecordOnly   bool
	ReadOnly     []string
	Inspect      []string // TLS terminated without a secret
	ECH          []string
	UnnamedPorts []namerelay.PortRange
	QUIC         bool
	RuleID       uint32
	// RecordAllowed records every relayed connection (audit.connections).
	RecordAllowed bool
	// Secrets are brokered credentials (values stay on the host).
	Secrets []policy.EgressSecret
}

// Placeholder is what a sandbox holds instead of a secret: a token the
// relay recognises, the same in the agent and in watcher exec, and
// worthless anywhere else.
func Placeholder(sandbox, secret string) string {
	return "watcher-placeholder-" + sandbox + "-" + secret
}

// SandboxCAFile is where the agent writes a sandbox's trust bundle (the
// host's roots plus the sandbox's credential-broker CA): beside the
// agent's directories, outside the files sandboxes are kept from.
func SandboxCAFile(pol *policy.Policy, sandbox string) string {
	return filepath.Join(filepath.Dir(filepath.Clean(pol.Agent.LedgerDir)), "sandbox-ca", sandbox+".pem")
}

// SecretEnv returns env (a command's environment in sandbox, as watcher
// exec starts it) with each brokered secret's variable set to its
// placeholder, the variables the agent reads values from removed (a
// private agent shares the caller's environment), and the TLS trust
// variables pointed at the sandbox's bundle. env is returned unchanged
// when the sandbox has no secrets and inspects no name.
func SecretEnv(pol *policy.Policy, sandbox string, env []string) []string {
	var sb *policy.Sandbox
	for i := range pol.Sandboxes {
		if pol.Sandboxes[i].Name == sandbox {
			sb = &pol.Sandboxes[i]
		}
	}
	if sb == nil || !sb.Egress.Names.Bind || (len(sb.Egress.Names.Secrets) == 0 && len(sb.Egress.Names.Inspect) == 0) {
		return env
	}
	set := map[string]string{}
	drop := map[string]bool{}
	for _, sec := range sb.Egress.Names.Secrets {
		set[sec.Env] = Placeholder(sandbox, sec.Name)
		if sec.FromEnv != "" {
			drop[sec.FromEnv] = true
		}
	}
	ca := SandboxCAFile(pol, sandbox)
	for _, v := range []string{"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "GIT_SSL_CAINFO"} {
		set[v] = ca
	}
	out := make([]string, 0, len(env)+len(set))
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if _, ok := set[k]; ok || drop[k] {
			continue
		}
		out = append(out, kv)
	}
	for k, v := range set { // a placeholder wins over a dropped name
		out = append(out, k+"="+v)
	}
	return out
}

// names compiles egress.names of a sandbox whose egress default is
// resolved.
func (c *compiler) names(sb *policy.Sandbox, sid uint32) {
	nm := &sb.Egress.Names
	if !nm.Bind {
		return
	}
	nb := NameBinding{Sandbox: sb.Name, RecordOnly: sb.Mode == policy.ModeRecord, ReadOnly: slices.Clone(nm.ReadOnly),
		Inspect: slices.Clone(nm.Inspect), ECH: slices.Clone(nm.ECH), QUIC: nm.QUIC, RuleID: c.rules.ID("egress-names"), Secrets: slices.Clone(nm.Secrets),
		RecordAllowed: sb.Audit.Connections}
	for _, pr := range nm.UnnamedPorts {
		lo, hi, _ := pr.Bounds() // validated
		nb.UnnamedPorts = append(nb.UnnamedPorts, namerelay.PortRange{Lo: lo, Hi: hi})
	}
	c.plan.Names[sid] = nb
	notes := []string{"TCP connects to answered addresses redirected to the agent's relay: the TLS server name or HTTP Host must be answered with that address or on the DNS allow list",
		"domain fronting, TLS without a name, Encrypted Client Hello (outside egress.names.ech) and unnamed protocols refused"}
	if !nm.QUIC {
		notes = append(notes, "QUIC (UDP 443) to answered addresses refused: clients fall back to TCP")
	}
	if len(nm.Secrets) > 0 {
		notes = append(notes, fmt.Sprintf("%d brokered secrets: placeholders in the sandbox, TLS terminated with a per-sandbox CA for their hosts", len(nm.Secrets)))
	}
	if len(nm.Inspect) > 0 {
		notes = append(notes, fmt.Sprintf("%d inspected names: TLS terminated with the per-sandbox CA, every request's Host judged", len(nm.Inspect)))
	} else {
		notes = append(notes, "inside TLS only the server name is judged: a Host of another site there passes (egress.names.inspect terminates TLS to judge it)")
	}
	if len(nm.ReadOnly) > 0 {
		notes = append(notes, fmt.Sprintf("%d read-only names: GET, HEAD, OPTIONS only on plain HTTP and on terminated names", len(nm.ReadOnly)))
	}
	c.add(sb, "egress names", policy.ActionBlock, layer{mech: MechCgroupBPF, notes: notes})
}
