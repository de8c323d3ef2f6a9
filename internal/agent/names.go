package agent

// Name binding (policy egress.names): the relay the connect hooks send a
// sandbox's TCP connections to, and the names the DNS proxy answered.

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/dnsproxy"
	"github.com/watcherhq/watcher/internal/enforce/egress"
	"github.com/watcherhq/watcher/internal/namerelay"
	"github.com/watcherhq/watcher/internal/plan"
	"github.com/watcherhq/watcher/internal/policy"
)

// relayMaxAge bounds how old the kernel's record of a redirected
// connection may be when the relay accepts it.
const relayMaxAge = time.Minute

// startRelay starts the relay on loopback. A relay that cannot start is
// recorded; sandboxes with name binding then have their TCP connections to
// answered addresses refused (applyNames), not let through unjudged.
func (a *Agent) startRelay() {
	a.answers = namerelay.NewAnswers(0)
	cookie, err := egress.NetnsCookie()
	if err != nil {
		a.relayErr = err
		a.startNetns()
		return
	}
	a.netnsCookie = cookie
	r, err := namerelay.New(namerelay.Config{
		Listen:  []string{"127.0.0.1:0", "[::1]:0"},
		Lookup:  a.relayLookup,
		Policy:  a.relayPolicy,
		Answers: a.answers,
		Events:  a.emit,
	})
	if err == nil {
		err = r.Start()
	}
	if err != nil {
		a.relayErr = err
		a.startNetns()
		return
	}
	a.relay = r
	a.startNetns()
}

func (a *Agent) relayLookup(src netip.AddrPort) (namerelay.Conn, bool) {
	if a.egress.Egress == nil {
		return namerelay.Conn{}, false
	}
	r, ok := a.egress.LookupRelayed(src, relayMaxAge)
	return namerelay.Conn{SandboxID: r.SandboxID, Dest: r.Dest, PID: r.PID, Cgroup: r.Cgroup}, ok
}

// relayLookupIn is relayLookup for a connection accepted in another
// network namespace (its cookie).
func (a *Agent) relayLookupIn(netns uint64, src netip.AddrPort) (namerelay.Conn, bool) {
	if a.egress.Egress == nil {
		return namerelay.Conn{}, false
	}
	r, ok := a.egress.LookupRelayedIn(netns, src, relayMaxAge)
	return namerelay.Conn{SandboxID: r.SandboxID, Dest: r.Dest, PID: r.PID, Cgroup: r.Cgroup}, ok
}

func (a *Agent) relayPolicy(id uint32) (*namerelay.Policy, bool) {
	m := a.relayPols.Load()
	if m == nil {
		return nil, false
	}
	p, ok := (*m)[id]
	return p, ok
}

// applyNames writes the plan's name binding: the relay's policy per
// sandbox and the kernel's redirect.
func (a *Agent) applyNames(p *plan.Plan) error {
	a.mu.Lock()
	pol := a.pol
	a.mu.Unlock()
	pols := map[uint32]*namerelay.Policy{}
	for id, nb := range p.Names {
		sandbox := nb.Sandbox
		ca, secrets := a.brokered(pol, nb)
		pols[id] = &namerelay.Policy{
			CA: ca, Secrets: secrets,
			Sandbox: sandbox, RecordOnly: nb.RecordOnly, RecordAllowed: nb.RecordAllowed,
			NameAllowed:  func(name string) bool { return a.dns != nil && a.dns.NameListed(sandbox, name) },
			ECH:          namerelay.NewNames(nb.ECH),
			ReadOnly:     namerelay.NewNames(nb.ReadOnly),
			Inspect:      namerelay.NewNames(nb.Inspect),
			UnnamedPorts: nb.UnnamedPorts,
			Rule:         "egress-names", RuleID: nb.RuleID,
		}
	}
	a.relayPols.Store(&pols)
	for _, id := range p.SandboxIDs {
		nb, ok := p.Names[id]
		if !ok {
			if err := a.egress.ClearRelay(id); err != nil {
				return err
			}
			continue
		}
		rc := egress.RelayConfig{NetnsCookie: a.netnsCookie, RefuseQUIC: !nb.QUIC}
		if a.relay != nil {
			for _, ap := range a.relay.Addrs() {
				if ap.Addr().Is4() {
					rc.Relay4 = ap
				} else {
					rc.Relay6 = ap
				}
			}
		}
		if err := a.egress.SetRelay(id, rc); err != nil {
			return err
		}
		if a.relay == nil {
			a.emit(audit.Event{Kind: audit.KindNet, Verdict: audit.VerdictRecorded, Severity: audit.SeverityAlert,
				Sandbox: audit.Sandbox{Name: nb.Sandbox}, Mechanism: namerelay.Mechanism,
				Message: fmt.Sprintf("name binding: the relay did not start (%v): TCP connections to answered addresses are refused", a.relayErr)})
		}
	}
	return nil
}

