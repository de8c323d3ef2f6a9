package backstop_test

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/enforce/backstop"
	"github.com/watcherhq/watcher/internal/enforce/rules/backstoprules"
	"github.com/watcherhq/watcher/internal/testkit/syscallbench"
)

// TestSubtreeCost measures what the own-subtree and host-state checks cost
// the hot calls they put on sys_enter's path: tgkill of its own thread,
// kill of itself (signal 0), ioctl FIONREAD, fcntl F_GETFL, and getpid
// (no category: the syscall tracepoints alone), bare (no syscall
// tracepoint attached), outside a sandbox and inside one with every check
// on (the backstop's default rules plus subtreeRules), in interleaved
// rounds; medians of the per-round ratios to bare. It runs only with
// WATCHER_BENCH_SUBTREE=1:
//
//	WATCHER_BENCH_SUBTREE=1 go test -count=1 -run '^TestSubtreeCost$' -v ./internal/enforce/backstop
func TestSubtreeCost(t *testing.T) {
	if os.Getenv("WATCHER_BENCH_SUBTREE") == "" {
		t.Skip("measurement; run with WATCHER_BENCH_SUBTREE=1")
	}
	iters, rounds := syscallbench.Iterations(200000), 7
	f := newFixture(t, subtreeRules)
	ops := []string{"tgkill-own", "kill-self", "ioctl", "fcntl", "getpid"}
	loop := func(parent string) syscallbench.Result {
		t.Helper()
		r := f.run(t, parent, "hotloop", strconv.Itoa(iters))
		res, err := syscallbench.Parse([]byte(r.out))
		if r.killed || err != nil {
			t.Fatalf("hot loop: killed=%v err=%v output %q", r.killed, err, r.out)
		}
		return res
	}
	var rs syscallbench.Rounds
	for i := 0; i < rounds; i++ {
		if err := f.bs.SetRules(backstoprules.Rules{}); err != nil {
			t.Fatal(err)
		}
		b := loop(f.outside)
		if err := f.bs.SetRules(f.rules); err != nil {
			t.Fatal(err)
		}
		rs.Add("bare", b)
		rs.Add("outside", loop(f.outside))
		rs.Add("inside", loop(f.sandbox))
	}
	var lines []string
	for _, op := range ops {
		lines = append(lines, fmt.Sprintf("%s bare %.0f ns, outside %.0f ns (%.2fx), inside %.0f ns (%.2fx)", op,
			rs.Median("bare", op), rs.Median("outside", op), syscallbench.Median(rs.Ratios("outside", "bare", op)),
			rs.Median("inside", op), syscallbench.Median(rs.Ratios("inside", "bare", op))))
	}
	// sys_enter's own time per run, from the kernel's BPF run-time
	// statistics (on only for this pass: they add two clock reads), while
	// the loop runs inside the sandbox: an average over every syscall of
	// the host in that time, the loop's the most of them. Wall-clock
	// ratios drown in the scheduling of a loaded machine; this does not.
	perRun := "unavailable"
	if st, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME)); err == nil {
		prog := f.bs.Program(backstop.ProgSysEnter)
		s0, err0 := prog.Stats()
		loop(f.sandbox)
		s1, err1 := prog.Stats()
		st.Close()
		if err0 == nil && err1 == nil && s1.RunCount > s0.RunCount {
			perRun = fmt.Sprintf("%.0f ns over %d runs", float64((s1.Runtime-s0.Runtime).Nanoseconds())/float64(s1.RunCount-s0.RunCount), s1.RunCount-s0.RunCount)
		}
	}
	msg := fmt.Sprintf("own-subtree cost: kernel %s, %d calls, %d rounds (medians of per-round ratios to bare):\n  %s\n  sys_enter per run inside: %s",
		syscallbench.KernelRelease(), iters, rounds, strings.Join(lines, "\n  "), perRun)
	t.Log(msg)
	fmt.Println(msg)
}
