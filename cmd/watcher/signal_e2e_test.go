package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/testkit/e2etest"
)

// TestSandboxSignalLeavesAgentWorking: a SIGINT during the agent's start
// is reported and ignored; then a sandboxed process sends the agent
// SIGTERM and SIGINT (the requests `watcher run` stops on). The
// sender is killed, the agent stays up and keeps working: a refusal made
// after the signals still reaches `watcher tail`, and the ledger; the
// operator's SIGTERM then stops it. (The signal used to cancel the
// agent's context through main's signal handler: the agent went on
// answering status while its event reader, DNS proxy loop and egress
// watcher had stopped, and nothing more was recorded.)
func TestSandboxSignalLeavesAgentWorking(t *testing.T) {
	tb := newTestbed(t, "", "{enabled: false}")
	// A request during start-up cannot be judged (the backstop may not
	// count signals yet): reported and ignored, not obeyed.
	tb.agent = e2etest.Start(t, exec.Command(tb.bin, "run", "--policy", tb.policy, "--quiet"))
	tb.agentLog = tb.agent.Log
	// The ledger is opened first thing in the start, after the signal
	// set-up; the BPF loads after it take far longer than the signal.
	for start := time.Now(); ; time.Sleep(5 * time.Millisecond) {
		if _, err := os.Stat(tb.ledger); err == nil {
			break
		}
		if time.Since(start) > time.Minute {
			t.Fatalf("the agent never created its ledger %s:\n%s", tb.ledger, tb.agentLog)
		}
	}
	if err := tb.agent.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if err := tb.agent.WaitReady(60*time.Second, func() bool {
		return exec.Command(tb.bin, "status", "--socket", tb.ControlSocket()).Run() == nil
	}); err != nil {
		t.Fatalf("agent did not come up after a SIGINT during its start: %v\n%s", err, tb.agentLog)
	}
	if !strings.Contains(tb.agentLog.String(), "ignored a signal that arrived during start-up") {
		t.Errorf("agent log does not report the SIGINT sent during its start:\n%s", tb.agentLog)
	}
	pid := tb.agent.Pid()
	for _, sig := range []string{"TERM", "INT"} {
		sender := inSandbox(t, tb.cgAbs, "sig"+strings.ToLower(sig), fmt.Sprintf("kill -%s %d; sleep 2; echo survived", sig, pid))
		out, err := sender.CombinedOutput()
		var ee *exec.ExitError
		killed := errors.As(err, &ee) && ee.Sys().(syscall.WaitStatus).Signal() == syscall.SIGKILL
		// Killed by the backstop here; refused (EPERM) where BPF LSM's
		// task_kill hook runs.
		refused := err == nil && strings.Contains(strings.ToLower(string(out)), "not permitted")
		if !killed && !refused {
			t.Errorf("SIG%s sender: %v, want killed (SIGKILL) or refused (EPERM)\n%s", sig, err, out)
		}
	}
	time.Sleep(time.Second)
	if tb.agent.Exited() {
		t.Fatalf("the agent exited on a sandbox's signal:\n%s", tb.agentLog)
	}
	if !strings.Contains(tb.agentLog.String(), "ignored a signal sent from a sandbox") {
		t.Errorf("agent log does not say it ignored the sandbox's signal:\n%s", tb.agentLog)
	}

	// After the signals, a refused mount is still recorded.
	events := tb.tailJSON(func(e audit.Event) bool { return e.Kind == audit.KindMount && e.Sandbox.Name == "agents" })
	// The refusal (killed on this kernel, denied under BPF LSM); an undo
	// record of the same mount may come first. The mount is tried again
	// every 2 s, in case tail had not registered its filter yet.
	deadline := time.After(20 * time.Second)
	for try, refused := 0, false; !refused; try++ {
		mnt := inSandbox(t, tb.cgAbs, fmt.Sprintf("mount%d", try), "mount -t tmpfs watcher-after-signal /mnt; echo rc=$?")
		mnt.CombinedOutput()
		again := time.After(2 * time.Second)
		for waiting := true; waiting && !refused; {
			select {
			case e := <-events:
				refused = e.Verdict == audit.VerdictKilled || e.Verdict == audit.VerdictDenied
			case <-again:
				waiting = false
			case <-deadline:
				t.Fatalf("the refused mount after the sandbox's signals never reached watcher tail: the agent stopped recording\n%s", tb.agentLog)
			}
		}
	}
	if out, code := tb.watcher("status", "--socket", tb.ControlSocket()); code != 0 {
		t.Errorf("watcher status after the signals: exit %d\n%s", code, out)
	}
	tb.stopAgent(syscall.SIGTERM)
	cat, _ := tb.watcher("ledger", "cat", "--json", "--kind", "mount", tb.ledger)
	if !strings.Contains(cat, "watcher-after-signal") && !strings.Contains(cat, `"tmpfs"`) {
		t.Errorf("the ledger holds no record of the mount after the signals:\n%s", cat)
	}
}
