package workspace

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
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

// FreezeBound is how long a snapshot waits for the sandbox to freeze.
const FreezeBound = 5 * time.Second

// ErrNotFrozen is returned when a sandbox's processes do not all freeze
// within the bound: the snapshot is not taken (a live sandbox could swap
// a directory for a symlink while the copy runs).
var ErrNotFrozen = errors.New("sandbox did not freeze")

// FreezeSandbox freezes the cgroups (absolute cgroup2 paths, each with
// its subtree) with the cgroup2 freezer and waits up to bound until the
// kernel says each is frozen. A cgroup that does not exist holds no
// process and is skipped; one with processes that cannot be frozen (no
// cgroup.freeze: the root) or that is not frozen in time fails with
// ErrNotFrozen, naming the tasks left running. A task the v1 freezer
// froze never reaches the cgroup2 freezer's trap (cgroup.events keeps
// saying frozen 0), so such a task counts as frozen: every thread not
// trapped by the cgroup2 freezer must sit in a FROZEN v1 freezer cgroup.
// thaw undoes what FreezeSandbox froze, and only that: a cgroup frozen
// before (the escape watch's) stays frozen. On error nothing is left
// frozen by it.
func FreezeSandbox(ctx context.Context, cgroups []string, bound time.Duration) (thaw func() error, err error) {
	var froze []string
	undo := func() error {
		var errs []error
		for _, cg := range froze {
			if err := cgroupfs.Freeze(cg, false); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
		froze = nil
		return errors.Join(errs...)
	}
	defer func() {
		if err != nil {
			undo()
		}
	}()
	for _, cg := range cgroups {
		if _, err := os.Stat(filepath.Join(cg, "cgroup.procs")); err != nil {
			continue
		}
		state, err := os.ReadFile(filepath.Join(cg, "cgroup.freeze"))
		if err != nil {
			if cgroupfs.Empty(cg) {
				continue
			}
			return nil, fmt.Errorf("%w: %s cannot be frozen (%v) and holds processes", ErrNotFrozen, cg, err)
		}
		if strings.TrimSpace(string(state)) != "1" {
			if err := cgroupfs.Freeze(cg, true); err != nil {
				return nil, fmt.Errorf("%w: %w", ErrNotFrozen, err)
			}
			froze = append(froze, cg)
		}
	}
	deadline := time.Now().Add(bound)
	for _, cg := range cgroups {
		for !frozen(cg) {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("%w within %v: %s still runs %s; no snapshot taken", ErrNotFrozen, bound, cg, running(cg))
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	return undo, nil
}

// frozen reports whether nothing in the cgroup subtree can run: the
// cgroup2 freezer says frozen (or nothing is there), or every thread
// that is not trapped by it is frozen by the v1 freezer.
func frozen(cg string) bool {
	data, err := os.ReadFile(filepath.Join(cg, "cgroup.events"))
	if errors.Is(err, os.ErrNotExist) {
		return cgroupfs.Empty(cg)
	}
	if err == nil && (strings.Contains(string(data), "frozen 1") || strings.Contains(string(data), "populated 0")) {
		return true
	}
	return running(cg) == ""
}

// running lists (up to five of) the threads of the cgroup subtree that
// neither freezer holds, "" when there are none.
func running(cg string) string {
	pids, err := cgroupfs.SubtreeProcs(cg, nil)
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, pid := range pids {
		dir := fmt.Sprintf("/proc/%d/task", pid)
		tids, err := os.ReadDir(dir)
		if err != nil {
			continue // gone
		}
		for _, t := range tids {
			if threadFrozen(filepath.Join(dir, t.Name())) {
				continue
			}
			if len(out) == 5 {
				return strings.Join(out, ", ") + " and more"
			}
			out = append(out, fmt.Sprintf("pid %d thread %s", pid, t.Name()))
		}
	}
	return strings.Join(out, ", ")
}

// threadFrozen: the thread waits in the cgroup2 freezer's trap, or in the
// v1 freezer's refrigerator with its v1 cgroup FROZEN.
func threadFrozen(task string) bool {
	wchan, _ := os.ReadFile(filepath.Join(task, "wchan"))
	switch string(wchan) {
	case "do_freezer_trap":
		return true
	case "__refrigerator":
		return v1FreezerState(filepath.Join(task, "cgroup")) == "FROZEN"
	}
	return false
}

// v1FreezerState is the freezer.state of the thread's v1 freezer cgroup
// (from its /proc cgroup file), "" when there is none.
func v1FreezerState(cgroupFile string) string {
	data, err := os.ReadFile(cgroupFile)
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(data), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 || !slices.Contains(strings.Split(parts[1], ","), "freezer") {
			continue
		}
		mnt := v1FreezerMount()
		if mnt == "" || parts[2] == "/" {
			return ""
		}
		st, _ := os.ReadFile(filepath.Join(mnt, filepath.Clean("/"+parts[2]), "freezer.state"))
		return strings.TrimSpace(string(st))
	}
	return ""
}

// v1FreezerMount is where the v1 freezer hierarchy is mounted, "" when
// it is not.
func v1FreezerMount() string {
	mounts, err := cgroupfs.ReadMountinfo("/proc/self/mountinfo")
	if err != nil {
		return ""
	}
	for _, m := range mounts {
		if m.FSType == "cgroup" && m.Root == "/" && slices.Contains(strings.Split(m.SuperOptions, ","), "freezer") {
			return m.Point
		}
	}
	return ""
}
