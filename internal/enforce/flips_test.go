package enforce_test

import (
	"os"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/enforcetest"
	"github.com/watcherhq/watcher/internal/enforce/recorder"
	"github.com/watcherhq/watcher/internal/testkit/poll"
)

// TestSyscallTracepointFlips attaches and detaches the recorder's sys_enter
// tracepoint over and over while another thread makes system calls, as
// the agent does around `watcher exec` runs (each flip live-patches the
// kernel's syscall tracepoint static key). It must neither fail nor stall
// the other thread. In the qemu guest it is the harness's check that
// TCG handles the cross-CPU code patching (test/vm/run.sh VM_TCG_THREAD:
// multi-threaded TCG locks up here).
func TestSyscallTracepointFlips(t *testing.T) {
	flips := 200
	if v := os.Getenv("WATCHER_FLIPS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			t.Fatalf("WATCHER_FLIPS=%q: want a positive number", v)
		}
		flips = n
	}
	eng := enforcetest.Engine(t)
	rec, err := recorder.Load(eng)
	if err != nil {
		t.Fatal(err)
	}
	defer rec.Close()
	if err := rec.Attach(recorder.AttachOptions{}); err != nil {
		t.Fatal(err)
	}

	var stop atomic.Bool
	var calls atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		for !stop.Load() {
			unix.Getppid()
			calls.Add(1)
		}
	}()
	defer func() { stop.Store(true); <-done }()

	ids, err := rec.ProgramIDs()
	if err != nil {
		t.Fatal(err)
	}
	enterLinked := func() bool {
		linked, err := enforce.LinkedPrograms()
		if err != nil {
			t.Fatal(err)
		}
		return linked[ids[recorder.ProgSysEnter]] > 0
	}
	// Syscalls alone flips the sys_enter tracepoint on every kernel (where
	// fexit loads, Denials flips fexit programs instead, ~2 s a flip
	// under TCG, and patches no syscall tracepoint).
	start := time.Now()
	for i := 0; i < flips; i++ {
		on := i%2 == 0
		if err := rec.SetSyscalls(recorder.AttachOptions{Syscalls: on}); err != nil {
			t.Fatalf("flip %d (sys_enter %v): %v", i, on, err)
		}
		if got := enterLinked(); got != on {
			t.Fatalf("flip %d: sys_enter linked %v, want %v", i, got, on)
		}
	}
	if err := rec.SetSyscalls(recorder.AttachOptions{}); err != nil {
		t.Fatal(err)
	}
	// The caller thread kept running through the flips.
	before := calls.Load()
	if !poll.Within(10*time.Second, func() bool { return calls.Load() != before }) {
		t.Fatalf("the system-call thread made no call in 10 s after %d flips", flips)
	}
	t.Logf("%d attach/detach flips of sys_enter in %v; %d getppid calls on the other thread", flips, time.Since(start).Round(time.Millisecond), calls.Load())
}
