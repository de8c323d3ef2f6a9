package lsm

import (
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/dangerous"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/enforcetest"
	"github.com/watcherhq/watcher/internal/enforce/rules/lsmrules"
	"github.com/watcherhq/watcher/internal/launch/ia32"
)

// lowMapFixture is what the low-mapping tests share: the loaded programs,
// vm.mmap_min_addr, and two sandboxes, one blocking CAP_SYS_RAWIO and one
// recording it.
type lowMapFixture struct {
	l             *LSM
	minAddr       uint64
	block, record sandboxFixture
}

// lowMapSandboxes sets up a lowMapFixture whose block rule is rule and
// whose record rule is rule+1. It skips where vm.mmap_min_addr is 0.
func lowMapSandboxes(t *testing.T, rule uint32) lowMapFixture {
	t.Helper()
	eng, l := setup(t)
	min, err := dangerous.MmapMinAddr()
	if err != nil {
		t.Fatal(err)
	}
	if min == 0 {
		t.Skip("vm.mmap_min_addr is 0: the kernel checks no capability for low mappings")
	}
	rawio := func(d lsmrules.Decision) lsmrules.Rules {
		return lsmrules.Rules{Caps: []lsmrules.CapRule{{Cap: unix.CAP_SYS_RAWIO, Decision: d}}}
	}
	return lowMapFixture{
		l:       l,
		minAddr: min,
		block:   newSandbox(t, eng, l, 0, rawio(lsmrules.Decision{Action: enforce.ActionBlock, RuleID: rule})),
		record:  newSandbox(t, eng, l, 0, rawio(lsmrules.Decision{Action: enforce.ActionRecord, RuleID: rule + 1})),
	}
}

// wantLowMapEvent waits for pid's capability event (CAP_SYS_RAWIO, rule)
// for a mapping at addr below vm.mmap_min_addr and checks its verdict and
// mechanism.
func wantLowMapEvent(t *testing.T, what string, pid int, addr uint64, rule uint32, verdict audit.Verdict) {
	t.Helper()
	ev := waitEvent(t, what, func(ev audit.Event) bool {
		return ev.Process.TGID == uint32(pid) && ev.Kind == audit.KindCapability && ev.Rule == fmt.Sprintf("rule-%d", rule) &&
			ev.Target != nil && ev.Target.Capability == unix.CAP_SYS_RAWIO &&
			strings.Contains(ev.Message, fmt.Sprintf("at %#x below vm.mmap_min_addr", addr))
	})
	if ev.Kind != "" && (ev.Verdict != verdict || ev.Mechanism != expectedMechanism(t)) {
		t.Errorf("%s: verdict %s mechanism %s, want %s by %s", what, ev.Verdict, ev.Mechanism, verdict, expectedMechanism(t))
	}
}

