package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/watcherhq/watcher/internal/agent"
	"github.com/watcherhq/watcher/internal/cgroupfs"
)

// privatePolicy writes a policy for `watcher exec` with a private agent
// whose ledger, sockets and pins are the test's own.
func privatePolicy(t *testing.T, preset, mode string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("watcher exec with a private agent needs root")
	}
	if _, err := cgroupfs.Mountpoint(); err != nil {
		t.Skipf("no cgroup v2 hierarchy: %v", err)
	}
	dir := t.TempDir()
	id := filepath.Base(dir)
	pol := fmt.Sprintf(`version: 1
agent:
  ledger_dir: %s/ledger
  socket_dir: %s/run
  pin_dir: /sys/fs/bpf/watcher-files-%s
  exec_cgroup: /watcher-files-%s
sandboxes:
  - name: exec
    select: {cgroups: [/watcher-files-%s]}
    preset: %s
    mode: %s
`, dir, dir, id, id, id, preset, mode)
	path := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(path, []byte(pol), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if abs, err := cgroupfs.Abs("/watcher-files-" + id); err == nil {
			cgroupfs.Remove(abs)
		}
	})
	return path
}

// TestExecRefusalSummary: a refused read ends the run with a summary
// naming it (rule, layer, allowing line), the JSON report carries the
// label, and the benign neighbours (a read of /etc/hostname, a write in
// the --workspace given without --preset) work.
func TestExecRefusalSummary(t *testing.T) {
	pol := privatePolicy(t, "restricted", "enforce")
	ws, _ := filepath.EvalSymlinks(t.TempDir())
	report := filepath.Join(t.TempDir(), "report.json")
	cmd := exec.Command(watcherBinary(t), "exec", "--policy", pol, "--workspace", ws, "--label", "call-42", "--report", report, "--",
		"sh", "-c", "cat /etc/shadow; cat /etc/hostname >/dev/null && echo hostname-ok; echo x > "+ws+"/out && echo ws-ok; mkdir /etc/watcher-files-dir; echo y > /etc/watcher-files-test")
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() == 0 {
		t.Fatalf("exec: %v, want the last command's failure\n%s", err, out)
	}
	text := string(out)
	// The private agent's sandbox cgroup did not exist before: gone with it.
	if abs, err := cgroupfs.Abs("/watcher-files-" + filepath.Base(filepath.Dir(pol))); err != nil {
		t.Fatal(err)
	} else if _, err := os.Stat(abs); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the private agent left its sandbox cgroup %s behind (%v)", abs, err)
		os.Remove(abs)
	}
	for _, want := range []string{"hostname-ok", "ws-ok", "refused during this run (label=call-42", "/etc/shadow", "cred-shadow", "landlock",
		"would be allowed by: files: [{name: allow-shadow, path: /etc/shadow", "write-outside-workspace"} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if _, err := os.Stat("/etc/watcher-files-dir"); err == nil {
		os.Remove("/etc/watcher-files-dir")
		t.Error("the mkdir outside the workspace happened")
	}
	if _, err := os.Stat("/etc/watcher-files-test"); err == nil {
		os.Remove("/etc/watcher-files-test")
		t.Error("the write outside the workspace happened")
	}
	var rep agent.RunReport
	b, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	ops := map[string]bool{}
	for _, r := range rep.Refusals {
		ops[r.Operation+" "+r.Path] = true
	}
	if !ops["read /etc/shadow"] || !ops["mkdir /etc/watcher-files-dir"] || !ops["write /etc/watcher-files-test"] {
		t.Errorf("refusals: %v", ops)
	}
	if rep.Label != "call-42" || rep.Killed || len(rep.Refusals) != 3 {
		t.Fatalf("report: %s", b)
	}
	for _, r := range rep.Refusals {
		if r.Result != "refused" || r.Errno != "EACCES" || len(r.Allow) == 0 {
			t.Errorf("refusal %+v", r)
		}
	}
	if t.Failed() {
		t.Logf("output:\n%s", text)
	}
}

// TestExecWorkspaceChecks: a workspace that is not a directory, or "/",
// is refused with a clear error before anything runs.
func TestExecWorkspaceChecks(t *testing.T) {
	bin := watcherBinary(t)
	f := filepath.Join(t.TempDir(), "file")
	os.WriteFile(f, nil, 0o600)
	for ws, want := range map[string]string{f: "is not a directory", "/": "every path would be writable", "/nonexistent-files-ws": "no such file"} {
		out, err := exec.Command(bin, "exec", "--socket", "/nonexistent/control.sock", "--workspace", ws, "--", "true").CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), want) {
			t.Errorf("--workspace %s: %v, want exit 2 with %q:\n%s", ws, err, want, out)
		}
	}
}
