package canary

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/limits"
)

// Freezer mechanisms Freeze reports.
const (
	FreezerV2 = "cgroup2 cgroup.freeze"
	FreezerV1 = "cgroup1 freezer"
)

// Freeze freezes every task of the cgroup subtree at path (a cgroup2
// path) with the freezer this machine has: cgroup.freeze where the v2
// hierarchy offers it (kernel 5.2+), else the v1 freezer hierarchy, into
// whose cgroup of the same relative path the tasks are moved first. It
// returns the mechanism used.
func Freeze(path string) (string, error) {
	if _, err := os.Stat(filepath.Join(path, "cgroup.freeze")); err == nil {
		return FreezerV2, cgroupfs.Freeze(path, true)
	}
	return freezeV1(path)
}

// v1Settle bounds how long freezeV1 retries a freeze the kernel left
// FREEZING.
const v1Settle = 3 * time.Second

// freezeV1 freezes through the v1 freezer hierarchy. Two races leave a
// v1 freeze incomplete, and both are retried until the kernel reports
// FROZEN: a task forked between the scan of the v2 subtree and its
// parent's move stays outside the v1 cgroup (it is moved on the next
// pass), and a task that was about to sleep when the freeze was asked
// (a vfork parent waiting for its frozen child) misses it, leaving the
// state FREEZING, which the kernel documents as retried by writing FROZEN
// again (cgroup-v1/freezer-subsystem.rst). On a timeout the cgroup stays
// as frozen as the kernel got it and the error says so.
func freezeV1(path string) (string, error) {
	v1, err := v1Freezer(path)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(v1, 0o755); err != nil {
		return "", fmt.Errorf("freeze %s: %w", path, err)
	}
	deadline := time.Now().Add(v1Settle)
	for {
		if err := moveIntoV1(path, v1); err != nil {
			return "", err
		}
		if err := os.WriteFile(filepath.Join(v1, "freezer.state"), []byte("FROZEN"), 0); err != nil {
			return "", fmt.Errorf("freeze %s: %w", v1, err)
		}
		st, err := os.ReadFile(filepath.Join(v1, "freezer.state"))
		if err != nil {
			return "", fmt.Errorf("freeze %s: %w", v1, err)
		}
		if strings.TrimSpace(string(st)) == "FROZEN" {
			if stray, err := strays(path, v1); err != nil || len(stray) == 0 {
				return FreezerV1, err
			}
		}
		if time.Now().After(deadline) {
			return FreezerV1, fmt.Errorf("freeze %s: %s is %s after %s (some tasks are not frozen)", path, v1, strings.TrimSpace(string(st)), v1Settle)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// moveIntoV1 moves every task of the v2 subtree at path into the v1
// freezer cgroup v1, until a scan finds none left outside.
func moveIntoV1(path, v1 string) error {
	for range 50 {
		stray, err := strays(path, v1)
		if err != nil || len(stray) == 0 {
			return err
		}
		for _, pid := range stray {
			// A task that exited meanwhile is no longer there to freeze.
			if err := cgroupfs.MovePID(v1, pid); err != nil && !errors.Is(err, os.ErrNotExist) && !strings.Contains(err.Error(), "no such process") {
				return err
			}
		}
	}
	return fmt.Errorf("freeze %s: tasks keep appearing outside %s (a fork storm); retry", path, v1)
}

// strays lists the tasks of the v2 subtree at path that are not in the
// v1 freezer cgroup v1.
func strays(path, v1 string) ([]int, error) {
	pids, err := subtreePIDs(path)
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(filepath.Join(v1, "cgroup.procs"))
	if err != nil {
		return nil, fmt.Errorf("freeze %s: %w", path, err)
	}
	in := map[int]bool{}
	for _, f := range strings.Fields(string(data)) {
		if n, err := strconv.Atoi(f); err == nil {
			in[n] = true
		}
	}
	var out []int
	for _, pid := range pids {
		if !in[pid] {
			out = append(out, pid)
		}
	}
	return out, nil
}

// Thaw undoes Freeze on either freezer. On the v1 freezer it also
// removes the cgroups Freeze made there, moving their tasks back to the
// hierarchy's root, even when the sandbox's cgroup2 path is gone.
func Thaw(path string) error {
	if _, err := os.Stat(path); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			if v1, verr := v1Freezer(path); verr == nil {
				if _, serr := os.Stat(v1); serr == nil {
					return thawV1(path)
				}
			}
		}
		return fmt.Errorf("thaw %s: %w", path, err)
	}
	if _, err := os.Stat(filepath.Join(path, "cgroup.freeze")); err == nil {
		return cgroupfs.Freeze(path, false)
	}
	return thawV1(path)
}

func thawV1(path string) error {
	v1, err := v1Freezer(path)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(v1, "freezer.state"), []byte("THAWED"), 0); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("thaw %s: %w", v1, err)
	}
	return dropV1(v1)
}

