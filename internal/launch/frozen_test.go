package launch_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/cgroupfs/cgroupfstest"
	"github.com/watcherhq/watcher/internal/enforce/enforcetest"
	"github.com/watcherhq/watcher/internal/launch"
	"github.com/watcherhq/watcher/internal/limits"
	"github.com/watcherhq/watcher/internal/testkit/poll"
)

// frozenBound is how long ending a run whose leaf is frozen may take here
// (the launcher's own bounds are 10 s per wait).
const frozenBound = 15 * time.Second

// frozenCommand leaves two sleeps in the leaf, both holding its stdout.
var frozenCommand = []string{"-c", "echo started; sleep 1000 & sleep 1000"}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if !poll.Within(frozenBound, cond) {
		t.Fatalf("%s: not after %v", what, frozenBound)
	}
}

// runningLeaf waits for the one leaf under sandbox to hold the command's
// two sleeps, and returns it with its pids.
func runningLeaf(t *testing.T, sandbox string) (string, []int) {
	t.Helper()
	var leaf string
	var pids []int
	waitUntil(t, "the command's leaf with two sleeps", func() bool {
		leaves, _ := filepath.Glob(filepath.Join(sandbox, "exec-*"))
		if len(leaves) != 1 {
			return false
		}
		leaf = leaves[0]
		pids, _ = cgroupfs.SubtreeProcs(leaf, nil)
		sleeps := 0
		for _, pid := range pids {
			if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); strings.TrimSpace(string(comm)) == "sleep" {
				sleeps++
			}
		}
		return sleeps == 2
	})
	return leaf, pids
}

// neighbour runs a counting loop in a cgroup beside the sandbox; the
// returned function fails unless it still counts.
func neighbour(t *testing.T, sandbox string) func() {
	t.Helper()
	cg := filepath.Join(filepath.Dir(sandbox), "neighbour")
	if err := cgroupfs.Create(cg); err != nil {
		t.Fatal(err)
	}
	count := filepath.Join(t.TempDir(), "count")
	cmd := exec.Command("sh", "-c", `i=0; while :; do i=$((i+1)); echo $i > "$0"; sleep 0.02; done`, count)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
	})
	if err := cgroupfs.MovePID(cg, cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	read := func() int {
		var n int
		for try := 0; try < 10; try++ { // again when between truncation and write
			data, _ := os.ReadFile(count)
			if _, err := fmt.Sscan(string(data), &n); err == nil {
				break
			}
			time.Sleep(time.Millisecond)
		}
		return n
	}
	return func() {
		t.Helper()
		select {
		case <-done:
			t.Fatal("the neighbour ended")
		default:
		}
		at := read()
		// Any progress will do: a loaded host may run it slowly.
		waitUntil(t, "the neighbour counting on", func() bool { return read() > at })
	}
}

// leafGone checks the leaf, its processes and its reaper are gone.
func leafGone(t *testing.T, leaf string, pids []int) {
	t.Helper()
	waitUntil(t, "the leaf removed", func() bool {
		_, err := os.Stat(leaf)
		return errors.Is(err, os.ErrNotExist)
	})
	for _, pid := range pids {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err == nil && !strings.Contains(string(data), ") Z ") {
			t.Errorf("pid %d of the frozen leaf left behind: %s", pid, data)
		}
	}
	waitUntil(t, "the leaf's reaper gone", func() bool { return len(reapersOf(leaf)) == 0 })
}

// reapersOf lists the reaper processes guarding leaf.
func reapersOf(leaf string) []int {
	var out []int
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		cmdline, _ := os.ReadFile(filepath.Join(d, "cmdline"))
		if !bytes.HasPrefix(cmdline, []byte("watcher-launch-reaper\x00")) {
			continue
		}
		env, _ := os.ReadFile(filepath.Join(d, "environ"))
		if bytes.Contains(env, []byte("="+leaf+"\x00")) {
			var pid int
			fmt.Sscan(filepath.Base(d), &pid)
			out = append(out, pid)
		}
	}
	return out
}

