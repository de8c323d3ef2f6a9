package e2etest

import (
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/enforce/enforcetest"
)

// InCgroup prepares argv to start in a fresh cgroup parent/name, directly
// (CLONE_INTO_CGROUP), as a container runtime places a process: no
// seccomp, no Landlock, only the kernel hooks on the cgroup.
func InCgroup(t testing.TB, parent, name string, argv ...string) *exec.Cmd {
	t.Helper()
	cg := filepath.Join(parent, name)
	if err := cgroupfs.Create(cg); err != nil {
		t.Fatal(err)
	}
	return enforcetest.Command(t, cg, argv[0], argv[1:]...)
}
