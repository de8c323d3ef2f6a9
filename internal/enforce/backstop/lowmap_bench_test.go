package backstop_test

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/backstop"
	"github.com/watcherhq/watcher/internal/enforce/rules/backstoprules"
	"github.com/watcherhq/watcher/internal/testkit/syscallbench"
)

// TestLowMappingCost measures what the backstop's sys_exit costs an mmap:
// an anonymous mmap+munmap loop (placed by the kernel, above the minimum:
// the low-mapping check's one comparison) bare (no syscall tracepoint
// attached), outside a sandbox and inside one whose low-mapping rule is
// set, with the backstop's default rules, in interleaved rounds; medians
// of the per-round ratios to bare. It runs only with WATCHER_BENCH_MMAP=1:
//
//	WATCHER_BENCH_MMAP=1 go test -count=1 -run '^TestLowMappingCost$' -v ./internal/enforce/backstop
func TestLowMappingCost(t *testing.T) {
	if os.Getenv("WATCHER_BENCH_MMAP") == "" {
		t.Skip("measurement; run with WATCHER_BENCH_MMAP=1")
	}
	iters, rounds := syscallbench.Iterations(100000), 9
	f := newFixture(t, func(r *backstoprules.Rules) {
		r.LowMapping = backstoprules.Rule{Action: enforce.ActionKill, ID: 1}
	})
	none := backstoprules.Rules{}
	loop := func(parent string) float64 {
		t.Helper()
		r := f.run(t, parent, "mmaploop", strconv.Itoa(iters))
		i := strings.Index(r.out, "ns/op ")
		if r.killed || r.err != nil || i < 0 {
			t.Fatalf("mmap loop: killed=%v err=%v output %q", r.killed, r.err, r.out)
		}
		v, err := strconv.ParseFloat(strings.Fields(r.out[i+6:])[0], 64)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	var loops syscallbench.Rounds
	for r := 0; r < rounds; r++ {
		if err := f.bs.SetRules(none); err != nil {
			t.Fatal(err)
		}
		if f.bs.SyscallTracepoints() {
			t.Fatal("syscall tracepoints still attached without rules")
		}
		b := loop(f.outside)
		if err := f.bs.SetRules(f.rules); err != nil {
			t.Fatal(err)
		}
		loops.Add("bare", syscallbench.Result{"mmap": b})
		loops.Add("outside", syscallbench.Result{"mmap": loop(f.outside)})
		loops.Add("inside", syscallbench.Result{"mmap": loop(f.sandbox)})
	}
	// sys_exit's own time per run, from the kernel's BPF run-time
	// statistics (on only for these passes: they add two clock reads).
	perRun := func(parent string) string {
		st, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
		if err != nil {
			return "unavailable: " + err.Error()
		}
		defer st.Close()
		prog := f.bs.Program(backstop.ProgSysExit)
		s0, err := prog.Stats()
		if err != nil {
			return "unavailable: " + err.Error()
		}
		loop(parent)
		s1, err := prog.Stats()
		if err != nil || s1.RunCount == s0.RunCount {
			return "unavailable"
		}
		return fmt.Sprintf("%.0f ns", float64((s1.Runtime-s0.Runtime).Nanoseconds())/float64(s1.RunCount-s0.RunCount))
	}
	ratio := func(state string) float64 { return syscallbench.Median(loops.Ratios(state, "bare", "mmap")) }
	msg := fmt.Sprintf("backstop mmap cost: kernel %s, %d pairs, %d rounds: mmap+munmap bare %.0f ns, backstop outside %.0f ns (%.3fx), inside with the low-mapping rule %.0f ns (%.3fx) (medians of per-round ratios to bare); sys_exit per run: outside %s, inside %s",
		syscallbench.KernelRelease(), iters, rounds, loops.Median("bare", "mmap"), loops.Median("outside", "mmap"), ratio("outside"),
		loops.Median("inside", "mmap"), ratio("inside"), perRun(f.outside), perRun(f.sandbox))
	t.Log(msg)
	fmt.Println(msg)
}
