package main

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/ledger"
)

// canaryRuns returns the ledger's canary run records (one per run) in
// order.
func canaryRuns(t *testing.T, dir string) []ledger.Record {
	t.Helper()
	rd, err := ledger.NewReader(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	var out []ledger.Record
	for {
		rec, err := rd.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if rec.Event.Kind == audit.KindCanary && rec.Event.Sandbox.Labels[audit.LabelCanary] == "run" {
			out = append(out, *rec)
		}
	}
}

// firstRunAfter waits for the first canary run that started after the
// given time (a run's record carries its start time) and returns it: the
// first periodic run after a break proves the canary catches it within
// one interval. The test's deadline bounds the wait.
func firstRunAfter(t *testing.T, tb *testbed, after time.Time) ledger.Record {
	t.Helper()
	for {
		for _, r := range canaryRuns(t, tb.ledger) {
			if r.Event.Time.After(after) {
				return r
			}
		}
		if tb.agent.Exited() {
			t.Fatalf("agent exited:\n%s", tb.agentLog)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

var canaryChecks = []string{"file_read_blocked", "file_read_allowed", "file_write_outside", "file_write_allowed",
	"mount", "ptrace", "bpf", "dns_unlisted", "connect_unanswered"}

// TestCanary: a healthy agent's canary passes on this kernel through both
// placements, its events are marked and never scored; rules removed from
// a map behind the agent's back are caught by the next periodic run.
func TestCanary(t *testing.T) {
	tb := newTestbed(t, "", "{enabled: true, threshold: 100, window: 60s, action: freeze}\n    canary: {enabled: true, interval: 5s}")
	tb.startAgent()
	sock := filepath.Join(tb.socketDir, "control.sock")

	out, code := tb.watcher("check", "--socket", sock)
	if code != 0 {
		t.Fatalf("watcher check on a healthy agent: exit %d\n%s\nagent log:\n%s", code, out, tb.agentLog)
	}
	for _, c := range canaryChecks {
		for _, path := range []string{"runtime", "exec"} {
			if !regexp.MustCompile(`(?m)^agents\s+` + path + `\s+` + c + `\s.*\sok$`).MatchString(out) {
				t.Errorf("no passing %s/%s row:\n%s", path, c, out)
			}
		}
	}
	// Forbidden operations came with their event; the backstop killed
	// the runtime-placed probes, seccomp and Landlock refused the exec'd.
	for _, want := range []string{`runtime\s+mount\s+\S+\s+killed\s+killed\s+kill\s+yes`, `exec\s+mount\s+\S+\s+denied\s+denied \(EPERM\)\s+seccomp\s+yes`,
		`exec\s+file_read_blocked\s+\S+\s+denied\s+denied \(EACCES\)\s+landlock\s+yes`, `runtime\s+connect_unanswered\s+\S+\s+denied\s+denied \(EPERM\)\s+cgroup_bpf\s+yes`} {
		if !regexp.MustCompile(want).MatchString(out) {
			t.Errorf("check table lacks %q:\n%s", want, out)
		}
	}
	if out, code := tb.watcher("check", "--help"); code != 0 || !strings.Contains(out, "EXPECTED") {
		t.Errorf("check --help: exit %d\n%s", code, out)
	}
	if out, code := tb.watcher("check", "--socket", sock, "nosuch"); code == 0 || !strings.Contains(out, `no sandbox "nosuch"`) {
		t.Errorf("check of an unknown sandbox: exit %d\n%s", code, out)
	}

	// Status: up, the canary passed, no escape score from dozens of
	// refusals, and the refusals are not counted as the sandbox's.
	out, code = tb.watcher("status", "--socket", sock)
	if code != 0 || !regexp.MustCompile(`canary\s+agents: \d+ checks passed`).MatchString(out) {
		t.Fatalf("status exit %d:\n%s", code, out)
	}
	if !regexp.MustCompile(`(?m)^agents\s+enforce\s+\S+\s+false\s+0\.0\s+0\s+0\s`).MatchString(out) {
		t.Errorf("canary events scored or counted as the sandbox's:\n%s", out)
	}

	// The ledger marks every event of the probes.
	lout, _ := tb.watcher("ledger", "cat", "--json", tb.ledger)
	marked := 0
	for _, line := range strings.Split(lout, "\n") {
		if strings.Contains(line, "watcher-canary-") && strings.Contains(line, `"verdict":"killed"`) {
			if !strings.Contains(line, `"canary":"`) {
				t.Errorf("probe event not marked as the canary's: %s", line)
			}
			marked++
		}
	}
	if marked == 0 {
		t.Errorf("no killed probe event in the ledger:\n%s", lout)
	}
	// The metric exists from the first run, at zero.
	body := scrape(t, tb.metrics)
	if !regexp.MustCompile(`watcher_canary_failures_total\{check="runtime/mount",sandbox="agents"\} 0`).MatchString(body) ||
		!regexp.MustCompile(`watcher_canary_runs_total\{sandbox="agents"\} [1-9]`).MatchString(body) {
		t.Fatalf("canary metrics:\n%s", grepLines([]byte(body), "watcher_canary"))
	}

	// A policy reload runs the canary again at once.
	reloadAt := time.Now()
	pb, _ := os.ReadFile(tb.policy)
	if err := os.WriteFile(tb.policy, append(pb, []byte("# edited\n")...), 0o600); err != nil {
		t.Fatal(err)
	}
	for {
		var got bool
		for _, r := range canaryRuns(t, tb.ledger) {
			if r.Event.Time.After(reloadAt) && strings.Contains(r.Event.Message, "canary (reload)") {
				got = true
			}
		}
		if got {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}

	// Remove the kill backstop's file rules behind the agent's back: the
	// path rules and the inode entries that follow protected files under
	// their other names (both would refuse the honeytoken). The agent
	// writes its rules again after changes in watched host directories
	// (other tests run beside this one), so the break is kept up until the
	// runs that must find it (the next periodic one and watcher check) are done.
	var maps []*ebpf.Map
	for _, name := range []string{"bs_path_rules", "bs_inode_rules"} {
		m, err := ebpf.LoadPinnedMap(filepath.Join(tb.pinDir, "maps", name), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		maps = append(maps, m)
	}
	removed := clearMap(t, maps[0])
	if removed == 0 {
		t.Fatal("bs_path_rules was empty")
	}
	removed += clearMap(t, maps[1])
	broken := time.Now()
	stop := make(chan struct{})
	kept := make(chan struct{})
	go func() {
		defer close(kept)
		for {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			for _, m := range maps {
				k := make([]byte, m.KeySize())
				for m.NextKey(nil, k) == nil {
					if m.Delete(k) != nil {
						break
					}
				}
			}
		}
	}()
	run := firstRunAfter(t, tb, broken)
	msg := run.Event.Message
	if !strings.Contains(msg, "(interval)") || !strings.Contains(msg, "runtime/file_read_blocked") {
		t.Fatalf("the first periodic run after removing %d path rules: %s", removed, msg)
	}
	// Landlock still refuses under watcher exec: that path passes.
	if strings.Contains(msg, "exec/file_read_blocked") {
		t.Errorf("exec path failed too, though Landlock still refuses: %s", msg)
	}
	if run.Event.Severity != audit.SeverityAlert {
		t.Errorf("failed run is not an alert: %+v", run.Event)
	}
	out, code = tb.watcher("status", "--socket", sock)
	if code == 0 || !strings.Contains(out, "canary failed") || !strings.Contains(out, "runtime/file_read_blocked") {
		t.Errorf("status with a failing canary: exit %d\n%s", code, out)
	}
	out, code = tb.watcher("check", "--socket", sock, "agents")
	if code != 1 || !regexp.MustCompile(`runtime\s+file_read_blocked\s+\S+\s+killed\s+allowed\s.*FAIL`).MatchString(out) {
		t.Errorf("check after the break: exit %d\n%s", code, out)
	}
	close(stop) // the on-demand check above must find the break too
	<-kept
	if !regexp.MustCompile(`watcher_canary_failures_total\{check="runtime/file_read_blocked",sandbox="agents"\} [1-9]`).MatchString(scrape(t, tb.metrics)) {
		t.Errorf("failure not counted:\n%s", grepLines([]byte(scrape(t, tb.metrics)), "watcher_canary_failures"))
	}
	// Alert only: nothing frozen.
	if ev, _ := os.ReadFile(filepath.Join(tb.cgAbs, "cgroup.events")); strings.Contains(string(ev), "frozen 1") {
		t.Error("sandbox frozen although on_canary_failure is not freeze")
	}

	// The DNS proxy gone from the path: the kernel's redirect now points
	// at a port nothing answers on (the proxy's port in the sandbox's
	// egress config, rewritten behind the agent's back).
	configs, err := ebpf.LoadPinnedMap(filepath.Join(tb.pinDir, "maps", "egress_configs"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer configs.Close()
	dead := freePort(t)
	var key uint32
	val := make([]byte, configs.ValueSize())
	it := configs.Iterate()
	n := 0
	for it.Next(&key, &val) {
		// struct net_config: flags, proxy_ip4, proxy_ip6[4], then
		// proxy_port4 in network order at byte 24.
		val[24], val[25] = byte(dead>>8), byte(dead)
		if err := configs.Put(key, val); err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n == 0 {
		t.Fatal("no egress config to break")
	}
	broken = time.Now()
	run = firstRunAfter(t, tb, broken)
	msg = run.Event.Message
	if !strings.Contains(msg, "(interval)") || !strings.Contains(msg, "runtime/dns_unlisted") || !strings.Contains(msg, "exec/dns_unlisted") {
		t.Fatalf("the first periodic run after the DNS proxy left the path: %s", msg)
	}
	out, _ = tb.watcher("check", "--socket", sock, "agents")
	if !regexp.MustCompile(`runtime\s+dns_unlisted\s+\S+\s+denied\s+error \(ECONNREFUSED\)\s+dnsproxy\s+no\s+FAIL`).MatchString(out) {
		t.Errorf("check without the DNS proxy in the path:\n%s", out)
	}
}

// TestCanaryFreeze: a detached program (the sandbox's connect4 link) is
// caught by the next periodic run, and on_canary_failure: freeze freezes
// the sandbox until watcher thaw.
func TestCanaryFreeze(t *testing.T) {
	tb := newTestbed(t, "", "{enabled: false}\n    canary: {enabled: true, interval: 5s}\n    on_canary_failure: freeze")
	tb.startAgent()
	sock := filepath.Join(tb.socketDir, "control.sock")
	if out, code := tb.watcher("check", "--socket", sock); code != 0 {
		t.Fatalf("healthy check: exit %d\n%s", code, out)
	}
	// A workload of the sandbox, to be frozen with it.
	victim := inSandbox(t, tb.cgAbs, "victim", "while :; do sleep 0.05; done")
	if err := victim.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { victim.Process.Kill(); victim.Wait() }()

	id, err := cgroupfs.ID(tb.cgAbs)
	if err != nil {
		t.Fatal(err)
	}
	// The sandbox's connect4 and the host's: with only the sandbox's gone,
	// the host's foreign-socket program refuses the canary's connect on a
	// socket no sandbox program saw, and connect_unanswered still passes.
	for _, dir := range []string{strconv.FormatUint(id, 10), "host"} {
		l, err := link.LoadPinnedLink(filepath.Join(tb.pinDir, "links", "egress", dir, "connect4"), nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Detach(); err != nil {
			t.Fatalf("detach %s/connect4: %v", dir, err)
		}
		l.Close()
	}
	broken := time.Now()
	run := firstRunAfter(t, tb, broken)
	msg := run.Event.Message
	if !strings.Contains(msg, "(interval)") || !strings.Contains(msg, "runtime/connect_unanswered") || !strings.Contains(msg, "exec/connect_unanswered") {
		t.Fatalf("the first periodic run after detaching connect4: %s", msg)
	}
	if !strings.Contains(msg, "frozen (on_canary_failure: freeze): "+tb.cgAbs) {
		t.Fatalf("not frozen: %s", msg)
	}
	if ev, _ := os.ReadFile(filepath.Join(tb.cgAbs, "cgroup.events")); !waitFrozen(tb.cgAbs) {
		t.Fatalf("the kernel does not report the sandbox frozen: %s", ev)
	}
	st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", victim.Process.Pid))
	out, code := tb.watcher("status", "--socket", sock)
	if code == 0 || !regexp.MustCompile(`(?m)^agents\s+enforce\s+\S+\s+true`).MatchString(out) {
		t.Errorf("status while frozen by the canary: exit %d\n%s", code, out)
	}
	if out, code := tb.watcher("thaw", "--socket", sock, "agents"); code != 0 {
		t.Fatalf("thaw: exit %d\n%s", code, out)
	}
	if ev, _ := os.ReadFile(filepath.Join(tb.cgAbs, "cgroup.events")); strings.Contains(string(ev), "frozen 1") {
		t.Errorf("still frozen after thaw: %s (victim stat while frozen: %s)", ev, st)
	}
}

func waitFrozen(cg string) bool {
	for i := 0; i < 100; i++ {
		if ev, _ := os.ReadFile(filepath.Join(cg, "cgroup.events")); strings.Contains(string(ev), "frozen 1") {
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}

func clearMap(t *testing.T, m *ebpf.Map) int {
	t.Helper()
	var keys [][]byte
	key := make([]byte, m.KeySize())
	it := m.Iterate()
	val := make([]byte, m.ValueSize())
	for it.Next(&key, &val) {
		keys = append(keys, append([]byte(nil), key...))
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if err := m.Delete(k); err != nil {
			t.Fatal(err)
		}
	}
	return len(keys)
}

func scrape(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// TestCanaryTailMark: watcher tail shows a probe's event as the canary's.
func TestCanaryTailMark(t *testing.T) {
	e := audit.Event{Kind: audit.KindMount, Verdict: audit.VerdictKilled, Sandbox: audit.Sandbox{Name: "agents",
		Labels: map[string]string{audit.LabelCanary: "mount", "label": "canary-mount"}}}
	if line := compactLine(&e, false); !strings.Contains(line, "[agents/canary:mount]") {
		t.Errorf("compact line %q does not mark the canary", line)
	}
	e.Sandbox.Labels = map[string]string{"label": "call-1"}
	if line := compactLine(&e, false); !strings.Contains(line, "[agents/call-1]") || strings.Contains(line, "canary") {
		t.Errorf("compact line %q", line)
	}
}
