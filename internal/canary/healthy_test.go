package canary_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/watcherhq/watcher/internal/agent"
	"github.com/watcherhq/watcher/internal/canary"
	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/control"
	"github.com/watcherhq/watcher/internal/policy"
	"github.com/watcherhq/watcher/internal/testkit/e2etest"
)

// healthy is the real agent, started in this process, with one enforcing
// sandbox, and a runner for its DNS checks alone.
type healthy struct {
	w    *e2etest.World
	a    *agent.Agent
	pol  *policy.Policy
	sb   *policy.Sandbox
	cgID uint64
	dns  canary.Target
	run  *canary.Runner
	sbID uint32
	ctx  context.Context
}

func startHealthy(t *testing.T, prefix string) *healthy {
	return startHealthyWith(t, prefix, nil)
}

// startHealthyWith is startHealthy with more sandboxes: more returns
// their policy text.
func startHealthyWith(t *testing.T, prefix string, more func(w *e2etest.World) string) *healthy {
	t.Helper()
	w := e2etest.New(t, prefix)
	w.DNSUpstreams = []string{`"` + upstream(t) + `"`}
	ws := filepath.Join(w.Base, "ws")
	os.MkdirAll(ws, 0o755)
	extra := ""
	if more != nil {
		extra = more(w)
	}
	pol, err := policy.Parse(prefix+".yaml", []byte(w.PolicyHead("")+fmt.Sprintf(`  - name: agents
    select: {cgroups: [%s]}
    preset: restricted
    workspace: [%s]
    escape: {enabled: false}
    canary: {enabled: true, interval: 1h}
`, w.Cgroup, ws)+extra))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	a, err := agent.Start(ctx, agent.Options{Policy: pol})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Stop() })
	h := &healthy{w: w, a: a, pol: pol, sb: pol.Sandbox("agents"), ctx: ctx}
	if h.cgID, err = cgroupfs.ID(w.CgAbs); err != nil {
		t.Fatal(err)
	}
	p := a.Plan()
	h.sbID = p.SandboxIDs["agents"]
	// The layer table's DNS row alone: the plan then has the DNS checks
	// (and the allowed file checks, which Checks leaves out).
	var layers []control.Layer
	for _, l := range p.Layers {
		if l.Rule == "agents: dns" {
			layers = append(layers, l)
		}
	}
	if len(layers) == 0 {
		t.Fatalf("no DNS row in the layer table: %v", p.Layers)
	}
	parent := agent.ExecParents(pol, h.sb)[0]
	if err := a.PrepareExec(); err != nil {
		t.Fatal(err)
	}
	h.dns = canary.Target{Policy: pol, Sandbox: h.sb, Layers: layers, Parent: w.CgAbs, ExecParent: parent,
		Restrictions: p.Launch["agents"], Exec: true, Reason: "test", Checks: []string{"dns_unlisted"}}
	h.run = &canary.Runner{LedgerDir: pol.Agent.LedgerDir, Mark: a.MarkCanary}
	return h
}

// runDNS runs the DNS check on both placements and returns its results.
func (h *healthy) runDNS(t *testing.T) []control.CanaryResult {
	t.Helper()
	rep, err := h.run.Run(h.ctx, h.dns)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != 2 {
		t.Fatalf("DNS check: %d results, want runtime and exec: %+v", len(rep.Results), rep.Results)
	}
	return rep.Results
}

func row(r control.CanaryResult) string {
	return fmt.Sprintf("%-8s %-20s %-8s %-16s %-11s %-4s %v %s", r.Path, r.Check, r.Expected, r.Got, r.Layer, r.Event, r.OK, r.Detail)
}

