package backstop_test

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/dangerous"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/enforcetest"
	"github.com/watcherhq/watcher/internal/enforce/rules/backstoprules"
	"github.com/watcherhq/watcher/internal/launch/ia32"
)

// lowOp is one way a process ends up with a mapping below the minimum.
type lowOp struct {
	name, op string
	args     []string
	syscall  string // the event's syscall name
	addr     uint64 // the low address the event names
	zero     bool   // the event says MMAP_PAGE_ZERO
	ia32     bool   // an i386 call through int 0x80
}

// need32 skips t, a row that makes i386 system calls through int 0x80,
// where this kernel does not run them (ia32.Available; the helper is a
// process on the same kernel, so the test process decides).
func need32(t *testing.T) {
	t.Helper()
	if err := ia32.Available(); err != nil {
		t.Skip(err.Error())
	}
}

// TestLowMappings: where no mmap_addr hook runs, a sandbox member that
// ends up with a mapping below vm.mmap_min_addr (which needs
// CAP_SYS_RAWIO, asked by the kernel without the capable hook) is killed
// when the syscall returns, judged on what the kernel mapped: mmap
// MAP_FIXED, mremap MREMAP_FIXED, shmat (SHM_RND), i386 mmap2 and
// ipc(SHMAT) (its address in user memory: the VMAs are probed), an exec
// of an ELF whose segment loads below the minimum and an exec under the
// MMAP_PAGE_ZERO personality (the ELF loader's own mappings). Each with a
// capability event naming the syscall and the address. The benign
// neighbours work in the same sandbox (mappings the kernel places, a hint
// below the minimum, MAP_FIXED at the minimum, an ordinary exec), the low
// mappings work outside (root has CAP_SYS_RAWIO), and a record rule lets
// them all run and records each.
func TestLowMappings(t *testing.T) {
	min, err := dangerous.MmapMinAddr()
	if err != nil {
		t.Fatal(err)
	}
	if min == 0 {
		t.Skip("vm.mmap_min_addr is 0: the kernel checks no capability for low mappings")
	}
	below := (min - 1) &^ 4095 // the highest page below the minimum
	at := (min + 4095) &^ 4095
	hex := func(v uint64) string { return fmt.Sprint(v) }
	lowELF := enforcetest.TinyELF(t, "lowelf", below, enforcetest.Exit0)
	probe := enforcetest.TinyELF(t, "pagezero", 0x400000, enforcetest.ReadPage0)
	plain := enforcetest.TinyELF(t, "plainelf", 0x400000, enforcetest.Exit0)

	low := []lowOp{
		{"mmap_fixed", "lowmap", []string{"mmap_fixed", hex(below)}, "mmap", below, false, false},
		{"mremap_fixed", "lowmap", []string{"mremap_fixed", hex(below)}, "mremap", below, false, false},
		{"shmat", "lowmap", []string{"shmat", hex(below)}, "shmat", below, false, false},
		{"exec_low_elf", "exec", []string{lowELF}, "execve", below, false, false},
		{"exec_page_zero", "pagezero", []string{probe}, "execve", 0, true, false},
		{"mmap2_ia32", "lowmap", []string{"mmap2_ia32", hex(below)}, "i386:mmap2", below, false, true},
		{"ipc_shmat_ia32", "lowmap", []string{"ipc_shmat_ia32", hex(below)}, "i386:ipc", below, false, true},
	}
	benign := []struct {
		name, op string
		args     []string
		out      string // in the helper's output
	}{
		{"mmap_anywhere", "lowmap", []string{"mmap_hint", "0"}, "result: <nil>"},
		{"mmap_hint_below", "lowmap", []string{"mmap_hint", hex(below)}, "result: <nil>"},
		{"mmap_fixed_at_min", "lowmap", []string{"mmap_fixed", hex(at)}, fmt.Sprintf("mapped at %#x", at)},
		{"exec_plain", "exec", []string{plain}, ""},
	}
	lowEvent := func(ev audit.Event, op lowOp) bool {
		return ev.Kind == audit.KindCapability && ev.Syscall != nil && ev.Syscall.Name == op.syscall &&
			ev.Target != nil && ev.Target.Capability == unix.CAP_SYS_RAWIO &&
			strings.Contains(ev.Message, fmt.Sprintf("mapping at %#x below vm.mmap_min_addr (%#x)", op.addr, min)) &&
			op.zero == strings.Contains(ev.Message, "personality=MMAP_PAGE_ZERO")
	}

	for _, mode := range []struct {
		name    string
		action  uint32
		id      uint32
		verdict audit.Verdict
	}{
		{"kill", enforce.ActionKill, 801, audit.VerdictKilled},
		{"record", enforce.ActionRecord, 802, audit.VerdictRecorded},
	} {
		t.Run(mode.name, func(t *testing.T) {
			f := newFixture(t, func(r *backstoprules.Rules) {
				r.LowMapping = backstoprules.Rule{Action: mode.action, ID: mode.id}
				r.Compat = backstoprules.Rule{} // i386 calls run, judged like 64-bit ones
			})
			if got, err := f.bs.MmapMinAddr(); err != nil || got != min {
				t.Errorf("bs_lowmap_min %d (%v), vm.mmap_min_addr is %d", got, err, min)
			}
			for _, op := range low {
				t.Run(op.name, func(t *testing.T) {
					if op.ia32 {
						need32(t)
					}
					for _, where := range []string{"sandbox", "nested"} {
						if where == "nested" && op.name != "mmap_fixed" {
							continue
						}
						parent := f.sandbox
						if where == "nested" {
							parent = f.nested
						}
						r := f.run(t, parent, op.op, op.args...)
						removeShmOf(t, r.pid) // killed before its own IPC_RMID
						if mode.verdict == audit.VerdictKilled && !r.killed {
							t.Errorf("%s in the %s: not killed (err %v), output %q", op.name, where, r.err, r.out)
							continue
						}
						if mode.verdict == audit.VerdictRecorded && (r.killed || r.err != nil ||
							op.op == "lowmap" && !strings.Contains(r.out, fmt.Sprintf("mapped at %#x", op.addr))) {
							t.Errorf("%s in the %s under a record rule: killed=%v err=%v output %q, want mapped at %#x", op.name, where, r.killed, r.err, r.out, op.addr)
							continue
						}
						ev, ok := f.waitEvent(t, r.pid, func(ev audit.Event) bool { return lowEvent(ev, op) })
						if !ok {
							t.Errorf("%s in the %s: no low-mapping event; events %+v", op.name, where, f.eventsOf(r.pid))
							continue
						}
						if ev.Verdict != mode.verdict || ev.Rule != fmt.Sprintf("rule-%d", mode.id) || ev.Mechanism != backstoprules.Mechanism ||
							ev.Sandbox.CgroupID != f.sbID || ev.Process.CgroupID != r.cgroup {
							t.Errorf("%s in the %s: event %+v", op.name, where, ev)
						}
						t.Logf("%s: %s %s %q", op.name, ev.Verdict, ev.Syscall.Name, ev.Message)
					}
				})
			}
			for _, op := range benign {
				r := f.run(t, f.sandbox, op.op, op.args...)
				if r.killed || r.err != nil || !strings.Contains(r.out, op.out) {
					t.Errorf("benign %s in the sandbox: killed=%v err=%v output %q", op.name, r.killed, r.err, r.out)
				}
				time.Sleep(50 * time.Millisecond)
				for _, ev := range f.eventsOf(r.pid) {
					t.Errorf("benign %s: event %s %q", op.name, ev.Kind, ev.Message)
				}
			}
			if mode.verdict != audit.VerdictKilled {
				return
			}
			// Outside every sandbox root maps them all.
			t.Run("outside", func(t *testing.T) {
				for _, op := range low {
					t.Run(op.name, func(t *testing.T) {
						if op.ia32 {
							need32(t)
						}
						r := f.run(t, f.outside, op.op, op.args...)
						expectSurvived(t, r)
						if op.op == "lowmap" && !strings.Contains(r.out, fmt.Sprintf("mapped at %#x", op.addr)) {
							t.Errorf("%s outside: %q, want mapped at %#x", op.name, r.out, op.addr)
						}
						time.Sleep(50 * time.Millisecond)
						if evs := f.eventsOf(r.pid); len(evs) != 0 {
							t.Errorf("%s outside: events %+v", op.name, evs)
						}
					})
				}
			})
		})
	}
}

// removeShmOf removes the System V segments process pid created: a helper
// killed when shmat returns never reaches its deferred IPC_RMID.
func removeShmOf(t *testing.T, pid int) {
	t.Helper()
	b, err := os.ReadFile("/proc/sysvipc/shm")
	if err != nil {
		t.Errorf("list shm segments: %v", err)
		return
	}
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line) // key shmid perms size cpid lpid ...
		if len(f) < 5 || f[4] != strconv.Itoa(pid) {
			continue
		}
		id, err := strconv.Atoi(f[1])
		if err != nil {
			continue
		}
		if _, err := unix.SysvShmCtl(id, unix.IPC_RMID, nil); err != nil {
			t.Errorf("remove shm %d of helper %d: %v", id, pid, err)
		}
	}
}
