package lsm

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/enforcetest"
	"github.com/watcherhq/watcher/internal/enforce/rules/lsmrules"
	"github.com/watcherhq/watcher/internal/testkit/syscallbench"
)

// TestBenchVM is `make bench-vm`: the syscall loop of bench/syscall
// (openat+close, stat, getpid) bare (no program loaded), outside any
// sandbox and inside one, with this boot's mechanism (BPF LSM or
// fmod_ret), interleaved rounds, medians, ratios to bare in the same
// boot. Absolute times under emulation mean nothing; ratios do. It runs
// only with WATCHER_BENCH_VM=1 and no other test (bare needs no group
// loaded).
func TestBenchVM(t *testing.T) {
	eng := benchEngine(t, "WATCHER_BENCH_VM", "make bench-vm runs this in the qemu guest (WATCHER_BENCH_VM=1)")
	iters, rounds := syscallbench.Iterations(20000), 5
	cg := enforcetest.Cgroup(t, "bench")
	var res syscallbench.Rounds
	measure := func(where, cgPath string) {
		res.Add(where, enforcetest.SyscallLoop(t, cgPath, "TestLSMLoop", iters))
	}
	for r := 0; r < rounds; r++ {
		measure("bare", "")
	}
	l, err := Load(eng)
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	detached := false
	defer func() {
		if !detached {
			l.Detach()
		}
	}()
	if _, err := eng.AddSandbox(cg, 7, 0); err != nil {
		t.Fatal(err)
	}
	// A realistic rule set: credentials, write-protected system
	// directories, exec refused from /tmp, the dangerous operations.
	ops := map[lsmrules.Op]lsmrules.Decision{}
	for op := lsmrules.OpPtraceAttach; op < opMax; op++ {
		ops[op] = lsmrules.Decision{Action: enforce.ActionBlock, RuleID: uint32(op)}
	}
	must(t, l.SetRules(7, lsmrules.Rules{
		Ops: ops,
		Paths: []lsmrules.PathRule{
			{Path: "/etc/shadow", Decision: lsmrules.Decision{Action: enforce.ActionBlock, RuleID: 100}},
			{Path: "/etc/", Prefix: true, Access: lsmrules.AccessWrite, Decision: lsmrules.Decision{Action: enforce.ActionBlock, RuleID: 101}},
			{Path: "/usr/", Prefix: true, Access: lsmrules.AccessWrite, Decision: lsmrules.Decision{Action: enforce.ActionBlock, RuleID: 102}},
			{Path: "/proc/sys/", Prefix: true, Access: lsmrules.AccessWrite, Decision: lsmrules.Decision{Action: enforce.ActionBlock, RuleID: 103}},
		},
		Exec: []lsmrules.ExecRule{{Path: "/tmp/", Prefix: true, Decision: lsmrules.Decision{Action: enforce.ActionBlock, RuleID: 104}}},
	}))
	for r := 0; r < rounds; r++ {
		measure("outside", "")
		measure("inside", cg)
	}
	must(t, l.Detach())
	detached = true
	for r := 0; r < rounds; r++ {
		measure("bare", "")
	}
	mech := map[string]int{}
	for _, m := range l.Mechanisms() {
		mech[m]++
	}
	median := res.Median
	var b strings.Builder
	fmt.Fprintf(&b, "bench-vm: kernel %s, mechanisms %v, %d iterations, %d rounds (bare: before and after)\n", syscallbench.KernelRelease(), mech, iters, rounds)
	fmt.Fprintf(&b, "%-14s %10s %10s %8s %10s %8s\n", "op", "bare ns", "outside", "ratio", "inside", "ratio")
	for _, op := range syscallbench.Ops {
		bare, out, in := median("bare", op), median("outside", op), median("inside", op)
		fmt.Fprintf(&b, "%-14s %10.0f %10.0f %7.2fx %10.0f %7.2fx\n", op, bare, out, out/bare, in, in/bare)
	}
	t.Log("\n" + b.String())
	fmt.Print(b.String())
}

// benchEngine begins one of this package's measurements: they run only
// on request (env set, in the qemu guest), as root.
func benchEngine(t *testing.T, env, skip string) *enforce.Engine {
	t.Helper()
	if os.Getenv(env) == "" {
		t.Skip(skip)
	}
	enforcetest.RequireRoot(t)
	return enforcetest.Engine(t)
}

// TestLSMLoop is the measured workload of TestBenchVM (bench/syscall's
// loop), in a child process.
func TestLSMLoop(t *testing.T) { enforcetest.SyscallLoopChild(t) }
