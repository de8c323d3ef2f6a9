package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/watcherhq/watcher/internal/gateway"
	"github.com/watcherhq/watcher/pkg/toolclient"
)

// TestPolicySuggestLoop closes the record-then-enforce loop on the real
// agent: a run in record mode (a write outside the workspace, an exec from
// /tmp, a tool the policy does not list), `watcher policy suggest` on its
// ledger, then the suggestion enforced: the same run is refused nothing,
// and the baseline's dangerous operations (and a write next to the one
// recorded) are still refused.
func TestPolicySuggestLoop(t *testing.T) {
	tb := newTestbed(t, "    mode: record\n    tools: {enabled: true}\n", "{enabled: false}")
	out := "/opt/watcher-suggest-" + strconv.Itoa(os.Getpid())
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(out) })
	tmpBin := "/tmp/watcher-suggest-true-" + strconv.Itoa(os.Getpid())
	t.Cleanup(func() { os.Remove(tmpBin) })
	ctl := filepath.Join(tb.socketDir, "control.sock")
	workload := "echo built > " + out + "/build.log && cp /bin/true " + tmpBin + " && " + tmpBin + " && echo WORKLOAD-DONE"
	run := func(what, script string) (string, []json.RawMessage) {
		t.Helper()
		report := filepath.Join(t.TempDir(), "report.json")
		o, _ := tb.watcher("exec", "--socket", ctl, "--sandbox", "agents", "--report", report, "--", "/bin/sh", "-c", script)
		b, _ := os.ReadFile(report)
		var rep struct {
			Refusals []json.RawMessage `json:"refusals"`
		}
		json.Unmarshal(b, &rep)
		t.Logf("%s:\n%s\nrefusals: %s", what, o, b)
		return o, rep.Refusals
	}
	shell := func() error {
		c, err := toolclient.Dial(gateway.SocketPath(tb.socketDir, "agents"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.Session = "suggest-" + strconv.Itoa(len(tb.agentLog.String()))
		_, err = c.Shell(context.Background(), "sh-1", "echo via-gateway", 10)
		return err
	}

	tb.startAgent()
	if o, _ := run("recorded run", workload); !strings.Contains(o, "WORKLOAD-DONE\n") {
		t.Fatalf("the workload did not finish in record mode:\n%s", o)
	}
	if err := shell(); err == nil {
		t.Fatal("shell through the gateway ran though the policy does not list it")
	}
	tb.stopAgent(syscall.SIGTERM)

	sug, code := tb.watcher("policy", "suggest", "--sandbox", "agents", "--policy", tb.policy, tb.ledger)
	t.Logf("suggestion:\n%s", sug)
	if code != 0 {
		t.Fatalf("policy suggest: exit %d", code)
	}
	for _, want := range []string{out + "/build.log", tmpBin, "tool: shell", "mode: enforce", "write-outside-workspace", "exec-from-tmp", "default-deny"} {
		if !strings.Contains(sug, want) {
			t.Errorf("the suggestion lacks %q", want)
		}
	}
	if strings.Contains(sug, "watcher-canary") {
		t.Error("the suggestion allows the canary's probes (the agent's self-test, not the run)")
	}
	if err := os.WriteFile(tb.policy, []byte(sug), 0o600); err != nil {
		t.Fatal(err)
	}

	tb.startAgent()
	o, refused := run("the same run, enforced", workload)
	if !strings.Contains(o, "WORKLOAD-DONE\n") || len(refused) != 0 {
		t.Errorf("under the suggested policy the recorded run was refused: %d refusals\n%s", len(refused), o)
	}
	if err := shell(); err != nil {
		t.Errorf("shell through the gateway under the suggested policy: %v", err)
	}
	for _, dangerous := range []string{
		"cat /etc/shadow",
		"echo 1 > /proc/sys/vm/overcommit_ratio",
		"echo x > " + out + "/other.log",
	} {
		o, refused := run(dangerous, dangerous+" && echo DANGER-DONE")
		if strings.Contains(o, "\nDANGER-DONE\n") || strings.HasPrefix(o, "DANGER-DONE\n") || strings.Contains(o, "root:") || len(refused) == 0 {
			t.Errorf("%q under the suggested policy: not refused (%d refusals)\n%s", dangerous, len(refused), o)
		}
	}
}