// brokered prepares a sandbox's terminated TLS (credential brokering and
// inspected names): its CA (kept for
// the agent's life, so reloads do not invalidate the bundle a running
// command trusts), the trust bundle file, and the secrets' values. A value
// that cannot be read is recorded and left out: its placeholder then
// reaches the host as it is, worthless.
func (a *Agent) brokered(pol *policy.Policy, nb plan.NameBinding) (*namerelay.CA, []namerelay.Secret) {
	if len(nb.Secrets) == 0 && len(nb.Inspect) == 0 {
		return nil, nil
	}
	alert := func(msg string) {
		a.emit(audit.Event{Kind: audit.KindAgent, Verdict: audit.VerdictRecorded, Severity: audit.SeverityAlert,
			Sandbox: audit.Sandbox{Name: nb.Sandbox}, Mechanism: namerelay.Mechanism, Message: "credential broker: " + msg})
	}
	a.casMu.Lock()
	ca := a.cas[nb.Sandbox]
	if ca == nil {
		var err error
		if ca, err = namerelay.NewCA(nb.Sandbox, 365*24*time.Hour); err != nil {
			a.casMu.Unlock()
			alert(err.Error())
			return nil, nil
		}
		if a.cas == nil {
			a.cas = map[string]*namerelay.CA{}
		}
		a.cas[nb.Sandbox] = ca
	}
	a.casMu.Unlock()
	if err := writeTrustBundle(plan.SandboxCAFile(pol, nb.Sandbox), ca.CertPEM()); err != nil {
		alert(err.Error())
	}
	var out []namerelay.Secret
	for _, sec := range nb.Secrets {
		var val string
		if sec.FromEnv != "" {
			val = os.Getenv(sec.FromEnv)
		} else if b, err := os.ReadFile(sec.FromFile); err == nil {
			val = strings.TrimRight(string(b), "\r\n")
		}
		if val == "" {
			alert(fmt.Sprintf("secret %q has no value (from_env %q, from_file %q): its placeholder is not replaced", sec.Name, sec.FromEnv, sec.FromFile))
			continue
		}
		out = append(out, namerelay.Secret{Name: sec.Name, Placeholder: plan.Placeholder(nb.Sandbox, sec.Name), Value: val,
			Hosts: namerelay.NewNames(sec.Hosts)})
	}
	return ca, out
}

// systemRoots are the usual places of the host's CA bundle.
var systemRoots = []string{"/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/cert.pem"}

// writeTrustBundle writes the host's roots followed by the sandbox CA:
// SSL_CERT_FILE and friends replace a client's roots, so the bundle keeps
// every other site verifiable.
func writeTrustBundle(path string, ca []byte) error {
	var b []byte
	for _, f := range systemRoots {
		if roots, err := os.ReadFile(f); err == nil {
			b = append(roots, '\n')
			break
		}
	}
	b = append(b, ca...)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("trust bundle: %w", err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return fmt.Errorf("trust bundle: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("trust bundle: %w", err)
	}
	return nil
}

// canaryAdmit is canary.Runner.Admit: the fronting check's address is
// admitted for the sandbox for a short while, as if the proxy had
// answered it (with no name: only the probe's refusal can follow).
func (a *Agent) canaryAdmit(sandbox string, addr netip.Addr) error {
	id, ok := a.egress.dirs.ID(sandbox)
	if !ok || a.egress.Egress == nil {
		return fmt.Errorf("canary: sandbox %q has no egress", sandbox)
	}
	return a.egress.Allow(id, []netip.Addr{addr}, 30*time.Second)
}

// recordAnswer remembers which name an answer was for, for the relay:
// as long as the kernel admits its addresses (TTL plus the grace).
func (a *Agent) recordAnswer(id uint32, ans dnsproxy.Answer, grace time.Duration) {
	if a.answers == nil {
		return
	}
	a.answers.Record(id, ans.Name, ans.Addrs, time.Duration(ans.TTL)*time.Second+grace)
}

// expireAnswers drops expired names until ctx ends; it also keeps the
// listeners in sandboxes' own network namespaces (netns.go), closed when
// ctx ends.
func (a *Agent) expireAnswers(ctx context.Context) {
	t := time.NewTicker(30 * time.Second)
	defer t.Stop()
	ns := time.NewTicker(netnsSweep)
	defer ns.Stop()
	for {
		select {
		case <-ctx.Done():
			a.closeNetns()
			return
		case <-ns.C:
			a.sweepNetns()
		case <-a.netns.kick:
			a.sweepNetns()
		case <-t.C:
			if a.answers != nil {
				a.answers.Expire()
			}
		}
	}
}
