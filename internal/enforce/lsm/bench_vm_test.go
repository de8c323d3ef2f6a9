package lsm

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/enforcetest"
)

var benchOps = []string{"openat+close", "stat", "getpid"}

// TestBenchVM is `make bench-vm`: the syscall loop of bench/syscall
// (openat+close, stat, getpid) bare (no program loaded), outside any
// sandbox and inside one, with this boot's mechanism (BPF LSM or
// fmod_ret), interleaved rounds, medians, ratios to bare in the same
// boot. Absolute times under emulation mean nothing; ratios do. It runs
// only with WATCHER_BENCH_VM=1 and no other test (bare needs no group
// loaded).
func TestBenchVM(t *testing.T) {
	if os.Getenv("WATCHER_BENCH_VM") == "" {
		t.Skip("make bench-vm runs this in the qemu guest (WATCHER_BENCH_VM=1)")
	}
	enforcetest.RequireRoot(t)
	iters, rounds := 20000, 5
	if v, err := strconv.Atoi(os.Getenv("WATCHER_BENCH_ITERS")); err == nil && v > 0 {
		iters = v
	}
	eng := enforcetest.Engine(t)
	cg := enforcetest.Cgroup(t, "bench")
	res := map[string][]map[string]float64{}
	measure := func(where, cgPath string) {
		cmd := enforcetest.SelfCommand(t, cgPath, "TestLSMLoop", "loop", fmt.Sprintf("WATCHER_LOOP_ITERS=%d", iters))
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%s: loop: %v", where, err)
		}
		for _, line := range strings.Split(string(out), "\n") {
			if s, ok := strings.CutPrefix(line, "LOOP "); ok {
				var m map[string]float64
				must(t, json.Unmarshal([]byte(s), &m))
				res[where] = append(res[where], m)
			}
		}
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
	ops := map[Op]Decision{}
	for op := OpPtraceAttach; op < opMax; op++ {
		ops[op] = Decision{enforce.ActionBlock, uint32(op)}
	}
	must(t, l.SetRules(7, Rules{
		Ops: ops,
		Paths: []PathRule{
			{Path: "/etc/shadow", Decision: Decision{enforce.ActionBlock, 100}},
			{Path: "/etc/", Prefix: true, Access: AccessWrite, Decision: Decision{enforce.ActionBlock, 101}},
			{Path: "/usr/", Prefix: true, Access: AccessWrite, Decision: Decision{enforce.ActionBlock, 102}},
			{Path: "/proc/sys/", Prefix: true, Access: AccessWrite, Decision: Decision{enforce.ActionBlock, 103}},
		},
		Exec: []ExecRule{{Path: "/tmp/", Prefix: true, Decision: Decision{enforce.ActionBlock, 104}}},
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
	median := func(where, op string) float64 {
		var v []float64
		for _, m := range res[where] {
			v = append(v, m[op])
		}
		sort.Float64s(v)
		return v[len(v)/2]
	}
	var b strings.Builder
	fmt.Fprintf(&b, "bench-vm: kernel %s, mechanisms %v, %d iterations, %d rounds (bare: before and after)\n", kernelRelease(), mech, iters, rounds)
	fmt.Fprintf(&b, "%-14s %10s %10s %8s %10s %8s\n", "op", "bare ns", "outside", "ratio", "inside", "ratio")
	for _, op := range benchOps {
		bare, out, in := median("bare", op), median("outside", op), median("inside", op)
		fmt.Fprintf(&b, "%-14s %10.0f %10.0f %7.2fx %10.0f %7.2fx\n", op, bare, out, out/bare, in, in/bare)
	}
	t.Log("\n" + b.String())
	fmt.Print(b.String())
}

func kernelRelease() string {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return "?"
	}
	return unix.ByteSliceToString(u.Release[:])
}

// TestLSMLoop is the measured workload of TestBenchVM (bench/syscall's
// loop): each op WATCHER_LOOP_ITERS times, ns/op printed as JSON.
func TestLSMLoop(t *testing.T) {
	if os.Getenv("WATCHER_TEST_HELPER") != "loop" {
		t.Skip("helper process for TestBenchVM")
	}
	iters, _ := strconv.Atoi(os.Getenv("WATCHER_LOOP_ITERS"))
	path, _ := unix.BytePtrFromString("/etc/passwd")
	p := uintptr(unsafe.Pointer(path))
	atFDCWD := uintptr(^uint64(99))
	var st unix.Stat_t
	res := map[string]float64{}
	run := func(name string, f func()) {
		for i := 0; i < iters/10; i++ {
			f()
		}
		start := time.Now()
		for i := 0; i < iters; i++ {
			f()
		}
		res[name] = float64(time.Since(start).Nanoseconds()) / float64(iters)
	}
	run("openat+close", func() {
		fd, _, _ := unix.RawSyscall6(unix.SYS_OPENAT, atFDCWD, p, unix.O_RDONLY, 0, 0, 0)
		unix.RawSyscall(unix.SYS_CLOSE, fd, 0, 0)
	})
	run("stat", func() {
		unix.RawSyscall6(unix.SYS_NEWFSTATAT, atFDCWD, p, uintptr(unsafe.Pointer(&st)), 0, 0, 0)
	})
	run("getpid", func() { unix.RawSyscall(unix.SYS_GETPID, 0, 0, 0) })
	b, _ := json.Marshal(res)
	fmt.Printf("LOOP %s\n", b)
	os.Exit(0)
}
