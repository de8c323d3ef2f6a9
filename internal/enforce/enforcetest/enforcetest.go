// Package enforcetest holds helpers for tests that load BPF programs and run
// children in sandbox cgroups. Everything a helper creates is removed in
// t.Cleanup.
package enforcetest

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/limits"
)

// RequireRoot skips tests that need root (they run as root in CI).
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: loads BPF programs and creates cgroups")
	}
}

func randSuffix() string {
	b := make([]byte, 4)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// Engine opens an engine pinned under a fresh directory in bpffs, removed
// (with all pins) at cleanup.
func Engine(t testing.TB) *enforce.Engine {
	t.Helper()
	RequireRoot(t)
	if err := enforce.EnsureBPFFS("/sys/fs/bpf"); err != nil {
		t.Fatalf("bpffs: %v", err)
	}
	dir := filepath.Join("/sys/fs/bpf", "watcher-test-"+randSuffix())
	eng, err := enforce.Open(enforce.Options{PinDir: dir})
	if err != nil {
		t.Fatalf("open engine: %v", err)
	}
	t.Cleanup(func() {
		eng.Close()
		if err := enforce.Unpin(dir); err != nil {
			t.Errorf("unpin: %v", err)
		}
	})
	return eng
}

// Cgroup creates a cgroup v2 directory for the test (under a per-test parent
// below the discovered cgroup2 mount) and returns its absolute path.
func Cgroup(t testing.TB, name string) string {
	t.Helper()
	RequireRoot(t)
	root, err := cgroupfs.Mountpoint()
	if err != nil {
		t.Skipf("no cgroup v2 hierarchy: %v", err)
	}
	parent := filepath.Join(root, "watcher-test-"+randSuffix())
	path := filepath.Join(parent, name)
	if err := cgroupfs.Create(path); err != nil {
		t.Fatalf("create cgroup: %v", err)
	}
	t.Cleanup(func() {
		if err := cgroupfs.Remove(parent); err != nil {
			t.Errorf("remove cgroup: %v", err)
		}
		// An agent applying a sandbox's limits made v1 twins (hybrid hosts).
		if h, err := limits.Detect(); err == nil {
			if err := h.RemoveV1Tree(strings.TrimPrefix(parent, root)); err != nil {
				t.Errorf("remove v1 cgroups: %v", err)
			}
		}
	})
	return path
}

// Child creates a cgroup below parent (a nested sandbox descendant).
func Child(t testing.TB, parent, name string) string {
	t.Helper()
	path := filepath.Join(parent, name)
	if err := cgroupfs.Create(path); err != nil {
		t.Fatalf("create cgroup: %v", err)
	}
	return path
}

// Command prepares cmd to start directly inside the cgroup at cgPath
// (CLONE_INTO_CGROUP), so it is confined from its first instruction.
func Command(t testing.TB, cgPath string, name string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(name, args...)
	if cgPath != "" {
		fd, err := os.Open(cgPath)
		if err != nil {
			t.Fatalf("open cgroup: %v", err)
		}
		t.Cleanup(func() { fd.Close() })
		cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(fd.Fd())}
	}
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// SelfCommand re-executes the test binary running only the named test
// function with env WATCHER_TEST_HELPER=mode, inside cgPath ("" for none).
// Tests use it to perform an operation from a child process: the helper
// test checks the env var and does the operation.
func SelfCommand(t testing.TB, cgPath, testName, mode string, extraEnv ...string) *exec.Cmd {
	t.Helper()
	cmd := Command(t, cgPath, os.Args[0], "-test.run=^"+testName+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), append([]string{"WATCHER_TEST_HELPER=" + mode}, extraEnv...)...)
	return cmd
}
