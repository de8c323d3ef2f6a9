package canary

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/limits"
	"github.com/watcherhq/watcher/internal/testkit/poll"
)

func sleeperIn(t *testing.T, cg string) *exec.Cmd {
	t.Helper()
	fd, err := os.Open(cg)
	if err != nil {
		t.Fatal(err)
	}
	defer fd.Close()
	cmd := exec.Command("/bin/sh", "-c", "while :; do sleep 0.05; done")
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(fd.Fd())}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd
}

func testCgroup(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates cgroups")
	}
	root, err := cgroupfs.Mountpoint()
	if err != nil {
		t.Skipf("no cgroup v2 hierarchy: %v", err)
	}
	b := make([]byte, 4)
	rand.Read(b)
	cg := filepath.Join(root, "watcher-canary-freeze-"+hex.EncodeToString(b))
	if err := cgroupfs.Create(filepath.Join(cg, "leaf")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		Thaw(cg)
		if err := cgroupfs.Remove(cg); err != nil {
			t.Errorf("remove %s: %v", cg, err)
		}
	})
	return cg
}

// TestFreezeV2: the sandbox subtree is frozen with cgroup.freeze (the
// kernel reports it) and thawed again.
func TestFreezeV2(t *testing.T) {
	cg := testCgroup(t)
	if _, err := os.Stat(filepath.Join(cg, "cgroup.freeze")); err != nil {
		t.Skip("no cgroup.freeze (kernel before 5.2)")
	}
	sleeperIn(t, filepath.Join(cg, "leaf"))
	mech, err := Freeze(cg)
	if err != nil || mech != FreezerV2 {
		t.Fatalf("freeze: %s, %v", mech, err)
	}
	if !WaitFrozen(cg, 10*time.Second) {
		ev, _ := os.ReadFile(filepath.Join(cg, "cgroup.events"))
		t.Fatalf("not frozen: %s", ev)
	}
	if err := Thaw(cg); err != nil {
		t.Fatal(err)
	}
	if Frozen(cg) {
		t.Error("still frozen after thaw")
	}
}

// TestFreezeV1: where the v2 hierarchy has no freezer, the tasks move into
// the v1 freezer cgroup of the same path, which is frozen; this host has
// both, so the v1 path is exercised directly.
func TestFreezeV1(t *testing.T) {
	// The sandbox is cg/leaf: its v1 cgroup has a parent freezeV1 makes.
	sb := filepath.Join(testCgroup(t), "leaf")
	v1, mnt, sl := frozenV1(t, sb, sb)
	var st []byte
	if !poll.Within(10*time.Second, func() bool {
		st, _ = os.ReadFile(filepath.Join(v1, "freezer.state"))
		return strings.TrimSpace(string(st)) == "FROZEN"
	}) {
		t.Fatalf("v1 freezer.state %q", st)
	}
	procs, _ := os.ReadFile(filepath.Join(v1, "cgroup.procs"))
	if !strings.Contains(" "+strings.Join(strings.Fields(string(procs)), " ")+" ", " "+strconv.Itoa(sl.Process.Pid)+" ") {
		t.Fatalf("the sandbox's process %d is not in %s: %q", sl.Process.Pid, v1, procs)
	}
	if err := thawV1(sb); err != nil {
		t.Fatal(err)
	}
	// The thaw leaves no v1 cgroup behind (nor the parents freezeV1
	// made), and the task, back in the hierarchy's root, runs: it dies of
	// a signal, which a frozen task would not until thawed.
	if _, err := os.Stat(v1); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("after thaw %s is still there (%v)", v1, err)
	}
	if p := filepath.Dir(v1); p != mnt {
		if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("after thaw the parent %s is still there (%v)", p, err)
		}
	}
	if own, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", sl.Process.Pid)); !regexp.MustCompile(`(?m)^\d+:freezer:/$`).Match(own) {
		t.Errorf("after thaw the task is not in the freezer root:\n%s", own)
	}
	done := make(chan error, 1)
	go func() { done <- sl.Wait() }()
	sl.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Error("the thawed task did not die of SIGTERM within 10s")
	}
}

// TestThawV1KeepsBusyCgroup: a v1 freezer cgroup that still holds
// another cgroup (a sandbox nested below, frozen on its own) is thawed
// and stays, without an error; the nested one is untouched.
func TestThawV1KeepsBusyCgroup(t *testing.T) {
	cg := testCgroup(t)
	v1, _, _ := frozenV1(t, cg, filepath.Join(cg, "leaf"))
	nested := filepath.Join(v1, "nested")
	if err := os.Mkdir(nested, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cgroupfs.RemoveDir(nested) })
	if err := thawV1(cg); err != nil {
		t.Fatalf("thaw with a nested cgroup: %v", err)
	}
	if st, err := os.ReadFile(filepath.Join(v1, "freezer.state")); err != nil || strings.TrimSpace(string(st)) != "THAWED" {
		t.Errorf("after thaw: %q, %v", st, err)
	}
	if _, err := os.Stat(nested); err != nil {
		t.Errorf("the nested cgroup: %v", err)
	}
}