// TestMmapBelowMinAddr: a mapping below vm.mmap_min_addr needs
// CAP_SYS_RAWIO, but the kernel's cap_mmap_addr asks cap_capable()
// directly, so the capable hook never sees it. The mmap_addr hook judges
// it by the capability rules: in a sandbox whose policy blocks
// CAP_SYS_RAWIO, page 0 is refused with EPERM by every route (mmap
// MAP_FIXED and MAP_FIXED_NOREPLACE, mremap MREMAP_FIXED, shmat at an
// address, i386 mmap2), each with a capability event naming the rule.
// Outside any sandbox root maps page 0; inside, mappings the kernel places
// (no address, or a hint below the minimum) and fixed ones at the minimum
// work; a record rule lets page 0 through and records it.
func TestMmapBelowMinAddr(t *testing.T) {
	f := lowMapSandboxes(t, 601)
	min := f.minAddr
	below := min - 1
	below &^= 4095 // the highest page below the minimum

	low := []opSpec{
		{Name: "mmap_fixed_0", Kind: "mmap_fixed", Num: 0},
		{Name: "mmap_fixed_below", Kind: "mmap_fixed", Num: below},
		{Name: "mmap_noreplace_0", Kind: "mmap_fixed_noreplace", Num: 0},
		{Name: "mremap_fixed_0", Kind: "mremap_fixed", Num: 0},
		{Name: "shmat_0x1000", Kind: "shmat_at", Num: 4096},
	}
	// The helper is on this kernel: decide here whether it makes the
	// int 0x80 one.
	if err := ia32.Available(); err == nil {
		low = append(low, opSpec{Name: "mmap2_ia32_0", Kind: "mmap2_ia32", Num: 0})
	} else {
		t.Logf("mmap2_ia32_0: not made: %v", err)
		t.Run("mmap2_ia32_0", func(t *testing.T) { t.Skip(err.Error()) })
	}
	benign := []opSpec{
		{Name: "mmap_anywhere", Kind: "mmap_hint", Num: 0},
		{Name: "mmap_hint_low", Kind: "mmap_hint", Num: 4096},
		{Name: "mmap_noreplace_min", Kind: "mmap_fixed_noreplace", Num: (min + 4095) &^ 4095},
	}
	ops := append(append([]opSpec{}, low...), benign...)

	out, outPID := runOps(t, "", ops)
	res, pid := runOps(t, f.block.root, ops)
	rec, recPID := runOps(t, f.record.root, ops)
	t.Logf("vm.mmap_min_addr %d; outside %v; blocked %v; recorded %v", min, out, res, rec)
	for _, op := range benign {
		if out[op.Name] != "OK" || res[op.Name] != "OK" || rec[op.Name] != "OK" {
			t.Errorf("benign %s: outside %s, blocked sandbox %s, record sandbox %s, want OK", op.Name, out[op.Name], res[op.Name], rec[op.Name])
		}
	}
	capEvent := func(pid int, op opSpec, rule uint32, verdict audit.Verdict) {
		t.Helper()
		wantLowMapEvent(t, fmt.Sprintf("%s (pid %d)", op.Name, pid), pid, op.Num&^4095, rule, verdict)
	}
	for _, op := range low {
		if out[op.Name] != "OK" {
			t.Errorf("outside: %s: %s, want OK (root has CAP_SYS_RAWIO)", op.Name, out[op.Name])
		}
		if res[op.Name] != "EPERM" {
			t.Errorf("sandbox blocking CAP_SYS_RAWIO: %s: %s, want EPERM", op.Name, res[op.Name])
		} else {
			capEvent(pid, op, 601, audit.VerdictDenied)
		}
		if rec[op.Name] != "OK" {
			t.Errorf("sandbox recording CAP_SYS_RAWIO: %s: %s, want OK", op.Name, rec[op.Name])
		} else {
			capEvent(recPID, op, 602, audit.VerdictRecorded)
		}
	}
	time.Sleep(200 * time.Millisecond) // two reader deadlines
	for _, ev := range eventsFrom(outPID) {
		t.Errorf("outside the sandbox: event %s %q", ev.Kind, ev.Message)
	}
	for _, p := range []int{pid, recPID} {
		n := 0
		for _, ev := range eventsFrom(p) {
			if strings.Contains(ev.Message, "below vm.mmap_min_addr") {
				n++
			}
		}
		if n != len(low) {
			t.Errorf("pid %d: %d low-mapping events, want %d (one per low mapping, none for the benign ones)", p, n, len(low))
		}
	}
	// The hook's minimum is the sysctl's, written by Load and SetRules.
	m := f.l.maps.Maps["lsm_mmap_min_addr"]
	var inMap uint64
	if m == nil {
		t.Error("no lsm_mmap_min_addr map")
	} else if err := m.Lookup(uint32(0), &inMap); err != nil || inMap != min {
		t.Errorf("lsm_mmap_min_addr holds %d (%v), vm.mmap_min_addr is %d", inMap, err, min)
	}
}

// lowELF writes a static x86_64 executable whose one segment loads at
// vaddr and which exits 0 at once.
func lowELF(t *testing.T, vaddr uint64) string {
	t.Helper()
	return enforcetest.TinyELF(t, "lowelf", vaddr, enforcetest.Exit0)
}

