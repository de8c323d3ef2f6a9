package agent

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/dnsproxy"
	"github.com/watcherhq/watcher/internal/enforce/egress/dnsbind"
	"github.com/watcherhq/watcher/internal/pipeline"
	"github.com/watcherhq/watcher/internal/plan"
	"github.com/watcherhq/watcher/internal/policy"
)

// The DNS proxy's side of the agent: starting it, telling it which
// sandbox asked, and binding its answers to the kernel's egress
// admissions (admitted on answer, revoked when a reload drops the name).

// startDNS starts the proxy on the policy's address and on [::1] (for
// sandbox DNS over IPv6), refusing every query until the policy is set.
func (a *Agent) startDNS() error {
	ag := a.pol.Agent
	addr, err := netip.ParseAddrPort(ag.DNS.Listen)
	if err != nil {
		return fmt.Errorf("dns listen address %q: %w", ag.DNS.Listen, err)
	}
	upstreams := ag.DNS.Upstreams
	if len(upstreams) == 0 {
		upstreams = resolvConfServers()
	}
	cfg := dnsproxy.Config{
		Listeners: []dnsproxy.Listener{{Addr: addr.String()}, {Addr: netip.AddrPortFrom(netip.IPv6Loopback(), addr.Port()).String()}},
		Upstreams: upstreams,
		Policy:    denyAllDNS(a.pol),
		Sandboxes: dnsproxy.SandboxResolverFunc(a.dnsSandbox),
		Events:    pipeline.EmitFunc(a.emit),
		OnAnswer:  a.onAnswer,
		OwnProbe:  a.canaryProbeQuery,
	}
	if a.dns, err = dnsproxy.New(cfg); err == nil {
		err = a.dns.Start()
	}
	if err != nil {
		// No IPv6 loopback: IPv6 DNS from sandboxes then fails (EPERM).
		cfg.Listeners = cfg.Listeners[:1]
		if a.dns, err = dnsproxy.New(cfg); err == nil {
			err = a.dns.Start()
		}
		if err != nil {
			return fmt.Errorf("dns proxy: %w", err)
		}
	}
	for _, s := range a.dns.Addrs() {
		s = strings.TrimPrefix(strings.TrimPrefix(s, "udp:"), "tcp:")
		ap, err := netip.ParseAddrPort(s)
		if err != nil {
			continue
		}
		if ap.Addr().Is4() && !a.dnsAddr.IsValid() {
			a.dnsAddr = ap
		} else if ap.Addr().Is6() && !a.dnsAddr6.IsValid() {
			a.dnsAddr6 = ap
		}
	}
	if !a.dnsAddr.IsValid() {
		return fmt.Errorf("dns proxy: no IPv4 address among %v", a.dns.Addrs())
	}
	return nil
}

// denyAllDNS is the proxy's policy until the real one is compiled: every
// sandbox refused everything.
func denyAllDNS(p *policy.Policy) *dnsproxy.Policy {
	dp := &dnsproxy.Policy{Sandboxes: map[string]*dnsproxy.SandboxPolicy{}}
	for _, sb := range p.Sandboxes {
		dp.Sandboxes[sb.Name] = &dnsproxy.SandboxPolicy{Default: "deny"}
	}
	return dp
}

// dnsSandbox maps a query's source to its sandbox through the kernel's
// record of DNS client sockets.
func (a *Agent) dnsSandbox(src dnsproxy.QuerySource) (string, bool) {
	if a.egress.Egress == nil {
		return "", false
	}
	return dnsbind.Resolver{Egress: a.egress.Egress, Directory: a.egress.dirs, Netns: a.netnsOf}.Sandbox(src)
}

// onAnswer admits answered addresses to the sandbox's egress allowlist,
// for sandboxes whose egress default is "resolved" only.
func (a *Agent) onAnswer(ans dnsproxy.Answer) {
	a.mu.Lock()
	_, resolved := a.plan.ResolvedEgress[ans.Sandbox]
	scope := a.plan.Admission[ans.Sandbox]
	grace := a.plan.GraceMax
	a.mu.Unlock()
	if !resolved || a.egress.Egress == nil {
		return
	}
	id, ok := a.egress.dirs.ID(ans.Sandbox)
	if !ok {
		return
	}
	a.recordAnswer(id, ans, grace)
	if err := dnsbind.Admit(a.egress.Egress, id, ans, scope); err != nil {
		a.emit(audit.Event{Kind: audit.KindNet, Verdict: audit.VerdictRecorded, Severity: audit.SeverityAlert,
			Sandbox: audit.Sandbox{Name: ans.Sandbox}, Mechanism: "agent",
			Message: "answered addresses not admitted (connections to them will be refused): " + err.Error()})
	}
}

// revokeDropped drops the admissions of answers for names the new plan no
// longer lets a sandbox resolve (or of every name, when its egress is no
// longer "resolved"): a reload that drops a name closes its addresses.
func (a *Agent) revokeDropped(p *plan.Plan) {
	if a.egress.Egress == nil {
		return
	}
	for name, id := range p.SandboxIDs {
		keep := func(string) bool { return false }
		if sp := p.DNS.Sandboxes[name]; sp != nil {
			if _, resolved := p.ResolvedEgress[name]; resolved {
				keep = sp.Allows()
			}
		}
		n, err := a.egress.Revoke(id, keep)
		if err != nil || n > 0 {
			msg := fmt.Sprintf("policy reload: %d answered address(es) of names no longer allowed dropped", n)
			if err != nil {
				msg += ": " + err.Error()
			}
			a.emit(audit.Event{Kind: audit.KindNet, Verdict: audit.VerdictRecorded, Severity: audit.SeverityRoutine,
				Sandbox: audit.Sandbox{Name: name}, Mechanism: "agent", Message: msg})
		}
	}
}
