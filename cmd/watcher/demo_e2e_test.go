package main

import (
	"bytes"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/watcherhq/watcher/internal/cgroupfs"
)

// TestDemoOutput runs `watcher demo` as a newcomer would and checks that
// it reads cleanly: the start-up canary's result is one line of its own
// before the steps and none of its probes' events are listed under a
// step; each step's row is that step's real outcome (the process that
// tried the operation: killed, or its exit status and last message),
// never a pipeline's "exit 0" beside a shell's "Killed"; every forbidden
// step shows the refusal that caused it; and nothing is left behind.
func TestDemoOutput(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("watcher demo loads BPF programs and creates cgroups: needs root")
	}
	if _, err := cgroupfs.Mountpoint(); err != nil {
		t.Skipf("no cgroup v2 hierarchy: %v", err)
	}
	bin := watcherBinary(t)
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(bin, "demo")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("watcher demo: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	out := stdout.String()
	t.Log("\n" + out)
	pid := strconv.Itoa(cmd.Process.Pid)
	if _, err := os.Stat("/sys/fs/bpf/watcher-demo-" + pid); !os.IsNotExist(err) {
		t.Errorf("the demo left its pins behind: /sys/fs/bpf/watcher-demo-%s (%v)", pid, err)
	}
	if abs, err := cgroupfs.Abs("/watcher-demo-" + pid); err == nil {
		if _, err := os.Stat(abs); !os.IsNotExist(err) {
			t.Errorf("the demo left its sandbox cgroup behind: %s (%v)", abs, err)
		}
	}

	lines := strings.Split(out, "\n")
	canaryLine, firstSection, ledgerLine := -1, -1, -1
	for i, l := range lines {
		switch {
		case strings.HasPrefix(l, "Start-up canary"):
			if canaryLine >= 0 {
				t.Errorf("two canary lines: %d and %d", canaryLine, i)
			}
			canaryLine = i
		case strings.HasPrefix(l, "A process placed in the sandbox cgroup") && firstSection < 0:
			firstSection = i
		case strings.HasPrefix(l, "Ledger "):
			ledgerLine = i
		}
	}
	if canaryLine < 0 || firstSection < 0 || ledgerLine < 0 {
		t.Fatalf("missing canary line (%d), first section (%d) or ledger line (%d)", canaryLine, firstSection, ledgerLine)
	}
	if canaryLine > firstSection {
		t.Errorf("the canary's result comes after the steps began (line %d > %d)", canaryLine, firstSection)
	}
	if m := regexp.MustCompile(`: (\d+) of (\d+) checks passed`).FindStringSubmatch(lines[canaryLine]); m == nil || m[1] != m[2] || m[1] == "0" {
		t.Errorf("canary line does not say that every check passed: %q", lines[canaryLine])
	}
	if !strings.HasSuffix(strings.TrimSpace(out), "OK") {
		t.Errorf("the demo's ledger did not verify OK")
	}

	// The steps: a row, then the events the step caused.
	row := regexp.MustCompile(`^\s*(\d+)\. (.{42}) (.*)$`)
	type step struct {
		what, outcome string
		events        []string
	}
	var steps []*step
	for _, l := range lines[firstSection:ledgerLine] {
		if strings.Contains(l, "canary") {
			t.Errorf("a canary event among the steps: %q", l)
		}
		if m := row.FindStringSubmatch(l); m != nil {
			steps = append(steps, &step{what: strings.TrimSpace(m[2]), outcome: m[3]})
		} else if strings.HasPrefix(l, "      ") && len(steps) > 0 {
			steps[len(steps)-1].events = append(steps[len(steps)-1].events, l)
		}
	}
	if len(steps) != len(demoSteps)+len(demoExecSteps) {
		t.Fatalf("%d step rows, want %d", len(steps), len(demoSteps)+len(demoExecSteps))
	}
	outcome := regexp.MustCompile(`^(killed by SIG[A-Z]+|exit \d+( \([a-z ]+\))?)(: .+)?$`)
	for _, s := range steps {
		if !outcome.MatchString(s.outcome) {
			t.Errorf("%s: outcome %q is not 'killed by SIG...' or 'exit N: message'", s.what, s.outcome)
		}
		if strings.HasPrefix(s.outcome, "exit 0") && strings.Contains(s.outcome, "Killed") {
			t.Errorf("%s: %q: the row says exit 0 for a killed process", s.what, s.outcome)
		}
		if strings.HasSuffix(s.what, "(allowed)") {
			if !strings.HasPrefix(s.outcome, "exit 0: notes") {
				t.Errorf("%s: %q, want exit 0 and the workspace's file", s.what, s.outcome)
			}
			continue
		}
		if strings.HasPrefix(s.outcome, "exit 0") {
			t.Errorf("%s: %q: a forbidden operation succeeded", s.what, s.outcome)
		}
		refused := false
		for _, e := range s.events {
			refused = refused || strings.Contains(e, " denied ") || strings.Contains(e, " killed ")
		}
		if !refused {
			t.Errorf("%s: %q with no refusal listed under it: %q", s.what, s.outcome, s.events)
		}
		if strings.HasPrefix(s.outcome, "killed by") && !strings.Contains(strings.Join(s.events, "\n"), " killed ") {
			t.Errorf("%s: the process was killed but no kill is listed: %q", s.what, s.events)
		}
	}
	// Through watcher exec, seccomp and Landlock refuse with an errno:
	// nothing is killed.
	for _, s := range steps[len(demoSteps):] {
		if strings.HasPrefix(s.outcome, "killed") {
			t.Errorf("watcher exec %s: %q, want a refusal with an exit status", s.what, s.outcome)
		}
	}
}