// TestHealthyCanaryRepeats: on a healthy agent the DNS check (both
// placements) passes 100 times in a row (10 with -short).
// Each run's DNS names are new; the proxy judges the canary's own queries
// by the policy alone (they spend none of the sandbox's information
// budget), so the hundredth is refused as the first was: "not on
// allowlist" (EDE 17), never "too much information in names" (EDE 15),
// which the check would not take for a pass.
func TestHealthyCanaryRepeats(t *testing.T) {
	h := startHealthy(t, "canary-repeat")
	n := 100
	if testing.Short() {
		n = 10
	}
	start := time.Now()
	for i := 0; i < n; i++ {
		for _, r := range h.runDNS(t) {
			if i == 0 || i == n-1 {
				t.Logf("DNS run %d: %s", i+1, row(r))
			}
			if !r.OK || r.Event != "yes" || r.Layer != "dnsproxy" || !strings.HasSuffix(r.Detail, "EDE 17 not on allowlist") {
				t.Fatalf("DNS run %d of %d failed on a healthy agent:\n%s", i+1, n, row(r))
			}
		}
	}
	t.Logf("%d DNS check runs passed in %v", n, time.Since(start).Round(time.Millisecond))
}

// TestCanary100Runs: the whole canary (every check, both placements)
// passes 100 times in a row on a healthy agent (10 with -short). It is
// its own test because it is slow: each run starts 18 probe processes,
// and each probe pays for the initialisers of every package linked into
// the binary (prometheus, cilium/ebpf, crypto: ~60 ms of CPU) before it
// acts, so 100 runs take ~2 minutes on an idle 2-core machine.
func TestCanary100Runs(t *testing.T) {
	h := startHealthy(t, "canary-100")
	n := 100
	if testing.Short() {
		n = 10
	}
	start := time.Now()
	probes := 0
	for i := 0; i < n; i++ {
		reps, err := h.a.Check("agents")
		if err != nil {
			t.Fatal(err)
		}
		if reps[0].Failures != 0 {
			var b strings.Builder
			for _, r := range reps[0].Results {
				fmt.Fprintln(&b, row(r))
			}
			t.Fatalf("check %d of %d failed on a healthy agent after %v:\n%s", i+1, n, time.Since(start).Round(time.Millisecond), b.String())
		}
		probes = len(reps[0].Results)
	}
	t.Logf("%d whole check runs (%d probes each) passed in a row in %v", n, probes, time.Since(start).Round(time.Millisecond))
}

// TestCanaryFindsBrokenDNSRedirect: a broken DNS redirect fails the DNS
// check on both placements, and the report names the kernel's refusal.
// The egress configuration of the sandbox removed from its map (the
// connect hook then refuses DNS for want of a policy: the query never
// reaches the proxy, EPERM and no DNS event); put back, the check passes
// again. Then the connect hook detached (queries go to 127.0.0.1:53
// itself): the check fails too.
func TestCanaryFindsBrokenDNSRedirect(t *testing.T) {
	h := startHealthy(t, "canary-broken")
	for _, r := range h.runDNS(t) {
		if !r.OK {
			t.Fatalf("healthy:\n%s", row(r))
		}
	}

	configs, err := ebpf.LoadPinnedMap(filepath.Join(h.w.PinDir, "maps", "egress_configs"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer configs.Close()
	saved := make([]byte, configs.ValueSize())
	if err := configs.Lookup(h.sbID, &saved); err != nil {
		t.Fatalf("egress config of sandbox %d: %v", h.sbID, err)
	}
	if err := configs.Delete(h.sbID); err != nil {
		t.Fatal(err)
	}
	for _, r := range h.runDNS(t) {
		t.Logf("no egress config: %s", row(r))
		if r.OK || r.Got != "denied (EPERM)" || r.Event != "no" || r.Layer != "cgroup_bpf" ||
			!strings.Contains(r.Detail, "before the DNS proxy saw it") || !strings.Contains(r.Detail, "no egress policy for this cgroup") {
			t.Errorf("DNS check with the egress config removed:\n%s", row(r))
		}
	}
	if err := configs.Put(h.sbID, saved); err != nil {
		t.Fatal(err)
	}
	for _, r := range h.runDNS(t) {
		if !r.OK {
			t.Errorf("egress config put back, still failing:\n%s", row(r))
		}
	}

	l, err := link.LoadPinnedLink(filepath.Join(h.w.PinDir, "links", "egress", strconv.FormatUint(h.cgID, 10), "connect4"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Detach(); err != nil {
		t.Fatalf("detach connect4: %v", err)
	}
	l.Close()
	for _, r := range h.runDNS(t) {
		t.Logf("connect4 detached: %s", row(r))
		if r.OK {
			t.Errorf("DNS check passed with the redirect detached:\n%s", row(r))
		}
	}
}
