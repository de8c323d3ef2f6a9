package cgroupfs

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/testkit/poll"
)

// killBound is how long a kill of a frozen cgroup may take in these tests.
const killBound = 5 * time.Second

// testRoot makes a fresh cgroup2 directory for a test, removed at cleanup.
func testRoot(t *testing.T) (root, rel string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates cgroups")
	}
	mnt, err := Mountpoint()
	if err != nil {
		t.Skipf("no cgroup v2 hierarchy: %v", err)
	}
	b := make([]byte, 4)
	rand.Read(b)
	rel = "/watcher-test-kill-" + hex.EncodeToString(b)
	root = filepath.Join(mnt, rel)
	if err := Create(root); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := Remove(root); err != nil {
			t.Errorf("remove %s: %v", root, err)
		}
	})
	return root, rel
}

// proc is a test process and its exit, collected by one goroutine.
type proc struct {
	cmd  *exec.Cmd
	done chan error
}

// startIn starts a command directly in the cgroup (CLONE_INTO_CGROUP).
// Cleanup kills it, frozen or not, and fails rather than wait for ever.
func startIn(t *testing.T, cg string, args ...string) *proc {
	t.Helper()
	dir, err := os.Open(cg)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	cmd := exec.Command(args[0], args[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(dir.Fd())}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %v in %s: %v", args, cg, err)
	}
	p := &proc{cmd: cmd, done: make(chan error, 1)}
	go func() { p.done <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		select {
		case <-p.done:
		case <-time.After(killBound):
			t.Errorf("pid %d (%v) did not end after SIGKILL", cmd.Process.Pid, args)
		}
	})
	return p
}

func procState(pid int) string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "gone"
	}
	s := string(data)
	r := strings.LastIndexByte(s, ')')
	return s[r+2 : r+3]
}

// TestKillFrozen: a leaf whose tasks (one of them in a nested cgroup) are
// frozen by the cgroup2 freezer, the v1 freezer, or both, is emptied by
// KillWait within the bound, with cgroup.kill and task by task (kernels
// without it). An unfrozen neighbour in the same parent keeps running; a
// bystander frozen in the same v1 freezer cgroup stays frozen (only the
// leaf's tasks are thawed, to die).
func TestKillFrozen(t *testing.T) {
	for _, fr := range []struct {
		name   string
		v2, v1 bool
	}{{"cgroup2", true, false}, {"v1", false, true}, {"both", true, true}} {
		for _, useKillFile := range []bool{true, false} {
			name := fr.name + "/cgroup.kill"
			if !useKillFile {
				name = fr.name + "/per-task"
			}
			t.Run(name, func(t *testing.T) { testKillFrozen(t, fr.v2, fr.v1, useKillFile) })
		}
	}
}

