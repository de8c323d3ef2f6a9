package ipcobj_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/watcherhq/watcher/internal/enforce/enforcetest"
	"github.com/watcherhq/watcher/internal/syscallbench"
)

// TestLoopChild is the helper of TestIPCTax's loops.
func TestLoopChild(t *testing.T) { enforcetest.SyscallLoopChild(t) }

// TestIPCTax measures what the attached tracking costs other syscalls
// (getpid, openat+close, stat), outside and inside a sandbox, against the
// same loops with it detached, alternating in the same run (medians of 3
// rounds). Opt-in: WATCHER_BENCH_TAX=1.
func TestIPCTax(t *testing.T) {
	if os.Getenv("WATCHER_BENCH_TAX") == "" {
		t.Skip("measurement: set WATCHER_BENCH_TAX=1")
	}
	f := setup(t)
	var r syscallbench.Rounds
	for round := 0; round < 3; round++ {
		for _, on := range []bool{false, true} {
			if err := f.track.SetAttached(on); err != nil {
				t.Fatal(err)
			}
			state := map[bool]string{false: "detached", true: "attached"}[on]
			r.Add(state+" outside", enforcetest.SyscallLoop(t, "", "TestLoopChild", 100000))
			r.Add(state+" sandbox", enforcetest.SyscallLoop(t, f.cg, "TestLoopChild", 100000))
		}
	}
	for _, where := range []string{"outside", "sandbox"} {
		for _, op := range syscallbench.Ops {
			base, with := r.Median("detached "+where, op), r.Median("attached "+where, op)
			line := fmt.Sprintf("%-8s %-13s detached %7.1f ns  attached %7.1f ns  ratio %.2fx", where, op, base, with, with/base)
			t.Log(line)
		}
	}
}