// TestThawV1InnerKeepsOuterFrozen: a sandbox frozen on its own inside an
// enclosing frozen sandbox is thawed; its tasks go into the enclosing
// frozen cgroup, not the hierarchy's root, so they stay frozen: an
// inner thaw does not undo an outer freeze.
func TestThawV1InnerKeepsOuterFrozen(t *testing.T) {
	cg := testCgroup(t)
	inner := filepath.Join(cg, "leaf")
	outer, mnt, sl := frozenV1(t, cg, inner)
	if _, err := freezeV1(inner); err != nil {
		t.Fatalf("freeze the inner sandbox: %v", err)
	}
	innerV1, _ := v1Freezer(inner)
	removeV1(t, inner, innerV1, mnt, sl)
	if err := thawV1(inner); err != nil {
		t.Fatal(err)
	}
	want := "freezer:/" + strings.TrimPrefix(outer, mnt+"/")
	if own, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", sl.Process.Pid)); !strings.Contains(string(own), want+"\n") {
		t.Errorf("after the inner thaw the task is not in the outer frozen cgroup (%s):\n%s", want, own)
	}
	if st, _ := os.ReadFile(filepath.Join(outer, "freezer.state")); strings.TrimSpace(string(st)) != "FROZEN" {
		t.Errorf("outer freezer.state %q", st)
	}
	done := make(chan error, 1)
	go func() { done <- sl.Wait() }()
	sl.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
		t.Error("a task the outer freeze holds died of SIGTERM: the inner thaw thawed it")
	case <-time.After(500 * time.Millisecond):
	}
	// The benign neighbour: thawing the outer lets it go.
	if err := thawV1(cg); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Error("after the outer thaw the task did not die of SIGTERM within 10s")
	}
}

// frozenV1 starts a sleeper in the cgroup leaf and freezes the sandbox
// cgroup sb through the v1 freezer, skipping where there is none. It
// returns the v1 cgroup, the v1 hierarchy's mount and the sleeper.
func frozenV1(t *testing.T, sb, leaf string) (v1, mnt string, sl *exec.Cmd) {
	t.Helper()
	h, err := limits.Detect()
	if err != nil {
		t.Fatal(err)
	}
	mnt, ok := h.V1["freezer"]
	if !ok {
		t.Skip("no v1 freezer hierarchy on this machine")
	}
	sl = sleeperIn(t, leaf)
	mech, err := freezeV1(sb)
	v1, _ = v1Freezer(sb)
	removeV1(t, sb, v1, filepath.Clean(mnt), sl)
	if err != nil || mech != FreezerV1 {
		t.Fatalf("freeze v1: %s, %v", mech, err)
	}
	return v1, filepath.Clean(mnt), sl
}

// removeV1 removes the test's v1 freezer cgroup at the end: thawed first
// (a frozen task does not die), then the sandbox's command killed and
// waited for, so none of its children is left to fork into it.
func removeV1(t *testing.T, cg, v1, mnt string, cmd *exec.Cmd) {
	t.Cleanup(func() {
		thawV1(cg)
		cmd.Process.Kill()
		cmd.Wait()
		// The thaw removed them; what is left (a failed test) goes here.
		for dir := v1; dir != mnt && strings.HasPrefix(dir, mnt+"/"); dir = filepath.Dir(dir) {
			if err := cgroupfs.RemoveDir(dir); err != nil {
				t.Errorf("remove %s: %v", dir, err)
				break
			}
		}
	})
}

// TestFreezeV1ForkLoop: a sandbox that forks without pause (each child a
// vfork whose parent sleeps until the child execs) is frozen whole: no
// child forked during the move stays outside, and the vfork parent's
// missed freeze is retried.
func TestFreezeV1ForkLoop(t *testing.T) {
	cg := testCgroup(t)
	h, err := limits.Detect()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := h.V1["freezer"]; !ok {
		t.Skip("no v1 freezer hierarchy on this machine")
	}
	fd, err := os.Open(filepath.Join(cg, "leaf"))
	if err != nil {
		t.Fatal(err)
	}
	defer fd.Close()
	cmd := exec.Command("/bin/sh", "-c", "while :; do /bin/true; done")
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(fd.Fd())}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	v1, _ := v1Freezer(cg)
	removeV1(t, cg, v1, filepath.Clean(h.V1["freezer"]), cmd)
	for round := range 20 {
		mech, err := freezeV1(cg)
		if err != nil || mech != FreezerV1 {
			t.Fatalf("round %d: freeze v1: %s, %v", round, mech, err)
		}
		st, _ := os.ReadFile(filepath.Join(v1, "freezer.state"))
		if strings.TrimSpace(string(st)) != "FROZEN" {
			t.Fatalf("round %d: freezer.state %q", round, st)
		}
		if left, err := strays(cg, v1); err != nil || len(left) > 0 {
			t.Fatalf("round %d: tasks of the sandbox outside the frozen cgroup: %v (%v)", round, left, err)
		}
		if err := thawV1(cg); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
