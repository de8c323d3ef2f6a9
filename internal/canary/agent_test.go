package canary_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/miekg/dns"

	"github.com/watcherhq/watcher/internal/agent"
	"github.com/watcherhq/watcher/internal/canary"
	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/launch"
	"github.com/watcherhq/watcher/internal/policy"
	"github.com/watcherhq/watcher/internal/testkit/e2etest"
)

// The test binary is also the probe (the canary package's initialiser
// performs it) and watcher exec's launcher child (launch.Init), so the
// same static binary runs in the qemu guest.
func TestMain(m *testing.M) {
	if os.Getenv(envConnects) != "" {
		os.Exit(connectsMain())
	}
	if os.Getenv(envSpend) != "" {
		os.Exit(spendMain())
	}
	launch.Init()
	os.Exit(m.Run())
}

// TestAgentCanary: the real agent, started in this process on this
// kernel, passes its own canary on both placements; each forbidden check
// is refused by the layer the layer table names and its event is in the
// ledger. In the qemu guest (BPF LSM or fmod_ret) the runtime-placed probes
// are refused with an errno instead of killed.
func TestAgentCanary(t *testing.T) {
	w := e2etest.New(t, "canary-test")
	w.DNSUpstreams = []string{`"` + upstream(t) + `"`}
	ws := filepath.Join(w.Base, "ws")
	os.MkdirAll(ws, 0o755)
	cg := w.Cgroup
	w.OwnCgroup(w.CgAbs + "-trial")
	pol, err := policy.Parse("canary-test.yaml", []byte(w.PolicyHead("")+fmt.Sprintf(`  - name: agents
    select: {cgroups: [%s]}
    preset: restricted
    workspace: [%s]
    escape: {enabled: false}
    canary: {enabled: true, interval: 1h}
  - name: trial
    select: {cgroups: [%s-trial]}
    preset: restricted
    mode: record
    workspace: [%s]
    escape: {enabled: false}
    canary: {enabled: true, interval: 1h}
`, cg, ws, cg, ws)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a, err := agent.Start(ctx, agent.Options{Policy: pol})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Stop()
	reps, err := a.Check("agents")
	if err != nil {
		t.Fatal(err)
	}
	if len(reps) != 1 {
		t.Fatalf("%d reports", len(reps))
	}
	rep := reps[0]
	var table strings.Builder
	for _, r := range rep.Results {
		fmt.Fprintf(&table, "%-8s %-20s %-8s %-16s %-11s %-4s %v %s\n", r.Path, r.Check, r.Expected, r.Got, r.Layer, r.Event, r.OK, r.Detail)
	}
	t.Logf("canary on this kernel:\n%s", table.String())
	if rep.Failures != 0 {
		t.Fatalf("%d checks failed on a healthy agent", rep.Failures)
	}
	seen := map[string]bool{}
	for _, r := range rep.Results {
		seen[r.Path+"/"+r.Check] = true
		if r.Expected != canary.Allowed && r.Event != "yes" {
			t.Errorf("%s/%s: forbidden, but no event", r.Path, r.Check)
		}
	}
	for _, c := range []string{"file_read_blocked", "file_write_outside", "file_read_allowed", "file_write_allowed", "mount", "ptrace", "bpf", "dns_unlisted", "connect_unanswered"} {
		for _, p := range []string{canary.PathRuntime, canary.PathExec} {
			if !seen[p+"/"+c] {
				t.Errorf("no %s/%s check in the report", p, c)
			}
		}
	}
	// Record mode: every forbidden operation happens, and its would-refuse
	// record must be in the ledger (the runtime path only: watcher exec
	// keeps its seccomp and Landlock in record mode).
	reps, err = a.Check("trial")
	if err != nil {
		t.Fatal(err)
	}
	table.Reset()
	for _, r := range reps[0].Results {
		fmt.Fprintf(&table, "%-8s %-20s %-8s %-16s %-11s %-4s %v %s\n", r.Path, r.Check, r.Expected, r.Got, r.Layer, r.Event, r.OK, r.Detail)
		if r.Path != canary.PathRuntime {
			t.Errorf("record mode probed through watcher exec: %+v", r)
		}
	}
	t.Logf("record mode:\n%s", table.String())
	if len(reps[0].Results) < 9 {
		t.Fatalf("record-mode canary: %d checks", len(reps[0].Results))
	}
	for _, r := range reps[0].Results {
		if r.OK {
			continue
		}
		t.Errorf("record mode: %s/%s failed: %+v", r.Path, r.Check, r)
	}

	// The probes left nothing behind: no leaf below the sandbox.
	abs, _ := cgroupfs.Abs(cg)
	entries, _ := os.ReadDir(abs)
	for _, e := range entries {
		if e.IsDir() && strings.HasPrefix(e.Name(), "canary-") {
			t.Errorf("probe leaf %s left behind", e.Name())
		}
	}
}

// upstream is a real DNS server on loopback that knows no name (NXDOMAIN):
// what record mode forwards reaches it, and nothing leaves the host.
func upstream(t *testing.T) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetRcode(q, dns.RcodeNameError)
		w.WriteMsg(m)
	})}
	go srv.ActivateAndServe()
	t.Cleanup(func() { srv.Shutdown() })
	return pc.LocalAddr().String()
}
