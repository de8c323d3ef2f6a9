package agent

// Name binding (policy egress.names): the relay the connect hooks send a
// sandbox's TCP connections to, and the names the DNS proxy answered.

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/dnsproxy"
	"github.com/watcherhq/watcher/internal/enforce/egress"
	"github.com/watcherhq/watcher/internal/namerelay"
	"github.com/watcherhq/watcher/internal/plan"
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
		return
	}
	a.relay = r
}

func (a *Agent) relayLookup(src netip.AddrPort) (namerelay.Conn, bool) {
	if a.egress == nil {
		return namerelay.Conn{}, false
	}
	r, ok := a.egress.LookupRelayed(src, relayMaxAge)
	return namerelay.Conn{SandboxID: r.SandboxID, Dest: r.Dest, PID: r.PID}, ok
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
	pols := map[uint32]*namerelay.Policy{}
	for id, nb := range p.Names {
		sandbox := nb.Sandbox
		pols[id] = &namerelay.Policy{
			Sandbox: sandbox, RecordOnly: nb.RecordOnly,
			NameAllowed:  func(name string) bool { return a.dns != nil && a.dns.NameListed(sandbox, name) },
			ECH:          namerelay.NewNames(nb.ECH),
			ReadOnly:     namerelay.NewNames(nb.ReadOnly),
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

// recordAnswer remembers which name an answer was for, for the relay:
// as long as the kernel admits its addresses (TTL plus the grace).
func (a *Agent) recordAnswer(id uint32, ans dnsproxy.Answer, grace time.Duration) {
	if a.answers == nil {
		return
	}
	a.answers.Record(id, ans.Name, ans.Addrs, time.Duration(ans.TTL)*time.Second+grace)
}

// expireAnswers drops expired names until ctx ends.
func (a *Agent) expireAnswers(ctx context.Context) {
	t := time.NewTicker(30 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if a.answers != nil {
				a.answers.Expire()
			}
		}
	}
}
