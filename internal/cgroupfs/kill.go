package cgroupfs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Kill sends SIGKILL to every task in the cgroup subtree at path (an
// absolute cgroup2 path), frozen or not, and does not wait (KillWait
// does).
//
//   - cgroup.kill (kernel 5.14+) signals the subtree in one write. A task
//     the cgroup2 freezer (cgroup.freeze) froze dies of it: that freezer
//     lets fatal signals through.
//   - A task the v1 freezer froze (freezer.state FROZEN or FREEZING) keeps
//     the signal pending until it is thawed: Kill moves each such task of
//     the subtree, with the signal pending, to the v1 freezer hierarchy's
//     root. That thaws this task alone (the other tasks of its v1 freezer
//     cgroup stay frozen), and it dies before it runs again.
//   - Without cgroup.kill, each task of the subtree gets SIGKILL (through a
//     pidfd, after checking it is still in the subtree).
//
// After a write to cgroup.kill, tasks later started into the cgroup with
// CLONE_INTO_CGROUP die at once (kernel quirk), so killed cgroups must not
// be reused.
func Kill(path string) error { return kill(path, true) }

// kill is Kill; with useKillFile false it signals task by task, as on a
// kernel without cgroup.kill.
func kill(path string, useKillFile bool) error {
	signalled := false
	if useKillFile {
		f, err := os.OpenFile(filepath.Join(path, "cgroup.kill"), os.O_WRONLY, 0)
		if err == nil {
			_, err = f.Write([]byte("1"))
			f.Close()
		}
		switch {
		case err == nil:
			signalled = true
		case !errors.Is(err, os.ErrNotExist):
			return fmt.Errorf("kill %s: %w", path, err)
		}
	}
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("kill %s: %w", path, err)
	}
	pids, err := SubtreeProcs(path, nil)
	if err != nil {
		return fmt.Errorf("kill: %w", err)
	}
	var fz *v1Freezer
	for i, pid := range pids {
		if !signalled {
			signalTask(path, pid)
		}
		if i == 0 {
			fz = findV1Freezer()
		}
		if fz != nil && fz.frozen(pid) && inSubtree(pid, path) {
			// A task moved in after the cgroup.kill was not signalled by
			// it: signal before the thaw, so it never runs again.
			signalTask(path, pid)
			fz.release(pid)
		}
	}
	return nil
}

// KillWait kills every task of the subtree at path (Kill) and waits up to
// timeout until none is left, killing again every 100 ms meanwhile (a task
// moved in, or frozen by the v1 freezer, while the kill was delivered).
// A cgroup that does not exist is empty. On a timeout the error names the
// tasks left and their state.
func KillWait(path string, timeout time.Duration) error { return killWait(path, timeout, true) }

func killWait(path string, timeout time.Duration, useKillFile bool) error {
	deadline := time.Now().Add(timeout)
	var killErr error
	for {
		killErr = kill(path, useKillFile)
		if errors.Is(killErr, os.ErrNotExist) {
			return nil
		}
		again := time.Now().Add(100 * time.Millisecond)
		for {
			if Empty(path) {
				return nil
			}
			if time.Now().After(deadline) {
				err := fmt.Errorf("kill %s: tasks left after %v: %s", path, timeout, describeTasks(path))
				return errors.Join(err, killErr)
			}
			if time.Now().After(again) {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// Empty reports whether no task is left in the cgroup subtree at path (a
// cgroup that does not exist is empty). A task counts until it has exited,
// not until it is reaped.
func Empty(path string) bool {
	data, err := os.ReadFile(filepath.Join(path, "cgroup.events"))
	if errors.Is(err, os.ErrNotExist) {
		if _, serr := os.Stat(path); errors.Is(serr, os.ErrNotExist) {
			return true
		}
	}
	if err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, "populated "); ok {
				return strings.TrimSpace(v) == "0"
			}
		}
	}
	pids, err := SubtreeProcs(path, nil)
	return err == nil && len(pids) == 0
}

// signalTask sends SIGKILL to pid if it is (still) in the subtree at root:
// through a pidfd, so a pid that was reused after the task left is not
// signalled.
func signalTask(root string, pid int) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		if errors.Is(err, unix.ENOSYS) && inSubtree(pid, root) {
			unix.Kill(pid, unix.SIGKILL) // kernel before 5.3
		}
		return
	}
	defer unix.Close(fd)
	if inSubtree(pid, root) {
		unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
	}
}

