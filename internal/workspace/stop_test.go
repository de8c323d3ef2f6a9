package workspace

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
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

// TestStopFrozen: Stop empties a sandbox cgroup whose processes are
// frozen, by the cgroup2 freezer or by the v1 one (whose SIGKILL waits
// for a thaw), within its timeout, and leaves a process of another cgroup
// running.
func TestStopFrozen(t *testing.T) {
	for _, freezer := range cgroupfstest.Freezers {
		t.Run(freezer, func(t *testing.T) {
			needRoot(t)
			mnt, err := cgroupfs.Mountpoint()
			if err != nil {
				t.Skipf("no cgroup v2 hierarchy: %v", err)
			}
			b := make([]byte, 4)
			rand.Read(b)
			rel := "/watcher-test-stop-" + hex.EncodeToString(b)
			root := filepath.Join(mnt, rel)
			sandbox, other := filepath.Join(root, "sandbox"), filepath.Join(root, "other")
			for _, cg := range []string{sandbox, other} {
				if err := cgroupfs.Create(cg); err != nil {
					t.Fatal(err)
				}
			}
			t.Cleanup(func() {
				if err := cgroupfs.Remove(root); err != nil {
					t.Errorf("remove %s: %v", root, err)
				}
			})
			start := func(cg string) (*exec.Cmd, chan struct{}) {
				dir, err := os.Open(cg)
				if err != nil {
					t.Fatal(err)
				}
				defer dir.Close()
				cmd := exec.Command("sh", "-c", "sleep 1000 & exec sleep 1000")
				// Started in the cgroup (CLONE_INTO_CGROUP): the
				// background sleep too.
				cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(dir.Fd())}
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				done := make(chan struct{})
				go func() { cmd.Wait(); close(done) }()
				t.Cleanup(func() {
					cmd.Process.Kill()
					select {
					case <-done:
					case <-time.After(10 * time.Second):
						t.Errorf("pid %d did not end", cmd.Process.Pid)
					}
				})
				return cmd, done
			}
			start(sandbox)
			neighbour, neighbourDone := start(other)
			for try := 0; ; try++ {
				if pids, _ := cgroupfs.SubtreeProcs(sandbox, nil); len(pids) == 2 {
					break
				}
				if try == 500 {
					t.Fatal("the sandbox's two sleeps did not start")
				}
				time.Sleep(10 * time.Millisecond)
			}

			cgroupfstest.Freeze(t, freezer, sandbox)

			t0 := time.Now()
			n, err := Stop([]string{sandbox, filepath.Join(root, "missing")}, 5*time.Second)
			if err != nil || n != 1 {
				t.Fatalf("Stop: %d stopped, %v", n, err)
			}
			t.Logf("frozen sandbox stopped in %v", time.Since(t0).Round(time.Millisecond))
			if !cgroupfs.Empty(sandbox) {
				t.Errorf("sandbox not empty after Stop")
			}
			select {
			case <-neighbourDone:
				t.Errorf("the process of the other cgroup ended")
			default:
				if data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", neighbour.Process.Pid)); err != nil || strings.Contains(string(data), ") Z ") {
					t.Errorf("the process of the other cgroup: %s %v", data, err)
				}
			}
		})
	}
}
