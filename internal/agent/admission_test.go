package agent

import (
	"errors"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/dnsproxy"
	"github.com/watcherhq/watcher/internal/enforce/egress"
	"github.com/watcherhq/watcher/internal/enforce/egress/dnsbind"
	"github.com/watcherhq/watcher/internal/enforce/enforcetest"
	"github.com/watcherhq/watcher/internal/enforce/lsm"
	"github.com/watcherhq/watcher/internal/pipeline"
	"github.com/watcherhq/watcher/internal/plan"
)

type collect struct {
	mu  sync.Mutex
	evs []audit.Event
}

func (c *collect) Name() string { return "collect" }
func (c *collect) Close() error { return nil }
func (c *collect) Consume(ev *audit.Event) (pipeline.Decision, error) {
	c.mu.Lock()
	c.evs = append(c.evs, *ev)
	c.mu.Unlock()
	return pipeline.Decision{}, nil
}

// TestAdmissionFromPolicy: the policy's admission_ttl_cap and egress.name_ports
// reach the kernel map through the agent's answer hook (a 68-year TTL is
// capped, github.com gets TCP 22 beside the web ports, pypi.org the web
// ports only), and a reload that drops github.com drops what its answer
// admitted, with a record saying so.
func TestAdmissionFromPolicy(t *testing.T) {
	eng := enforcetest.Engine(t)
	eg, err := egress.Load(eng, egress.Options{Grace: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer eg.Close()
	lsmErr := map[string]error{}
	for _, h := range lsm.Hooks() {
		lsmErr[h] = errors.New("refused")
	}
	compile := func(allow string) *plan.Plan {
		t.Helper()
		p := parse(t, `version: 1
sandboxes:
  - name: web
    select: {cgroups: [/web]}
    preset: restricted
    dns: {allow: [`+allow+`]}
    egress:
      admission_ttl_cap: 2m
      name_ports: [{name: github.com, ports: ["22"]}]
`)
		pl, err := plan.Compile(p, plan.Env{LSM: lsmErr}, plan.NewRuleTable())
		if err != nil {
			t.Fatalf("compile: %v", err)
		}
		return pl
	}
	sink := &collect{}
	a := &Agent{plan: compile("github.com, pypi.org"), pipe: pipeline.New(nil, sink)}
	a.egress = egressLayer{Egress: eg, dirs: dnsbind.NewDirectory()}
	id := a.plan.SandboxIDs["web"]
	a.egress.dirs.Set("web", id)
	gh, pypi := netip.MustParseAddr("198.18.5.5"), netip.MustParseAddr("198.18.5.6")
	a.onAnswer(dnsproxy.Answer{Sandbox: "web", Name: "github.com.", Addrs: []netip.Addr{gh}, TTL: 2147483647})
	a.onAnswer(dnsproxy.Answer{Sandbox: "web", Name: "pypi.org.", Addrs: []netip.Addr{pypi}, TTL: 60})
	t.Cleanup(func() { eg.RemoveSandbox(id) })

	ports := func(addr netip.Addr) string {
		spans, err := eg.Admitted(id, addr)
		if err != nil {
			return err.Error()
		}
		var out []string
		for _, s := range spans {
			if s.Expires.After(time.Now().Add(2*time.Minute + 5*time.Second)) {
				t.Errorf("%s port %d admitted until %s, past the 2m cap", addr, s.Lo, s.Expires)
			}
			out = append(out, strconv.Itoa(int(s.Lo)))
		}
		return strings.Join(out, ",")
	}
	if got := ports(gh); got != "80,443,22" {
		t.Errorf("github.com's address open on %s, want 80,443,22", got)
	}
	if got := ports(pypi); got != "80,443" {
		t.Errorf("pypi.org's address open on %s, want 80,443", got)
	}

	a.plan = compile("pypi.org")
	a.revokeDropped(a.plan)
	if _, err := eg.Admitted(id, gh); err == nil {
		t.Error("github.com's address still admitted after the reload dropped the name")
	}
	if got := ports(pypi); got != "80,443" {
		t.Errorf("pypi.org's address after the reload: %s", got)
	}
	sink.mu.Lock()
	defer sink.mu.Unlock()
	if len(sink.evs) != 1 || !strings.Contains(sink.evs[0].Message, "1 answered address(es) of names no longer allowed dropped") {
		t.Errorf("reload records %+v", sink.evs)
	}
}
