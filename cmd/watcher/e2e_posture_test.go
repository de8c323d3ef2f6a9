package main

import (
	"encoding/json"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/testkit/poll"
)

// TestPostureRequire: a sandbox requiring no_new_privs and cap_drop_all.
// A plain root process placed in its cgroup raises a posture alert in the
// ledger and makes `watcher status --posture` exit 1; replaced by a
// process with no_new_privs and no capabilities, the change is recorded
// and status exits 0.
func TestPostureRequire(t *testing.T) {
	tb := newTestbed(t, "    require: [no_new_privs, cap_drop_all]\n", "{enabled: false}")
	tb.startAgent()
	sock := filepath.Join(tb.socketDir, "control.sock")
	child := filepath.Join(tb.cgAbs, "c1")
	if err := cgroupfs.Create(child); err != nil {
		t.Fatal(err)
	}
	// Processes started outside the sandbox and moved in, as a runtime
	// places them (the restricted preset's hooks never see their setup).
	place := func(args ...string) *exec.Cmd {
		t.Helper()
		cmd := exec.Command(args[0], args[1:]...)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		if err := cgroupfs.MovePID(child, cmd.Process.Pid); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	// waitStatus polls `watcher status --posture` until the row shows want.
	waitStatus := func(want string, wantCode int) string {
		t.Helper()
		var out string
		var code int
		if !poll.Within(30*time.Second, func() bool {
			out, code = tb.watcher("status", "--posture", "--socket", sock)
			return code == wantCode && strings.Contains(out, want)
		}) {
			t.Fatalf("status --posture never showed %q with exit %d; last (exit %d):\n%s\nagent log:\n%s", want, wantCode, code, out, tb.agentLog)
		}
		return out
	}

	// metric returns the watcher_posture_missing sample for a requirement.
	metric := func(req string) string {
		t.Helper()
		resp, err := http.Get("http://" + tb.metrics + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return grepLines(body, `watcher_posture_missing{requirement="`+req+`",sandbox="agents"}`)
	}

	plain := place("sleep", "1000")
	out := waitStatus("no_new_privs,cap_drop_all", 1)
	if !strings.Contains(out, "sandbox cgroups lack required hardening: agents") {
		t.Errorf("status --posture does not say what is lacking:\n%s", out)
	}
	if m := metric("cap_drop_all"); !strings.HasSuffix(m, " 1") {
		t.Errorf("metric while lacking: %q", m)
	}
	plain.Process.Kill()
	plain.Wait()
	place("setpriv", "--no-new-privs", "--bounding-set", "-all", "sleep", "1000")
	out = waitStatus("none", 0)
	if m := metric("no_new_privs"); !strings.HasSuffix(m, " 0") {
		t.Errorf("metric once hardened: %q", m)
	}
	for _, col := range []string{"CAP_EFF", "NO_NEW_PRIVS", "MISSING"} {
		if !strings.Contains(out, col) {
			t.Errorf("no %s column:\n%s", col, out)
		}
	}
	// The ledger, once the records are durable.
	tb.stopAgent(syscall.SIGTERM)
	lout, code := tb.watcher("ledger", "cat", "--json", "--kind", "posture", tb.ledger)
	if code != 0 {
		t.Fatalf("ledger cat: exit %d\n%s", code, lout)
	}
	var alert, healed bool
	for _, l := range strings.Split(strings.TrimSpace(lout), "\n") {
		var e audit.Event
		if err := json.Unmarshal([]byte(l), &e); err != nil || e.Posture == nil {
			continue
		}
		if e.Posture.Procs == 0 || e.Sandbox.Name != "agents" {
			continue
		}
		missing := strings.Join(e.Posture.Missing, ",")
		switch {
		case missing == "no_new_privs,cap_drop_all" && e.Severity == audit.SeverityAlert && !e.Posture.NoNewPrivs:
			alert = true
		case alert && missing == "" && e.Severity == audit.SeverityRoutine && e.Posture.NoNewPrivs && e.Posture.CapEff == 0:
			healed = true
		}
	}
	if !alert || !healed {
		t.Fatalf("ledger posture records: alert %v, change to hardened %v:\n%s", alert, healed, lout)
	}
}
