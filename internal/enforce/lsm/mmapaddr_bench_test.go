package lsm

import (
	"fmt"
	"slices"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/enforce/rules/lsmrules"
	"github.com/watcherhq/watcher/internal/testkit/syscallbench"
)

// TestMmapAddrCost measures what the mmap_addr hook adds to every mmap of
// the host: an anonymous mmap+munmap loop (placed by the kernel, above
// the minimum: the hook's fast path, the same inside a sandbox and
// outside, as it returns before looking the task up) with only the
// mmap_addr program attached, against the same loop with no program, in
// alternating rounds in one process (the link is attached and closed
// each round), the median of the per-round ratios (syscallbench.Rounds).
// It runs only with WATCHER_BENCH_MMAP=1:
//
//	test/vm/run.sh --pkg ./internal/enforce/lsm --run '^TestMmapAddrCost$' --env WATCHER_BENCH_MMAP=1
func TestMmapAddrCost(t *testing.T) {
	eng := benchEngine(t, "WATCHER_BENCH_MMAP", "measurement; run in the qemu guest with WATCHER_BENCH_MMAP=1")
	iters, rounds := syscallbench.Iterations(20000), 11
	l, err := Load(eng)
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	defer l.Detach()
	mech := l.Mechanisms()["mmap_addr"]
	lk := l.links["mmap_addr"]
	if lk == nil {
		t.Fatalf("mmap_addr did not attach: %v", l.Status()["mmap_addr"])
	}
	info, err := lk.Info()
	if err != nil {
		t.Fatal(err)
	}
	prog, err := ebpf.NewProgramFromID(info.Program)
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	// No program attached but the one under test, and that one only in
	// the measured rounds.
	for h, lk := range l.links {
		lk.Unpin()
		lk.Close()
		delete(l.links, h)
	}
	attach := func() link.Link {
		var lk link.Link
		var err error
		if mech == lsmrules.MechFmodRet {
			lk, err = link.AttachTracing(link.TracingOptions{Program: prog, AttachType: ebpf.AttachModifyReturn})
		} else {
			lk, err = link.AttachLSM(link.LSMOptions{Program: prog})
		}
		if err != nil {
			t.Fatalf("attach mmap_addr (%s): %v", mech, err)
		}
		return lk
	}
	const op = "mmap+munmap"
	anon := uintptr(unix.MAP_PRIVATE | unix.MAP_ANONYMOUS)
	loop := func() syscallbench.Result {
		var failed unix.Errno
		ns := syscallbench.NsPerOp(iters, func() {
			p, _, e := unix.Syscall6(unix.SYS_MMAP, 0, 4096, unix.PROT_READ, anon, ^uintptr(0), 0)
			if e != 0 {
				failed = e
				return
			}
			unix.Syscall(unix.SYS_MUNMAP, p, 4096, 0)
		})
		if failed != 0 {
			t.Fatalf("mmap: %v", failed)
		}
		return syscallbench.Result{op: ns}
	}
	var res syscallbench.Rounds
	for r := 0; r < rounds; r++ {
		res.Add("bare", loop())
		lk := attach()
		res.Add("mmap_addr", loop())
		lk.Close()
	}
	ratios := res.Ratios("mmap_addr", "bare", op)
	// The program's own time per run, from the kernel's BPF run-time
	// statistics (on only for this last pass: they add two clock reads).
	perRun := "unavailable"
	if st, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME)); err == nil {
		lk := attach()
		loop()
		if s, err := prog.Stats(); err == nil && s.RunCount > 0 {
			perRun = fmt.Sprintf("%.0f ns per run over %d runs", float64(s.Runtime.Nanoseconds())/float64(s.RunCount), s.RunCount)
		}
		lk.Close()
		st.Close()
	}
	msg := fmt.Sprintf("mmap_addr cost: kernel %s, mechanism %s, %d iterations, %d rounds: %s bare %.0f ns, with mmap_addr %.0f ns: %.3fx (median of per-round ratios; min %.3fx, max %.3fx); program %s",
		syscallbench.KernelRelease(), mech, iters, rounds, op, res.Median("bare", op), res.Median("mmap_addr", op),
		syscallbench.Median(ratios), slices.Min(ratios), slices.Max(ratios), perRun)
	t.Log(msg)
	fmt.Println(msg)
}