func testKillFrozen(t *testing.T, v2, v1, useKillFile bool) {
	root, rel := testRoot(t)
	var fz *v1Freezer
	if v1 {
		if fz = findV1Freezer(); fz == nil {
			t.Skip("no v1 freezer hierarchy here (a pure cgroup2 host): the v1 path is tested on hybrid hosts")
		}
	}
	leaf, other := filepath.Join(root, "leaf"), filepath.Join(root, "neighbour")
	inner := filepath.Join(leaf, "inner")
	for _, cg := range []string{leaf, inner, other} {
		if err := Create(cg); err != nil {
			t.Fatal(err)
		}
	}
	if v2 {
		if _, err := os.Stat(filepath.Join(leaf, "cgroup.freeze")); err != nil {
			t.Skipf("no cgroup.freeze (kernel before 5.2): %v", err)
		}
	}
	if useKillFile {
		if _, err := os.Stat(filepath.Join(leaf, "cgroup.kill")); err != nil {
			t.Skipf("no cgroup.kill (kernel before 5.14): %v", err)
		}
	}

	victims := []*proc{
		startIn(t, leaf, "sh", "-c", "sleep 1000 & exec sleep 1000"),
		startIn(t, inner, "sleep", "1000"),
	}
	// The neighbour counts in a file: it must keep counting.
	counter := filepath.Join(t.TempDir(), "count")
	neighbour := startIn(t, other, "sh", "-c", `i=0; while :; do i=$((i+1)); echo $i > "$0"; sleep 0.02; done`, counter)
	if !poll.Within(killBound, func() bool { p, _ := SubtreeProcs(leaf, nil); return len(p) == 3 }) {
		p, _ := SubtreeProcs(leaf, nil)
		t.Fatalf("leaf has %v, want 3 tasks", p)
	}
	pids, _ := SubtreeProcs(leaf, nil)

	if v2 {
		if err := Freeze(leaf, true); err != nil {
			t.Fatal(err)
		}
		if !poll.Within(killBound, func() bool {
			data, _ := os.ReadFile(filepath.Join(leaf, "cgroup.events"))
			return strings.Contains(string(data), "frozen 1")
		}) {
			t.Fatal("the leaf did not freeze")
		}
	}
	var v1cg string
	var bystander *proc
	if v1 {
		v1cg = filepath.Join(fz.mount, rel, "frozen")
		if err := os.MkdirAll(v1cg, 0o755); err != nil {
			t.Fatal(err)
		}
		// A bystander outside the leaf shares the v1 freezer cgroup.
		bystanderCg := filepath.Join(root, "bystander")
		if err := Create(bystanderCg); err != nil {
			t.Fatal(err)
		}
		bystander = startIn(t, bystanderCg, "sleep", "1000")
		// Runs before the processes' own cleanups: thaw, so their
		// SIGKILL works, and kill what is left in the freezer cgroup.
		t.Cleanup(func() {
			os.WriteFile(filepath.Join(v1cg, "freezer.state"), []byte("THAWED"), 0)
			if !poll.Within(killBound, func() bool {
				data, _ := os.ReadFile(filepath.Join(v1cg, "cgroup.procs"))
				for _, f := range strings.Fields(string(data)) {
					var pid int
					fmt.Sscan(f, &pid)
					syscall.Kill(pid, syscall.SIGKILL)
				}
				return syscall.Rmdir(v1cg) == nil
			}) {
				t.Errorf("rmdir %s: still busy", v1cg)
			}
			syscall.Rmdir(filepath.Dir(v1cg))
		})
		for _, pid := range append(pids, bystander.cmd.Process.Pid) {
			if err := os.WriteFile(filepath.Join(v1cg, "cgroup.procs"), []byte(fmt.Sprint(pid)), 0); err != nil {
				t.Fatalf("move %d into %s: %v", pid, v1cg, err)
			}
		}
		if err := os.WriteFile(filepath.Join(v1cg, "freezer.state"), []byte("FROZEN"), 0); err != nil {
			t.Fatal(err)
		}
		// Tasks the cgroup2 freezer holds may keep it FREEZING.
		if !poll.Within(killBound, func() bool { st := fz.state(rel + "/frozen"); return st == "FROZEN" || v2 && st == "FREEZING" }) {
			t.Fatalf("v1 freezer state %q", fz.state(rel+"/frozen"))
		}
	}
	if v1 && !v2 && useKillFile {
		// The kernel fact behind Kill's v1 step: cgroup.kill alone leaves
		// v1-frozen tasks in place with the signal pending.
		os.WriteFile(filepath.Join(leaf, "cgroup.kill"), []byte("1"), 0)
		time.Sleep(300 * time.Millisecond)
		if Empty(leaf) {
			t.Log("this kernel delivered SIGKILL to v1-frozen tasks without a thaw")
		} else {
			t.Logf("after cgroup.kill alone the v1-frozen leaf still holds %s", describeTasks(leaf))
		}
	}
	before := readCount(counter)

	start := time.Now()
	if err := killWait(leaf, killBound, useKillFile); err != nil {
		t.Fatalf("KillWait: %v", err)
	}
	took := time.Since(start)
	t.Logf("frozen leaf emptied in %v", took.Round(time.Millisecond))
	if !Empty(leaf) {
		t.Fatalf("leaf not empty: %s", describeTasks(leaf))
	}
	for _, v := range victims {
		select {
		case err := <-v.done:
			if ws, ok := v.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
				t.Errorf("pid %d ended with %v, want SIGKILL", v.cmd.Process.Pid, err)
			}
			v.done <- err // for the cleanup
		case <-time.After(killBound):
			t.Fatalf("pid %d not reaped after the leaf emptied", v.cmd.Process.Pid)
		}
	}
	for _, pid := range pids {
		if s := procState(pid); s != "gone" && s != "Z" { // Z: exited, not yet reaped
			t.Errorf("pid %d of the leaf still there (state %s)", pid, s)
		}
	}
	// Empty, unfrozen or not: the leaf can go.
	if err := Remove(leaf); err != nil {
		t.Errorf("remove the killed leaf: %v", err)
	}

	// The neighbour kept running and counting.
	select {
	case err := <-neighbour.done:
		t.Fatalf("the neighbour ended: %v", err)
	default:
	}
	// Any progress will do: a loaded host may run it slowly.
	if !poll.Within(3*killBound, func() bool { return readCount(counter) > before }) {
		pid := neighbour.cmd.Process.Pid
		cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		children, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
		var kids []string
		for _, c := range strings.Fields(string(children)) {
			var k int
			fmt.Sscan(c, &k)
			kids = append(kids, c+":"+procState(k))
		}
		t.Errorf("the neighbour stopped counting at %d (state %s, children %v, cgroups %q)", readCount(counter), procState(pid), kids, cg)
	}
	if v1 {
		// Only the leaf's tasks were thawed.
		if s := fz.state(rel + "/frozen"); s != "FROZEN" && s != "FREEZING" {
			t.Errorf("the shared v1 freezer cgroup is %s, want it still frozen", s)
		}
		if s := procState(bystander.cmd.Process.Pid); s == "gone" || s == "Z" {
			t.Errorf("the frozen bystander is %s", s)
		}
		if !bystander.frozen(fz) {
			t.Errorf("the bystander is no longer in a frozen v1 freezer cgroup")
		}
	}
}

func (p *proc) frozen(fz *v1Freezer) bool { return fz.frozen(p.cmd.Process.Pid) }

// readCount reads the neighbour's count (again, when caught between the
// shell's truncation and its write).
func readCount(file string) int {
	var n int
	for try := 0; try < 10; try++ {
		data, _ := os.ReadFile(file)
		if _, err := fmt.Sscan(string(data), &n); err == nil {
			break
		}
		time.Sleep(time.Millisecond)
	}
	return n
}

// TestKillWaitGone: a cgroup that does not exist is empty; Kill says it
// is not there.
func TestKillWaitGone(t *testing.T) {
	root, _ := testRoot(t)
	gone := filepath.Join(root, "never-made")
	if err := KillWait(gone, time.Second); err != nil {
		t.Errorf("KillWait of a missing cgroup: %v", err)
	}
	if err := Kill(gone); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Kill of a missing cgroup: %v", err)
	}
	if !Empty(gone) {
		t.Error("a missing cgroup is not empty")
	}
}
