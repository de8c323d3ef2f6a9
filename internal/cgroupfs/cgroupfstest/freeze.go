// Package cgroupfstest freezes cgroups for tests, with the cgroup2
// freezer or the v1 one (hybrid hosts), the two a kill must get through.
package cgroupfstest

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/limits"
)

// Freezers names the freezers Freeze knows.
var Freezers = []string{"cgroup2", "v1"}

// bound is how long freezing, and undoing it at cleanup, may take.
const bound = 15 * time.Second

// Freeze freezes every task of cgroup cg (a cgroup2 directory) with the
// cgroup2 freezer or the v1 one, and waits until the kernel says frozen.
// For v1 the tasks move into the v1 freezer cgroup of cg's relative path,
// as the canary's v1 freeze does; cleanup thaws it, kills what is left in
// it and removes it. It skips where this host has no such freezer.
func Freeze(t testing.TB, freezer, cg string) {
	t.Helper()
	switch freezer {
	case "cgroup2":
		if _, err := os.Stat(filepath.Join(cg, "cgroup.freeze")); err != nil {
			t.Skipf("no cgroup2 freezer (kernel before 5.2): %v", err)
		}
		if err := cgroupfs.Freeze(cg, true); err != nil {
			t.Fatal(err)
		}
		WaitUntil(t, "the cgroup frozen", func() bool {
			data, _ := os.ReadFile(filepath.Join(cg, "cgroup.events"))
			return strings.Contains(string(data), "frozen 1")
		})
	case "v1":
		h, err := limits.Detect()
		if err != nil {
			t.Fatal(err)
		}
		mnt, ok := h.V1["freezer"]
		if !ok {
			t.Skip("no v1 freezer hierarchy (a pure cgroup2 host): the v1 path is tested on hybrid hosts")
		}
		rel, err := filepath.Rel(h.V2, cg)
		if err != nil || strings.HasPrefix(rel, "..") {
			t.Fatalf("%s is not below the cgroup2 mount %s", cg, h.V2)
		}
		dir := filepath.Join(mnt, rel)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			// Only if the test failed is anything left to thaw and kill.
			os.WriteFile(filepath.Join(dir, "freezer.state"), []byte("THAWED"), 0)
			WaitUntil(t, "the v1 freezer cgroup removed", func() bool {
				pids, _ := cgroupfs.SubtreeProcs(dir, nil)
				for _, pid := range pids {
					syscall.Kill(pid, syscall.SIGKILL)
				}
				err := syscall.Rmdir(dir)
				return err == nil || errors.Is(err, syscall.ENOENT)
			})
			// The parents MkdirAll made, where empty.
			for p := filepath.Dir(dir); p != mnt && strings.HasPrefix(p, mnt+"/"); p = filepath.Dir(p) {
				if syscall.Rmdir(p) != nil {
					break
				}
			}
		})
		pids, _ := cgroupfs.SubtreeProcs(cg, nil)
		for _, pid := range pids {
			if err := cgroupfs.MovePID(dir, pid); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, "freezer.state"), []byte("FROZEN"), 0); err != nil {
			t.Fatal(err)
		}
		WaitUntil(t, "the cgroup frozen (v1)", func() bool {
			data, _ := os.ReadFile(filepath.Join(dir, "freezer.state"))
			return strings.TrimSpace(string(data)) == "FROZEN"
		})
	default:
		t.Fatalf("unknown freezer %q (want one of %v)", freezer, Freezers)
	}
}

// WaitUntil polls cond every 10 ms and fails the test when it is still
// false after 15 s.
func WaitUntil(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(bound); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %v", what, bound)
		}
	}
}
