package plan

import (
	"testing"

	"github.com/watcherhq/watcher/internal/enforce/backstop"
	"github.com/watcherhq/watcher/internal/policy"
)

// TestSyscallTracepointDemands: where the LSM hooks run, the plan asks for
// no raw syscall tracepoint on behalf of what they cover (mmap PROT_EXEC,
// perf_event_open, module attempts), and keeps asking where they do not.
func TestSyscallTracepointDemands(t *testing.T) {
	has := func(b backstop.Rules, name string) bool {
		for _, s := range b.Syscalls {
			if s.Name == name {
				return true
			}
		}
		return false
	}
	onLSM, _ := compile(t, policy.Default(), Env{LSM: lsmEnv(t, nil)})
	if onLSM.Backstop.MmapExec.Action != 0 {
		t.Error("LSM host: mmap PROT_EXEC left to the backstop's sys_enter although mmap_file judges it")
	}
	if has(onLSM.Backstop, "perf_event_open") {
		t.Error("LSM host: perf_event_open killed by the backstop although its LSM hook refuses it")
	}
	if onLSM.SyscallStream {
		t.Error("LSM host: the raw sys_enter asked for module attempts the LSM hooks record")
	}
	without, _ := compile(t, policy.Default(), Env{LSM: lsmEnv(t, errRefused)})
	if without.Backstop.MmapExec.Action == 0 || !has(without.Backstop, "perf_event_open") {
		t.Errorf("no LSM: mmap exec %+v, perf_event_open rule %v: the backstop must keep them", without.Backstop.MmapExec, has(without.Backstop, "perf_event_open"))
	}
	if !without.Backstop.NeedsSyscallTracepoints() {
		t.Error("no LSM: the backstop's rules must need the syscall tracepoints")
	}
	// What still needs them on an LSM host, for the record.
	t.Logf("LSM host, default policy: backstop syscall rules %v, compat %+v, io_uring %+v, packet %+v",
		onLSM.Backstop.Syscalls, onLSM.Backstop.Compat, onLSM.Backstop.IOUring, onLSM.Backstop.PacketSocket)
}
