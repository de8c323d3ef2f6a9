package canary

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

func TestRemoveStaleScratch(t *testing.T) {
	dir := t.TempDir()
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	deadPID := dead.Process.Pid
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", deadPID)); err == nil {
		t.Skipf("PID %d was reused at once", deadPID)
	}
	stale := filepath.Join(dir, fmt.Sprintf("watcher-canary-%d-123", deadPID))
	own := filepath.Join(dir, scratchPrefix()+"456")
	other := filepath.Join(dir, "watcher-canary-417439239") // an old name: not judged
	for _, d := range []string{stale, own, other} {
		if err := os.MkdirAll(filepath.Join(d, "mnt"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	file := filepath.Join(dir, fmt.Sprintf("watcher-canary-%d-file", deadPID)) // not a directory
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	n, err := RemoveStaleScratch(dir)
	if err != nil || n != 1 {
		t.Fatalf("removed %d, err %v; want 1, nil", n, err)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("the dead agent's scratch %s is still there (%v)", stale, err)
	}
	for _, p := range []string{own, other, file} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s was removed: %v", p, err)
		}
	}
}