// TestCancelKillsFrozenLeaf: a run whose leaf is frozen (by either
// freezer) ends within the bound when its context is canceled (watcher
// exec's SIGTERM), though the leftovers hold the output pipe: the leaf is
// killed, emptied and removed, its reaper exits, and a process beside the
// sandbox keeps running.
func TestCancelKillsFrozenLeaf(t *testing.T) {
	for _, fr := range cgroupfstest.Freezers {
		t.Run(fr, func(t *testing.T) {
			sandbox := enforcetest.Cgroup(t, "frozen")
			stillRuns := neighbour(t, sandbox)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var out bytes.Buffer
			type result struct {
				v   launch.Verdict
				err error
			}
			res := make(chan result, 1)
			go func() {
				v, err := launch.Run(ctx, launch.Config{Path: "/bin/sh", Args: frozenCommand,
					Stdout: &out, Stderr: &out, Sandbox: "test", CgroupParent: sandbox, Label: "frozen",
					Restrictions: launch.Restrictions{Seccomp: launch.DefaultSeccomp()}})
				res <- result{v, err}
			}()
			leaf, pids := runningLeaf(t, sandbox)
			cgroupfstest.Freeze(t, fr, leaf)
			if len(reapersOf(leaf)) != 1 {
				t.Errorf("reapers of %s: %v, want one", leaf, reapersOf(leaf))
			}
			start := time.Now()
			cancel()
			select {
			case r := <-res:
				t.Logf("canceled run with a frozen leaf ended in %v", time.Since(start).Round(time.Millisecond))
				if r.err != nil || r.v.Outcome != launch.OutcomeCanceled {
					t.Errorf("verdict %s, err %v", r.v, r.err)
				}
			case <-time.After(frozenBound):
				t.Fatalf("Run did not return %v after the cancel of a run with a frozen leaf", frozenBound)
			}
			leafGone(t, leaf, pids)
			if !strings.Contains(out.String(), "started") {
				t.Errorf("output %q", out.String())
			}
			stillRuns()
		})
	}
}

const launcherEnv = "WATCHER_TEST_FROZEN_LAUNCHER"

// TestFrozenLauncherHelper is the launcher TestLauncherKilledFrozenLeaf
// kills: one run of frozenCommand in the sandbox it is given, with its
// own stdout, a pipe to the test, as the command's.
func TestFrozenLauncherHelper(t *testing.T) {
	sandbox := os.Getenv(launcherEnv)
	if sandbox == "" {
		t.Skip("helper process mode only")
	}
	launch.Run(context.Background(), launch.Config{Path: "/bin/sh", Args: frozenCommand,
		Stdout: os.Stdout, Stderr: os.Stderr, Sandbox: "test", CgroupParent: sandbox, Label: "frozen",
		Restrictions: launch.Restrictions{Seccomp: launch.DefaultSeccomp()}})
	os.Exit(0)
}

// TestLauncherKilledFrozenLeaf: the launcher (watcher exec) is killed
// with SIGKILL while its command's leaf is frozen by either freezer. The
// leaf's reaper kills the leftovers and removes the leaf, so the caller's
// wait for the launcher's output, which the frozen leftovers hold, ends
// within the bound instead of never; a process beside the sandbox keeps
// running.
func TestLauncherKilledFrozenLeaf(t *testing.T) {
	for _, fr := range cgroupfstest.Freezers {
		t.Run(fr, func(t *testing.T) {
			sandbox := enforcetest.Cgroup(t, "frozen")
			stillRuns := neighbour(t, sandbox)
			launcher := exec.Command(os.Args[0], "-test.run=^TestFrozenLauncherHelper$", "-test.count=1")
			launcher.Env = append(os.Environ(), launcherEnv+"="+sandbox)
			var out bytes.Buffer
			launcher.Stdout, launcher.Stderr = &out, &out
			if err := launcher.Start(); err != nil {
				t.Fatal(err)
			}
			waited := make(chan error, 1)
			go func() { waited <- launcher.Wait() }()
			t.Cleanup(func() {
				launcher.Process.Kill()
				select {
				case <-waited:
				case <-time.After(frozenBound):
					t.Errorf("the killed launcher's wait did not end")
				}
			})
			leaf, pids := runningLeaf(t, sandbox)
			cgroupfstest.Freeze(t, fr, leaf)
			start := time.Now()
			launcher.Process.Kill()
			select {
			case <-waited:
				t.Logf("the caller's wait for the killed launcher ended in %v", time.Since(start).Round(time.Millisecond))
				waited <- nil // for the cleanup
			case <-time.After(frozenBound):
				t.Fatalf("the caller's wait for the killed launcher still blocks after %v (frozen leftovers hold its stdout)", frozenBound)
			}
			leafGone(t, leaf, pids)
			// The leaf's twins in v1 hierarchies went with it.
			if h, err := limits.Detect(); err == nil {
				rel, _ := filepath.Rel(h.V2, leaf)
				for ctrl, mnt := range h.V1 {
					if _, err := os.Stat(filepath.Join(mnt, rel)); err == nil {
						t.Errorf("the leaf's v1 %s cgroup is left", ctrl)
					}
				}
			}
			if !strings.Contains(out.String(), "started") {
				t.Errorf("output %q", out.String())
			}
			stillRuns()
		})
	}
}
