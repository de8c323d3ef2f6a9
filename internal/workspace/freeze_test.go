package workspace

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/cgroupfs/cgroupfstest"
)

// sandboxCgroup makes a cgroup2 directory for a test, removed (and
// emptied) at cleanup.
func sandboxCgroup(t *testing.T) string {
	t.Helper()
	mnt, err := cgroupfs.Mountpoint()
	if err != nil {
		t.Skipf("no cgroup v2 hierarchy: %v", err)
	}
	b := make([]byte, 4)
	rand.Read(b)
	cg := filepath.Join(mnt, "watcher-test-snapfreeze-"+hex.EncodeToString(b))
	must(t, cgroupfs.Create(cg))
	t.Cleanup(func() {
		cgroupfs.Freeze(cg, false)
		if err := cgroupfs.Remove(cg); err != nil {
			t.Errorf("remove %s: %v", cg, err)
		}
	})
	return cg
}

// startIn starts sh -c script in the cgroup (scripts use builtins only:
// the v1 freezer test moves the processes, and a child exiting meanwhile
// fails the move).
func startIn(t *testing.T, cg, script string) {
	t.Helper()
	dir, err := os.Open(cg)
	must(t, err)
	defer dir.Close()
	cmd := exec.Command("sh", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(dir.Fd())}
	must(t, cmd.Start())
	go cmd.Wait()
}

func readTrim(p string) string {
	b, _ := os.ReadFile(p)
	return strings.TrimSpace(string(b))
}

// counterMoves reports whether the looping writer still writes.
func counterMoves(p string) bool {
	a := readTrim(p)
	for i := 0; i < 100; i++ {
		time.Sleep(10 * time.Millisecond)
		if b := readTrim(p); b != a && b != "" {
			return true
		}
	}
	return false
}

// TestSnapshotFreezesTheSandbox: a snapshot of a sandbox whose process
// writes in the workspace nonstop is taken with the sandbox frozen (by
// the cgroup2 freezer; or already by the v1 one, which it accepts) and
// the sandbox runs again after, unless it was frozen before.
func TestSnapshotFreezesTheSandbox(t *testing.T) {
	for _, pre := range []string{"running", "cgroup2", "v1"} {
		t.Run(pre, func(t *testing.T) {
			_, w := fixture(t)
			cg := sandboxCgroup(t)
			counter := filepath.Join(w.Layers[0].Merged, "counter")
			startIn(t, cg, "i=0; while :; do i=$((i+1)); echo $i > "+counter+"; done")
			cgroupfstest.WaitUntil(t, "the writer started", func() bool { return readTrim(counter) != "" })
			if pre != "running" {
				cgroupfstest.Freeze(t, pre, cg)
			}
			s, _, err := w.Snapshot(context.Background(), "live", SnapshotLimits{}, []string{cg})
			if err != nil {
				t.Fatalf("snapshot: %v", err)
			}
			if s.Changes == 0 {
				t.Error("snapshot saw no changes")
			}
			if _, err := os.Stat(filepath.Join(w.snapDir("live"), w.Layers[0].ID, "counter")); err != nil {
				t.Errorf("the snapshot has no counter: %v", err)
			}
			switch pre {
			case "running":
				if readTrim(filepath.Join(cg, "cgroup.freeze")) != "0" || !counterMoves(counter) {
					t.Error("the sandbox was not thawed after the snapshot")
				}
			case "cgroup2":
				if readTrim(filepath.Join(cg, "cgroup.freeze")) != "1" || counterMoves(counter) {
					t.Error("a sandbox frozen before the snapshot was thawed by it")
				}
			case "v1":
				if counterMoves(counter) {
					t.Error("a sandbox frozen by the v1 freezer runs after the snapshot")
				}
			}
		})
	}
}

// TestSnapshotRefusesUnfrozen: a sandbox with a process that does not
// freeze in time (blocked in the kernel on a frozen filesystem) and a
// cgroup that cannot be frozen (the hierarchy's root) get no snapshot,
// with ErrNotFrozen, and the sandbox is thawed again.
func TestSnapshotRefusesUnfrozen(t *testing.T) {
	t.Run("root", func(t *testing.T) {
		_, w := fixture(t)
		mnt, err := cgroupfs.Mountpoint()
		if err != nil {
			t.Skipf("no cgroup v2 hierarchy: %v", err)
		}
		_, _, err = w.Snapshot(context.Background(), "s", SnapshotLimits{}, []string{mnt})
		if !errors.Is(err, ErrNotFrozen) {
			t.Fatalf("snapshot with the root cgroup: %v, want ErrNotFrozen", err)
		}
		if _, err := os.Stat(w.snapDir("s")); err == nil {
			t.Error("a snapshot was taken")
		}
	})
	t.Run("blocked", func(t *testing.T) {
		_, w := fixture(t)
		for _, tool := range []string{"mkfs.ext4", "fsfreeze", "mount"} {
			if _, err := exec.LookPath(tool); err != nil {
				t.Skipf("%s missing: needed to block a process where no freezer reaches it", tool)
			}
		}
		cg := sandboxCgroup(t)
		dir := t.TempDir()
		img, mnt := filepath.Join(dir, "img"), filepath.Join(dir, "mnt")
		must(t, os.Mkdir(mnt, 0o755))
		if out, err := exec.Command("sh", "-c", "truncate -s 32M "+img+" && mkfs.ext4 -q "+img+" && mount -o loop "+img+" "+mnt).CombinedOutput(); err != nil {
			t.Skipf("no loop-mounted ext4 to freeze: %v: %s", err, out)
		}
		t.Cleanup(func() { exec.Command("umount", "-l", mnt).Run() })
		must(t, exec.Command("fsfreeze", "-f", mnt).Run())
		t.Cleanup(func() { exec.Command("fsfreeze", "-u", mnt).Run() })
		// The writer waits in the kernel (D state) for the filesystem to
		// thaw: the cgroup2 freezer cannot stop it there.
		startIn(t, cg, "echo x > "+mnt+"/f")
		cgroupfstest.WaitUntil(t, "the writer blocked", func() bool { return !cgroupfs.Empty(cg) })
		time.Sleep(200 * time.Millisecond)
		_, _, err := w.Snapshot(context.Background(), "s", SnapshotLimits{}, []string{cg})
		if !errors.Is(err, ErrNotFrozen) || !strings.Contains(err.Error(), "no snapshot taken") {
			t.Fatalf("snapshot of a sandbox that does not freeze: %v, want ErrNotFrozen", err)
		}
		if _, err := os.Stat(w.snapDir("s")); err == nil {
			t.Error("a snapshot was taken")
		}
		if readTrim(filepath.Join(cg, "cgroup.freeze")) != "0" {
			t.Error("the failed snapshot left the sandbox frozen")
		}
		// The neighbour: with the filesystem thawed the writer finishes
		// and the snapshot is taken.
		must(t, exec.Command("fsfreeze", "-u", mnt).Run())
		cgroupfstest.WaitUntil(t, "the writer done", func() bool { return cgroupfs.Empty(cg) })
		if _, _, err := w.Snapshot(context.Background(), "s", SnapshotLimits{}, []string{cg}); err != nil {
			t.Fatalf("snapshot: %v", err)
		}
	})
}
