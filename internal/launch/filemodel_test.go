package launch_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/watcherhq/watcher/internal/enforce/enforcetest"
	"github.com/watcherhq/watcher/internal/launch"
	"github.com/watcherhq/watcher/internal/policy"
)

// TestDerivedFileModel runs a shell under a derived ruleset on the real
// kernel: reads work everywhere except the blocked paths (which get
// EACCES), writes only in the workspace and the scratch directory, execs
// everywhere but the scratch directory, which holds the workspace.
func TestDerivedFileModel(t *testing.T) {
	enforcetest.RequireRoot(t)
	if launch.LandlockABI() == 0 {
		t.Skip("Landlock is not available on this kernel")
	}
	shell := "bash"
	if _, err := exec.LookPath("bash"); err != nil {
		shell = "sh" // the qemu guest's busybox: no process substitution
	}
	sandbox := enforcetest.Cgroup(t, "filemodel")
	base, _ := filepath.EvalSymlinks(t.TempDir())
	scratch := filepath.Join(base, "scratch")
	ws := filepath.Join(scratch, "ws")
	secret := filepath.Join(base, "secret")
	for _, d := range []string{ws, secret, filepath.Join(base, "open")} {
		os.MkdirAll(d, 0o755)
	}
	os.WriteFile(filepath.Join(secret, "key"), []byte("k"), 0o600)
	os.WriteFile(filepath.Join(base, "open", "data"), []byte("d"), 0o644)
	os.WriteFile(filepath.Join(base, "sibling"), []byte("s"), 0o644)
	for _, f := range []string{filepath.Join(scratch, "tool"), filepath.Join(ws, "tool")} {
		os.WriteFile(f, []byte("#!/bin/sh\necho ran\n"), 0o755)
	}
	rules := &launch.FileRules{
		Derive: true,
		Files: []policy.FileRule{
			{Name: "write-outside-workspace", Path: "/", Match: policy.MatchPrefix, Access: policy.AccessWrite, Action: policy.ActionBlock},
			{Name: "workspace", Path: ws + "/", Match: policy.MatchPrefix, Access: policy.AccessWrite, Action: policy.ActionAllow},
			{Name: "tmp", Path: scratch + "/", Match: policy.MatchPrefix, Access: policy.AccessWrite, Action: policy.ActionAllow},
			{Name: "terminal", Path: "/dev/null", Match: policy.MatchExact, Access: policy.AccessWrite, Action: policy.ActionAllow},
			{Name: "cred-shadow", Path: "/etc/shadow", Match: policy.MatchExact, Access: policy.AccessAny, Action: policy.ActionBlock},
			{Name: "secret", Path: secret + "/", Match: policy.MatchPrefix, Access: policy.AccessAny, Action: policy.ActionBlock},
		},
		Exec: []policy.FileRule{
			{Name: "exec-from-tmp", Path: scratch + "/", Match: policy.MatchPrefix, Action: policy.ActionBlock},
			{Name: "workspace", Path: ws + "/", Match: policy.MatchPrefix, Action: policy.ActionAllow},
		},
		Devices:       []string{"/dev/null"},
		IgnoreMissing: true,
	}
	procsub := "t procsub diff <(echo a) <(echo a)"
	if shell != "bash" {
		procsub = "echo procsub=ok"
	}
	script := strings.NewReplacer("PROCSUB", procsub, "BASE", base, "WS", ws, "SCRATCH", scratch, "SECRET", secret).Replace(`
t() { name=$1; shift; if "$@" >/dev/null 2>&1; then echo "$name=ok"; else echo "$name=refused"; fi; }
t hostname cat /etc/hostname
t passwd cat /etc/passwd
t ls-etc ls /etc
t proc-self-fd ls /proc/self/fd
t proc-status cat /proc/self/status
PROCSUB
t dev-fd cat /dev/fd/0 </etc/hostname
t sibling cat BASE/sibling
t open-dir cat BASE/open/data
t shadow cat /etc/shadow
t secret cat SECRET/key
t ws-write sh -c 'echo x > WS/f && cat WS/f'
t scratch-new sh -c 'echo y > SCRATCH/new && cat SCRATCH/new'
t etc-write sh -c 'echo z > /etc/watcher-test-file'
t base-write sh -c 'echo z > BASE/new'
t ws-exec WS/tool
t scratch-exec SCRATCH/tool
t scratch-new-exec sh -c 'cp WS/tool SCRATCH/t2 && SCRATCH/t2'
`)
	var out bytes.Buffer
	v, err := launch.Run(context.Background(), launch.Config{
		Path: shell, Args: []string{"-c", script}, Stdout: &out, Stderr: &out,
		Sandbox: "test", CgroupParent: sandbox, Label: "filemodel",
		Restrictions: launch.Restrictions{Seccomp: launch.DefaultSeccomp(), Files: rules},
	})
	if err != nil || v.Outcome != launch.OutcomeExited {
		t.Fatalf("run: %v %v\n%s", err, v, out.String())
	}
	want := map[string]string{
		"hostname": "ok", "passwd": "ok", "ls-etc": "ok", "proc-self-fd": "ok", "proc-status": "ok",
		"procsub": "ok", "dev-fd": "ok", "sibling": "ok", "open-dir": "ok", "shadow": "refused", "secret": "refused",
		"ws-write": "ok", "scratch-new": "ok", "etc-write": "refused", "base-write": "refused",
		"ws-exec": "ok", "scratch-exec": "refused", "scratch-new-exec": "refused",
	}
	parse := func(s string) map[string]string {
		m := map[string]string{}
		for _, line := range strings.Split(s, "\n") {
			if k, val, ok := strings.Cut(line, "="); ok {
				m[k] = val
			}
		}
		return m
	}
	got := parse(out.String())
	// The same script with no restrictions: what fails there (no /dev/fd
	// in the qemu guest's initramfs) proves nothing here.
	var benign []string
	for _, line := range strings.Split(script, "\n") {
		f := strings.Fields(line)
		if len(f) > 1 && f[0] == "t" && want[f[1]] != "ok" {
			continue // only the checks that must pass run bare
		}
		benign = append(benign, line)
	}
	bare, _ := exec.Command(shell, "-c", strings.Join(benign, "\n")).CombinedOutput()
	baseline := parse(string(bare))
	for k, w := range want {
		if w == "ok" && baseline[k] != "ok" {
			t.Logf("%s: fails without restrictions too (%s), not judged", k, baseline[k])
			continue
		}
		if got[k] != w {
			t.Errorf("%s: %s, want %s", k, got[k], w)
		}
	}
	if t.Failed() {
		t.Logf("output:\n%s\napplied: %+v", out.String(), v.Applied)
	}
	if _, err := os.Stat("/etc/watcher-test-file"); err == nil {
		os.Remove("/etc/watcher-test-file")
		t.Error("the write outside the workspace happened")
	}
}
