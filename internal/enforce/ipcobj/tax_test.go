package ipcobj_test

import (
	"fmt"
	"os"
	"strconv"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/enforce/enforcetest"
	"github.com/watcherhq/watcher/internal/enforce/ipcobj"
	"github.com/watcherhq/watcher/internal/testkit/syscallbench"
)

// TestLoopChild is the helper of TestIPCTax's loops.
func TestLoopChild(t *testing.T) { enforcetest.SyscallLoopChild(t) }

// TestIPCTax measures what the attached tracking costs other syscalls
// (getpid, openat+close, stat), outside and inside a sandbox, against the
// same loops with it detached, alternating in the same run (medians of
// WATCHER_TAX_ROUNDS rounds, default 3), and the programs' own run time
// per invocation from the kernel's BPF statistics. Opt-in:
// WATCHER_BENCH_TAX=1.
func TestIPCTax(t *testing.T) {
	if os.Getenv("WATCHER_BENCH_TAX") == "" {
		t.Skip("measurement: set WATCHER_BENCH_TAX=1")
	}
	f := setup(t)
	// The programs' own run time (kernel BPF statistics), whatever the
	// host's load does to the wall-clock loops.
	stats, err := ebpf.EnableStats(unix.BPF_STATS_RUN_TIME)
	if err != nil {
		t.Fatalf("bpf stats: %v", err)
	}
	defer stats.Close()
	ids, err := f.track.ProgramIDs()
	if err != nil {
		t.Fatal(err)
	}
	var r syscallbench.Rounds
	rounds, _ := strconv.Atoi(os.Getenv("WATCHER_TAX_ROUNDS"))
	if rounds <= 0 {
		rounds = 3
	}
	for round := 0; round < rounds; round++ {
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
	for _, name := range []string{ipcobj.ProgSysEnter, ipcobj.ProgSysExit} {
		p, err := ebpf.NewProgramFromID(ids[name])
		if err != nil {
			t.Fatal(err)
		}
		st, err := p.Stats()
		p.Close()
		if err != nil {
			t.Fatal(err)
		}
		if st.RunCount > 0 {
			t.Logf("%s: %d runs (every syscall of the host while attached), %.1f ns per run", name, st.RunCount, float64(st.Runtime.Nanoseconds())/float64(st.RunCount))
		}
	}
}
