package main

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestWorkspaceCommitWithholdsSetuid: a sandboxed command marks a file
// setuid; `watcher workspace commit` puts the file in the real directory
// without the bit and says so; the executable beside it commits as it
// was.
func TestWorkspaceCommitWithholdsSetuid(t *testing.T) {
	tb := newTestbed(t, "    workspace_options: {mode: overlay}\n", "{enabled: false}")
	unmountOverlaysAtCleanup(t, tb)
	ws := tb.ws
	tb.startAgent()
	ctl := filepath.Join(tb.socketDir, "control.sock")
	out, code := tb.watcher("exec", "--socket", ctl, "--", "sh", "-c", "cd "+ws+
		" && printf '#!/bin/sh\\necho hi\\n' > tool && chmod 4755 tool && printf 'plain\\n' > run && chmod 755 run")
	if code != 0 {
		t.Fatalf("exec: %d\n%s", code, out)
	}
	out, code = tb.watcher("workspace", "commit", "--socket", ctl, "agents")
	if code != 0 {
		t.Fatalf("commit: %d\n%s", code, out)
	}
	t.Logf("watcher workspace commit:\n%s", out)
	if !strings.Contains(out, "withheld from the real directory") || !strings.Contains(out, "setuid bit") ||
		!strings.Contains(out, filepath.Join(ws, "tool")) || !strings.Contains(out, "1 withheld") {
		t.Errorf("commit output does not say the setuid bit was withheld:\n%s", out)
	}
	for name, want := range map[string]os.FileMode{"tool": 0o755, "run": 0o755} {
		fi, err := os.Lstat(filepath.Join(ws, name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode()&(os.ModePerm|os.ModeSetuid|os.ModeSetgid) != want {
			t.Errorf("%s after commit: %v, want %v", name, fi.Mode(), want)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(ws, "run")); string(b) != "plain\n" {
		t.Errorf("run after commit: %q", b)
	}
	tb.stopAgent(syscall.SIGTERM)
}
