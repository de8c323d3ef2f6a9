package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/limits"
)

// TestLimitsEndToEnd: a sandbox with limits under the running agent; a
// memory hog run with watcher exec is OOM-killed at the limit and the kill
// reaches watcher tail, the ledger and the metrics; a fork bomb stops at
// the pids limit; watcher status shows the usage and which cgroup
// hierarchy enforces each limit.
func TestLimitsEndToEnd(t *testing.T) {
	h, err := limits.Detect()
	if err != nil || h.Mechanism(limits.Memory) == limits.None || h.Mechanism(limits.PIDs) == limits.None {
		t.Skipf("no memory or pids controller on this host (%v)", err)
	}
	tb := newTestbed(t, "    limits: {memory: 48M, pids: 24, cpu: 1}\n", "{enabled: false}")
	t.Cleanup(func() {
		// The v1 groups beside the cgroup2 ones (hybrid hosts).
		for _, mnt := range h.V1 {
			for _, cg := range []string{tb.cgroup, tb.cgroup + "-exec", tb.cgroup + "-benign"} {
				exec.Command("find", filepath.Join(mnt, cg), "-depth", "-type", "d", "-exec", "rmdir", "{}", ";").Run()
			}
		}
	})
	// A second sandbox for processes a runtime places itself (no watcher
	// exec): the agent applies its limit and watches its counters.
	rt := tb.cgroup + "-benign"
	if err := cgroupfs.Create(tb.cgAbs + "-benign"); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(tb.policy, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(f, "  - name: runtime\n    select: {cgroups: [%s]}\n    preset: restricted\n    limits: {memory: 32M}\n", rt)
	f.Close()
	tb.startAgent()
	ctl := filepath.Join(tb.socketDir, "control.sock")

	lines := tb.tailJSON(func(e audit.Event) bool { return e.Kind == audit.KindLimit })
	time.Sleep(300 * time.Millisecond)

	// The benign neighbour first: a small command runs to its end.
	if out, code := tb.watcher("exec", "--socket", ctl, "--", "sh", "-c", "head -c 4000000 /dev/zero | wc -c"); code != 0 || !strings.Contains(out, "4000000") {
		t.Fatalf("small command: exit %d\n%s", code, out)
	}
	out, code := tb.watcher("exec", "--socket", ctl, "--label", "hog-1", "--", "tail", "/dev/zero")
	if code != 128+9 || !strings.Contains(out, "oom_kills=1") {
		t.Fatalf("memory hog: exit %d, want 137 and oom_kills=1:\n%s", code, out)
	}
	t.Logf("hog: %s", grepLines([]byte(out), "watcher: limits"))
	if strings.Contains(out, "kill backstop") || !strings.Contains(out, "OOM-killed at the memory limit 48M") {
		t.Errorf("the run's summary does not tell the OOM kill at the limit apart from a backstop kill:\n%s", out)
	}
	var oom *audit.Event
	timeout := time.After(10 * time.Second)
	for oom == nil {
		select {
		case e := <-lines:
			if e.Limit != nil && e.Limit.Resource == "memory" {
				oom = &e
			}
		case <-timeout:
			t.Fatalf("no OOM kill reached watcher tail; agent log:\n%s", tb.agentLog)
		}
	}
	if oom.Verdict != audit.VerdictKilled || oom.Process.Comm != "tail" || oom.Sandbox.Labels["label"] != "hog-1" ||
		oom.Limit.Limit != 48<<20 || oom.Limit.Mechanism != h.Mechanism(limits.Memory) {
		t.Errorf("OOM event: %+v %+v", oom, oom.Limit)
	}

	// A fork bomb stops at the pids limit; the launcher's kill ends it.
	out, _ = tb.watcher("exec", "--socket", ctl, "--kill", "3s", "--", "sh", "-c", "bomb() { bomb | bomb & }; bomb; sleep 60")
	if !regexp.MustCompile(`pids\.max_hits=[1-9]`).MatchString(out) {
		t.Fatalf("fork bomb: no pids limit hit:\n%s", out)
	}
	var pidsHit *audit.Event
	timeout = time.After(10 * time.Second)
	for pidsHit == nil {
		select {
		case e := <-lines:
			if e.Limit != nil && e.Limit.Resource == "pids" {
				pidsHit = &e
			}
		case <-timeout:
			t.Fatal("no pids limit event reached watcher tail")
		}
	}

	// A runtime's process in the second sandbox (placed in the cgroup2 and
	// the v1 groups of the same name, as a runtime does on a hybrid host):
	// the agent records its OOM kill with the victim.
	c := inSandbox(t, tb.cgAbs+"-benign", "c1", "read x; exec tail /dev/zero")
	stdin, _ := c.StdinPipe()
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	cg, err := h.Apply(rt+"/c1", limits.Limits{}, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := cg.Enter(c.Process.Pid); err != nil {
		t.Fatal(err)
	}
	io.WriteString(stdin, "go\n")
	stdin.Close()
	werr := c.Wait()
	lb, _ := os.ReadFile(filepath.Join(h.V1["memory"], rt, "memory.limit_in_bytes"))
	t.Logf("runtime process: %v; v1 limit %s; usage %+v", werr, lb, h.UsageOf(rt))
	var rtKill *audit.Event
	timeout = time.After(15 * time.Second)
	for rtKill == nil {
		select {
		case e := <-lines:
			if e.Sandbox.Name == "runtime" && e.Limit != nil && e.Limit.Resource == "memory" {
				rtKill = &e
			}
		case <-timeout:
			t.Fatalf("the agent recorded no OOM kill in the runtime's sandbox; agent log:\n%s", tb.agentLog)
		}
	}
	if rtKill.Process.Comm != "tail" || rtKill.Process.PID != uint32(c.Process.Pid) || rtKill.Limit.Limit != 32<<20 {
		t.Errorf("runtime OOM event: %+v %+v (want tail, pid %d)", rtKill, rtKill.Limit, c.Process.Pid)
	}

	// Metrics: usage, limits and the kill count.
	resp, err := http.Get("http://" + tb.metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, re := range []string{
		`watcher_sandbox_memory_limit_bytes\{sandbox="agents"\} 5\.0331648e\+07`,
		`watcher_sandbox_oom_kills_total\{sandbox="agents"\} [1-9]`,
		`watcher_sandbox_pids_limit\{sandbox="agents"\} 24`,
		`watcher_sandbox_pids_max_hits_total\{sandbox="agents"\} [1-9]`,
		`watcher_sandbox_cpu_seconds_total\{sandbox="agents"\} `,
		`watcher_events_total\{kind="limit",sandbox="agents",verdict="killed"\} 1`,
	} {
		if !regexp.MustCompile(re).Match(body) {
			t.Errorf("metrics lack %s:\n%s", re, grepLines(body, "watcher_sandbox_"))
		}
	}

	// The alerts fire on these counters, for the sandboxes whose
	// counters moved (promtool on the rules' expressions).
	requireAlertsFire(t, body, map[string]string{
		"WatcherSandboxOOMKill":      "watcher_sandbox_oom_kills_total",
		"WatcherSandboxForksRefused": "watcher_sandbox_pids_max_hits_total",
	})

	// Status: usage against limits and the layer rows.
	out, _ = tb.watcher("status", "--socket", ctl)
	if !regexp.MustCompile(`/ 24 \(\d+%\)\s+[1-9]\d*\s+[1-9]`).MatchString(out) {
		t.Errorf("status does not count the OOM kill and the refused forks:\n%s", out)
	}
	for _, want := range []string{"OOM KILLS", "/ 48M", "limits.memory", "limits.pids", "memory=" + h.Mechanism(limits.Memory)} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	t.Logf("status:\n%s", out)
	tb.stopAgent(syscall.SIGTERM)

	// The ledger kept the kill with the victim.
	out, _ = tb.watcher("ledger", "cat", "--kind", "limit", tb.ledger)
	if !strings.Contains(out, `comm="tail"`) || !strings.Contains(out, "OOM-killed at the memory limit 48M") {
		t.Errorf("ledger lacks the OOM kill:\n%s", out)
	}
}
