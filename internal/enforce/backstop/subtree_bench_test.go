package backstop_test

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/watcherhq/watcher/internal/enforce/backstop"
	"github.com/watcherhq/watcher/internal/syscallbench"
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
		if err := f.bs.SetRules(backstop.Rules{}); err != nil {
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
	msg := fmt.Sprintf("own-subtree cost: kernel %s, %d calls, %d rounds (medians of per-round ratios to bare):\n  %s",
		syscallbench.KernelRelease(), iters, rounds, strings.Join(lines, "\n  "))
	t.Log(msg)
	fmt.Println(msg)
}