// dropV1 removes the thawed v1 freezer cgroup v1 and the parents
// freezeV1 created for it, so a freeze leaves nothing behind. Its tasks
// go back to the hierarchy's root, where they were before (the freezer is
// the hierarchy's only controller: moving changes nothing else), unless an
// ancestor is frozen itself (an enclosing sandbox frozen on its own): they
// go into that one and stay frozen, so thawing an inner sandbox never
// thaws what an outer freeze holds. A cgroup that still holds other
// cgroups or tasks (another frozen sandbox below it, a fork during the
// move) stays: the next thaw removes it.
func dropV1(v1 string) error {
	h, err := limits.Detect()
	if err != nil {
		return err
	}
	mnt := filepath.Clean(h.V1["freezer"])
	dest := mnt
	for dir := filepath.Dir(v1); dir != mnt && strings.HasPrefix(dir, mnt+"/"); dir = filepath.Dir(dir) {
		if self, err := os.ReadFile(filepath.Join(dir, "freezer.self_freezing")); err == nil && strings.TrimSpace(string(self)) == "1" {
			dest = dir
			break
		}
	}
	for range 10 {
		pids, err := cgroupfs.Procs(v1)
		if err != nil || len(pids) == 0 {
			break
		}
		for _, pid := range pids {
			if err := cgroupfs.MovePID(dest, pid); err != nil && !errors.Is(err, os.ErrNotExist) && !strings.Contains(err.Error(), "no such process") {
				return fmt.Errorf("thaw %s: %w", v1, err)
			}
		}
	}
	// The leaf may be busy a moment after its last task left; its
	// parents are busy only while in use, and stay then.
	for try := 0; ; try++ {
		err := syscall.Rmdir(v1)
		if err == nil || errors.Is(err, os.ErrNotExist) {
			break
		}
		if !errors.Is(err, syscall.EBUSY) || try == 20 {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Up to the frozen ancestor, which its own thaw removes.
	for dir := filepath.Dir(v1); dir != dest && strings.HasPrefix(dir, mnt+"/"); dir = filepath.Dir(dir) {
		if err := syscall.Rmdir(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
			break
		}
	}
	return nil
}

// Frozen says whether the subtree at path is frozen (v2: cgroup.events
// "frozen 1"; v1: freezer.state FROZEN).
func Frozen(path string) bool {
	if data, err := os.ReadFile(filepath.Join(path, "cgroup.events")); err == nil && strings.Contains(string(data), "frozen") {
		return strings.Contains(string(data), "frozen 1")
	}
	v1, err := v1Freezer(path)
	if err != nil {
		return false
	}
	data, err := os.ReadFile(filepath.Join(v1, "freezer.state"))
	return err == nil && strings.TrimSpace(string(data)) == "FROZEN"
}

// WaitFrozen waits up to d for the kernel to report the subtree frozen
// (freezing completes asynchronously).
func WaitFrozen(path string, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for !Frozen(path) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// v1Freezer maps a cgroup2 path to the v1 freezer cgroup of the same
// relative path.
func v1Freezer(path string) (string, error) {
	h, err := limits.Detect()
	if err != nil {
		return "", err
	}
	mnt, ok := h.V1["freezer"]
	if !ok {
		return "", fmt.Errorf("freeze %s: no cgroup.freeze (cgroup v2 before 5.2) and no v1 freezer hierarchy", path)
	}
	rel := path
	if v2, err := cgroupfs.Mountpoint(); err == nil {
		if r, err := filepath.Rel(v2, path); err == nil && !strings.HasPrefix(r, "..") {
			rel = r
		}
	}
	return filepath.Join(mnt, filepath.Clean("/"+rel)), nil
}

func subtreePIDs(root string) ([]int, error) {
	var out []int
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		data, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
		if err != nil {
			return nil
		}
		for _, f := range strings.Fields(string(data)) {
			if n, err := strconv.Atoi(f); err == nil {
				out = append(out, n)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("freeze %s: %w", root, err)
	}
	return out, nil
}