// TestMmapBelowMinAddrExec: execve maps an executable's segments itself;
// one that loads below vm.mmap_min_addr reaches the same mmap_addr check.
// In a sandbox blocking CAP_SYS_RAWIO the new program never runs (the
// kernel kills it past exec's point of no return) and the refusal is
// recorded; outside, root runs it; a record rule lets it run and
// records it.
func TestMmapBelowMinAddrExec(t *testing.T) {
	f := lowMapSandboxes(t, 611)
	vaddr := (f.minAddr - 1) &^ 4095
	bin := lowELF(t, vaddr)

	run := func(cg string) (int, error) {
		cmd := enforcetest.Command(t, cg, bin)
		err := cmd.Run()
		return cmd.Process.Pid, err
	}
	if _, err := run(""); err != nil {
		t.Fatalf("outside: %s loading at %#x: %v, want exit 0 (root has CAP_SYS_RAWIO)", bin, vaddr, err)
	}
	pid, err := run(f.block.root)
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Errorf("sandbox blocking CAP_SYS_RAWIO: %v, want the program killed", err)
	} else {
		t.Logf("sandbox blocking CAP_SYS_RAWIO: %v", err)
	}
	wantLowMapEvent(t, fmt.Sprintf("exec of a low ELF (pid %d)", pid), pid, vaddr, 611, audit.VerdictDenied)
	pid, err = run(f.record.root)
	if err != nil {
		t.Errorf("sandbox recording CAP_SYS_RAWIO: %v, want exit 0", err)
	}
	wantLowMapEvent(t, fmt.Sprintf("exec of a low ELF (pid %d)", pid), pid, vaddr, 612, audit.VerdictRecorded)
}

// TestMmapBelowMinAddrPersonality: the MMAP_PAGE_ZERO personality makes
// the ELF loader map page 0 at every exec, a kernel-made low mapping
// (inside a sandbox personality(2) itself is killed at entry; a process
// can bring the flag along). The same hook judges it: in a sandbox
// blocking CAP_SYS_RAWIO the program runs without page 0 (the loader
// ignores the failure; its read of address 0 faults) and the refusal is
// recorded; outside and under a record rule page 0 is mapped (the read
// works, exit 0), the latter recorded.
func TestMmapBelowMinAddrPersonality(t *testing.T) {
	f := lowMapSandboxes(t, 621)
	// mov eax, [0]; then exit(0).
	probe := enforcetest.TinyELF(t, "pagezero", 0x400000, enforcetest.ReadPage0)
	run := func(cg string) (string, int) {
		t.Helper()
		cmd := enforcetest.SelfCommand(t, "", "TestPageZeroHelper", "pagezero", "WATCHER_PAGEZERO_CG="+cg, "WATCHER_PAGEZERO_BIN="+probe)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		stop := time.AfterFunc(time.Minute, func() { cmd.Process.Kill() })
		defer stop.Stop()
		err := cmd.Wait()
		var ee *exec.ExitError
		switch {
		case err == nil:
			return "mapped", cmd.Process.Pid
		case errors.As(err, &ee) && ee.Sys().(syscall.WaitStatus).Signal() == syscall.SIGSEGV:
			return "unmapped", cmd.Process.Pid
		}
		t.Fatalf("page-zero probe (cgroup %q): %v", cg, err)
		return "", 0
	}
	if got, _ := run(""); got != "mapped" {
		t.Fatalf("outside: page 0 %s, want mapped (MMAP_PAGE_ZERO, root)", got)
	}
	got, pid := run(f.block.root)
	if got != "unmapped" {
		t.Errorf("sandbox blocking CAP_SYS_RAWIO: page 0 %s, want unmapped", got)
	}
	wantLowMapEvent(t, fmt.Sprintf("MMAP_PAGE_ZERO exec (pid %d)", pid), pid, 0, 621, audit.VerdictDenied)
	got, pid = run(f.record.root)
	if got != "mapped" {
		t.Errorf("sandbox recording CAP_SYS_RAWIO: page 0 %s, want mapped", got)
	}
	wantLowMapEvent(t, fmt.Sprintf("MMAP_PAGE_ZERO exec (pid %d)", pid), pid, 0, 622, audit.VerdictRecorded)
}