// inSubtree reports whether pid's cgroup2 cgroup is root or below it.
func inSubtree(pid int, root string) bool {
	mnt, err := Mountpoint()
	if err != nil {
		return false
	}
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rel, ok := strings.CutPrefix(line, "0::"); ok {
			p := filepath.Join(mnt, rel)
			root = filepath.Clean(root)
			return p == root || strings.HasPrefix(p, root+"/")
		}
	}
	return false
}

// v1Freezer is the cgroup v1 freezer hierarchy of a hybrid host.
type v1Freezer struct{ mount string }

// findV1Freezer returns the v1 freezer hierarchy, or nil when none is
// mounted.
func findV1Freezer() *v1Freezer {
	mounts, err := ReadMountinfo("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	for _, m := range mounts {
		if m.FSType != "cgroup" || m.Root != "/" {
			continue
		}
		for _, o := range strings.Split(m.SuperOptions, ",") {
			if o == "freezer" {
				return &v1Freezer{mount: m.Point}
			}
		}
	}
	return nil
}

// freezerCgroupOf returns the path of the task's v1 freezer cgroup ("" when it
// is not in the hierarchy) from a /proc/.../cgroup file.
func freezerCgroupOf(file string) string {
	data, err := os.ReadFile(file)
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(data), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == "freezer" {
				return parts[2]
			}
		}
	}
	return ""
}

// state returns freezer.state of a v1 freezer cgroup ("THAWED" for the
// root, which has none).
func (f *v1Freezer) state(rel string) string {
	if rel == "" || rel == "/" {
		return "THAWED"
	}
	data, err := os.ReadFile(filepath.Join(f.mount, filepath.Clean("/"+rel), "freezer.state"))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(data))
}

// frozen reports whether any thread of pid is in a v1 freezer cgroup that
// is FROZEN or FREEZING.
func (f *v1Freezer) frozen(pid int) bool {
	dir := "/proc/" + strconv.Itoa(pid) + "/task"
	tids, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, t := range tids {
		if rel := freezerCgroupOf(filepath.Join(dir, t.Name(), "cgroup")); rel != "" {
			if s := f.state(rel); s == "FROZEN" || s == "FREEZING" {
				return true
			}
		}
	}
	return false
}

// release moves the process (all its threads) to the freezer hierarchy's
// root, which is never frozen: that thaws it.
func (f *v1Freezer) release(pid int) {
	err := os.WriteFile(filepath.Join(f.mount, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0)
	if err != nil && !errors.Is(err, syscall.ESRCH) {
		// Threads placed one by one elsewhere: move each.
		tids, _ := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
		for _, t := range tids {
			os.WriteFile(filepath.Join(f.mount, "tasks"), []byte(t.Name()), 0)
		}
	}
}

// describeTasks says which tasks are left in the subtree and why they may
// not have died, for an error.
func describeTasks(path string) string {
	pids, err := SubtreeProcs(path, nil)
	if err != nil {
		return err.Error()
	}
	fz := findV1Freezer()
	var out []string
	for i, pid := range pids {
		if i == 5 {
			out = append(out, fmt.Sprintf("and %d more", len(pids)-i))
			break
		}
		desc := "pid " + strconv.Itoa(pid)
		if data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); err == nil {
			// pid (comm) state ...
			s := string(data)
			if l, r := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')'); l >= 0 && r > l && r+3 <= len(s) {
				desc += fmt.Sprintf(" %s state %s", s[l+1:r], s[r+2:r+3])
			}
		}
		if fz != nil {
			if rel := freezerCgroupOf("/proc/" + strconv.Itoa(pid) + "/cgroup"); rel != "" && rel != "/" {
				desc += fmt.Sprintf(" (v1 freezer %s %s)", rel, fz.state(rel))
			}
		}
		out = append(out, desc)
	}
	if len(out) == 0 {
		return "none listed (still exiting)"
	}
	return strings.Join(out, ", ")
}
