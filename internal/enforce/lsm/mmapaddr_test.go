package lsm

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/dangerous"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/launch/ia32"
)

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
	eng, l := setup(t)
	min, err := dangerous.MmapMinAddr()
	if err != nil {
		t.Fatal(err)
	}
	if min == 0 {
		t.Skip("vm.mmap_min_addr is 0: the kernel checks no capability for low mappings")
	}
	below := min - 1
	below &^= 4095 // the highest page below the minimum
	block := newSandbox(t, eng, l, 0, Rules{Caps: []CapRule{{Cap: unix.CAP_SYS_RAWIO, Decision: Decision{enforce.ActionBlock, 601}}}})
	record := newSandbox(t, eng, l, 0, Rules{Caps: []CapRule{{Cap: unix.CAP_SYS_RAWIO, Decision: Decision{enforce.ActionRecord, 602}}}})

	low := []opSpec{
		{Name: "mmap_fixed_0", Kind: "mmap_fixed", Num: 0},
		{Name: "mmap_fixed_below", Kind: "mmap_fixed", Num: below},
		{Name: "mmap_noreplace_0", Kind: "mmap_fixed_noreplace", Num: 0},
		{Name: "mremap_fixed_0", Kind: "mremap_fixed", Num: 0},
		{Name: "shmat_0x1000", Kind: "shmat_at", Num: 4096},
	}
	if ia32.Supported {
		low = append(low, opSpec{Name: "mmap2_ia32_0", Kind: "mmap2_ia32", Num: 0})
	}
	benign := []opSpec{
		{Name: "mmap_anywhere", Kind: "mmap_hint", Num: 0},
		{Name: "mmap_hint_low", Kind: "mmap_hint", Num: 4096},
		{Name: "mmap_noreplace_min", Kind: "mmap_fixed_noreplace", Num: (min + 4095) &^ 4095},
	}
	ops := append(append([]opSpec{}, low...), benign...)

	out, outPID := runOps(t, "", ops)
	res, pid := runOps(t, block.root, ops)
	rec, recPID := runOps(t, record.root, ops)
	t.Logf("vm.mmap_min_addr %d; outside %v; blocked %v; recorded %v", min, out, res, rec)
	for _, op := range benign {
		if out[op.Name] != "OK" || res[op.Name] != "OK" || rec[op.Name] != "OK" {
			t.Errorf("benign %s: outside %s, blocked sandbox %s, record sandbox %s, want OK", op.Name, out[op.Name], res[op.Name], rec[op.Name])
		}
	}
	capEvent := func(pid int, op opSpec, rule uint32, verdict audit.Verdict) {
		t.Helper()
		ev := waitEvent(t, fmt.Sprintf("%s (pid %d)", op.Name, pid), func(ev audit.Event) bool {
			return ev.Process.TGID == uint32(pid) && ev.Kind == audit.KindCapability && ev.Rule == fmt.Sprintf("rule-%d", rule) &&
				ev.Target != nil && ev.Target.Capability == unix.CAP_SYS_RAWIO &&
				strings.Contains(ev.Message, fmt.Sprintf("at %#x below vm.mmap_min_addr", op.Num&^4095))
		})
		if ev.Kind != "" && (ev.Verdict != verdict || ev.Mechanism != expectedMechanism(t)) {
			t.Errorf("%s: verdict %s mechanism %s, want %s by %s", op.Name, ev.Verdict, ev.Mechanism, verdict, expectedMechanism(t))
		}
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
	m := l.maps.Maps["lsm_mmap_min_addr"]
	var inMap uint64
	if m == nil {
		t.Error("no lsm_mmap_min_addr map")
	} else if err := m.Lookup(uint32(0), &inMap); err != nil || inMap != min {
		t.Errorf("lsm_mmap_min_addr holds %d (%v), vm.mmap_min_addr is %d", inMap, err, min)
	}
}
