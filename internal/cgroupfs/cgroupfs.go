// Package cgroupfs finds the cgroup v2 hierarchy and manipulates cgroups in
// it: ids, leaf creation and removal, moving, freezing and killing.
//
// The mount point is discovered from /proc/self/mountinfo, never assumed:
// production hosts mount cgroup2 at /sys/fs/cgroup, hybrid hosts at
// /sys/fs/cgroup/unified.
package cgroupfs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ErrNoCgroup2 is returned when no cgroup2 filesystem is mounted.
var ErrNoCgroup2 = errors.New("no cgroup2 filesystem mounted")

var (
	mountOnce sync.Once
	mountPath string
	mountErr  error
)

// Mountpoint returns where the cgroup v2 hierarchy is mounted.
func Mountpoint() (string, error) {
	mountOnce.Do(func() { mountPath, mountErr = findMount("/proc/self/mountinfo") })
	return mountPath, mountErr
}

func findMount(mountinfo string) (string, error) {
	mounts, err := ReadMountinfo(mountinfo)
	if err != nil {
		return "", err
	}
	var found []string
	for _, m := range mounts {
		if m.FSType == "cgroup2" {
			found = append(found, m.Point)
		}
	}
	if len(found) == 0 {
		return "", ErrNoCgroup2
	}
	// Prefer the canonical location when the hierarchy is mounted twice.
	for _, p := range found {
		if p == "/sys/fs/cgroup" {
			return p, nil
		}
	}
	return found[0], nil
}

// UnescapeMount undoes mountinfo's octal escapes (\040 for space).
func UnescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// ID returns the cgroup v2 id of the cgroup directory at path: its inode
// number, which is what bpf_get_current_cgroup_id reports.
func ID(path string) (uint64, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return 0, fmt.Errorf("cgroup id of %s: %w", path, err)
	}
	return st.Ino, nil
}

// Abs turns a cgroup path relative to the hierarchy root (e.g.
// "/system.slice/docker-1.scope") into a filesystem path.
func Abs(rel string) (string, error) {
	root, err := Mountpoint()
	if err != nil {
		return "", err
	}
	if strings.HasPrefix(rel, root+"/") || rel == root {
		return rel, nil
	}
	return filepath.Join(root, filepath.Clean("/"+rel)), nil
}

// Create makes the cgroup directory (and parents) at the absolute path.
func Create(path string) error {
	if err := os.MkdirAll(path, 0o755); err != nil {
		return fmt.Errorf("create cgroup: %w", err)
	}
	return nil
}

// MovePID moves a process into the cgroup.
func MovePID(path string, pid int) error {
	if err := os.WriteFile(filepath.Join(path, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
		return fmt.Errorf("move pid %d to %s: %w", pid, path, err)
	}
	return nil
}

// Procs lists the pids in the cgroup itself (not its descendants).
func Procs(path string) ([]int, error) {
	data, err := os.ReadFile(filepath.Join(path, "cgroup.procs"))
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", path, err)
	}
	var pids []int
	for _, f := range strings.Fields(string(data)) {
		if p, err := strconv.Atoi(f); err == nil {
			pids = append(pids, p)
		}
	}
	return pids, nil
}

// SubtreeProcs lists the pids in the cgroup at path and every cgroup
// below it. Cgroups that vanish during the walk are skipped; skip, when
// set, leaves out descendants (with their subtrees) by directory name.
func SubtreeProcs(path string, skip func(name string) bool) ([]int, error) {
	var pids []int
	err := filepath.WalkDir(path, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			if p == path {
				return err
			}
			return filepath.SkipDir // removed while walking
		}
		if !d.IsDir() {
			return nil
		}
		if p != path && skip != nil && skip(d.Name()) {
			return filepath.SkipDir
		}
		more, err := Procs(p)
		if err == nil {
			pids = append(pids, more...)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("processes of %s: %w", path, err)
	}
	return pids, nil
}

// Freeze freezes (true) or thaws (false) every task in the cgroup subtree.
func Freeze(path string, frozen bool) error {
	v := "0"
	if frozen {
		v = "1"
	}
	if err := os.WriteFile(filepath.Join(path, "cgroup.freeze"), []byte(v), 0); err != nil {
		return fmt.Errorf("freeze %s: %w", path, err)
	}
	return nil
}

// removeWait bounds how long Remove waits for the killed tasks to go.
const removeWait = 5 * time.Second

// Remove kills what is left in the cgroup subtree (frozen or not: Kill)
// and removes it, deepest first. It waits up to 5 s for the killed tasks
// to leave, and fails saying which are left rather than wait longer.
func Remove(path string) error {
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err := KillWait(path, removeWait); err != nil {
		return fmt.Errorf("remove cgroup: %w", err)
	}
	var dirs []string
	err := filepath.WalkDir(path, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			if p != path && errors.Is(err, os.ErrNotExist) {
				return nil // a child removed meanwhile (a launcher's leaf)
			}
			return err
		}
		if d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("remove cgroup %s: %w", path, err)
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		if rmErr := RemoveDir(dirs[i]); rmErr != nil {
			return fmt.Errorf("remove cgroup %s: %w", dirs[i], rmErr)
		}
	}
	return nil
}
