package workspace

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/launch"
)

// Isolation is how `watcher exec` shows the workspace to a command: its
// own mount namespace, in which each overlay is bound over the real
// directory and the state directory is hidden (the command cannot reach
// its own or other sandboxes' upper layers or snapshots by path), and its own IPC namespace with a
// fresh /dev/shm and /dev/mqueue, so System V and POSIX IPC objects the
// command creates die with it instead of outliving a rollback.
func (w *Workspace) Isolation() launch.Isolation {
	iso := launch.Isolation{Namespaces: unix.CLONE_NEWNS | unix.CLONE_NEWIPC}
	for _, l := range w.Layers {
		iso.Mounts = append(iso.Mounts, launch.Mount{Source: l.Merged, Target: l.Lower, Flags: unix.MS_BIND | unix.MS_REC})
	}
	iso.Mounts = append(iso.Mounts,
		launch.Mount{Source: "watcher-hidden", Target: filepath.Dir(w.Dir), FSType: "tmpfs",
			Flags: unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, Data: "size=4k,mode=0700"},
		launch.Mount{Source: "shm", Target: "/dev/shm", FSType: "tmpfs", Flags: unix.MS_NOSUID | unix.MS_NODEV, Data: "mode=1777", IfExists: true},
		launch.Mount{Source: "mqueue", Target: "/dev/mqueue", FSType: "mqueue", Flags: unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, IfExists: true},
	)
	return iso
}

// Stop kills every process in the cgroups (absolute cgroup2 paths, each
// with its subtree), frozen or not (by the cgroup2 freezer or the v1
// one: cgroupfs.Kill), and waits up to timeout for each to empty, so
// nothing writes to the workspace while it is committed or rolled back.
// Cgroups that do not exist are skipped. It returns how many cgroups held
// processes.
func Stop(cgroups []string, timeout time.Duration) (int, error) {
	stopped := 0
	for _, cg := range cgroups {
		if _, err := os.Stat(filepath.Join(cg, "cgroup.procs")); err != nil {
			continue
		}
		if cgroupfs.Empty(cg) {
			continue
		}
		stopped++
		// Freeze first so nothing forks while the kill is delivered, then
		// kill the subtree; KillWait kills again now and then (a task
		// that joined after the kill was frozen, not killed).
		_ = cgroupfs.Freeze(cg, true)
		if err := cgroupfs.KillWait(cg, timeout); err != nil {
			return stopped, fmt.Errorf("stop sandbox: %w", err)
		}
		_ = cgroupfs.Freeze(cg, false)
	}
	return stopped, nil
}

// Freeze freezes (or thaws) the cgroups that exist, for a consistent
// snapshot.
func Freeze(cgroups []string, frozen bool) error {
	var errs []error
	for _, cg := range cgroups {
		if _, err := os.Stat(filepath.Join(cg, "cgroup.freeze")); err != nil {
			continue
		}
		if err := cgroupfs.Freeze(cg, frozen); err != nil {
			errs = append(errs, err)
			continue
		}
		if frozen {
			waitFrozen(cg)
		}
	}
	return errors.Join(errs...)
}

func waitFrozen(cg string) {
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		data, err := os.ReadFile(filepath.Join(cg, "cgroup.events"))
		if err != nil || strings.Contains(string(data), "frozen 1") {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}
