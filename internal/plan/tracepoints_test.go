package plan

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/watcherhq/watcher/internal/dangerous"

	"github.com/watcherhq/watcher/internal/enforce/rules/backstoprules"
	"github.com/watcherhq/watcher/internal/policy"
)

// TestSyscallTracepointDemands: where the LSM hooks run, the plan asks for
// no raw syscall tracepoint on behalf of what they cover (mmap PROT_EXEC,
// perf_event_open, module attempts), and keeps asking where they do not.
func TestSyscallTracepointDemands(t *testing.T) {
	has := func(b backstoprules.SandboxRules, name string) bool {
		for _, s := range b.Syscalls {
			if s.Name == name {
				return true
			}
		}
		return false
	}
	onLSM, _ := compile(t, policy.Default(), Env{LSM: lsmEnv(t, nil)})
	if onLSM.Backstop.For(1).MmapExec.Action != 0 {
		t.Error("LSM host: mmap PROT_EXEC left to the backstop's sys_enter although mmap_file judges it")
	}
	if has(onLSM.Backstop.For(1), "perf_event_open") {
		t.Error("LSM host: perf_event_open killed by the backstop although its LSM hook refuses it")
	}
	if onLSM.SyscallStream {
		t.Error("LSM host: the raw sys_enter asked for module attempts the LSM hooks record")
	}
	without, _ := compile(t, policy.Default(), Env{LSM: lsmEnv(t, errRefused)})
	if without.Backstop.For(1).MmapExec.Action == 0 || !has(without.Backstop.For(1), "perf_event_open") {
		t.Errorf("no LSM: mmap exec %+v, perf_event_open rule %v: the backstop must keep them", without.Backstop.For(1).MmapExec, has(without.Backstop.For(1), "perf_event_open"))
	}
	if !without.Backstop.NeedsSyscallTracepoints() {
		t.Error("no LSM: the backstop's rules must need the syscall tracepoints")
	}
	// What still needs them on an LSM host, for the record.
	t.Logf("LSM host, default policy: backstop syscall rules %v, compat %+v, io_uring %+v, packet %+v",
		onLSM.Backstop.For(1).Syscalls, onLSM.Backstop.For(1).Compat, onLSM.Backstop.For(1).IOUring, onLSM.Backstop.For(1).PacketSocket)
}

// TestNoSyscallTracepointsOnLSMHosts: with every LSM hook and fentry
// program available (BPF LSM or fmod_ret hosts), no preset, in enforce or
// record mode, leaves a rule to the backstop's raw syscall tracepoints:
// every entry of the dangerous list is refused by a hook (its own, the
// capability or key permission it asks for in that syscall) or killed at
// its own entry point (fentry). Without the fentry programs, personality,
// name_to_handle_at and io_uring are the backstop's again.
func TestNoSyscallTracepointsOnLSMHosts(t *testing.T) {
	env := Env{LSM: lsmEnv(t, nil)}
	for _, preset := range policy.PresetNames() {
		for _, mode := range []string{"enforce", "record"} {
			p := parse(t, fmt.Sprintf(`version: 1
sandboxes:
  - {name: sb, select: {cgroups: [/x]}, preset: %s, mode: %s, workspace: [/srv/agent]}
`, preset, mode))
			pl, _ := compile(t, p, env)
			var left []string
			for _, s := range pl.Backstop.For(1).Syscalls {
				if s.Action != 0 {
					left = append(left, s.Name)
				}
			}
			if len(left) > 0 || pl.Backstop.NeedsSyscallTracepoints() {
				t.Errorf("%s/%s: backstop syscall rules %v, needs tracepoints %v (io_uring %+v, compat %+v, paths %d)",
					preset, mode, left, pl.Backstop.NeedsSyscallTracepoints(), pl.Backstop.For(1).IOUring, pl.Backstop.For(1).Compat, len(pl.Backstop.Paths))
			}
			// No preset asks for the syscall stream (a host-wide cost):
			// a policy opts in with audit.syscalls.
			if pl.SyscallStream {
				t.Errorf("%s/%s: the raw sys_enter stream asked for", preset, mode)
			}
		}
	}
	pl, _ := compile(t, policy.Default(), env)
	for _, l := range pl.Layers {
		if strings.HasSuffix(l.Rule, ": kernel_interfaces") || strings.HasSuffix(l.Rule, ": io_uring") {
			t.Logf("%s: %s (%s)", l.Rule, l.Mechanism, l.Note)
			if l.Mechanism != MechEntry {
				t.Errorf("%s: mechanism %s, want %s (personality, name_to_handle_at, io_uring killed at entry)", l.Rule, l.Mechanism, MechEntry)
			}
		}
	}

	// Without the fentry programs: exactly the entries no hook judges.
	noEntry := lsmEnv(t, nil)
	for _, o := range dangerous.Ops {
		if o.AtEntry() {
			for _, fn := range o.EntryFuncs() {
				noEntry[fn] = errRefused
			}
		}
	}
	pl, _ = compile(t, policy.Default(), Env{LSM: noEntry})
	var left []string
	for _, s := range pl.Backstop.For(1).Syscalls {
		left = append(left, s.Name)
	}
	sort.Strings(left)
	want := []string{"io_uring_enter", "io_uring_register", "name_to_handle_at", "personality"}
	if !slices.Equal(left, want) || pl.Backstop.For(1).IOUring.Action == 0 {
		t.Errorf("LSM without fentry: backstop syscalls %v (want %v), io_uring category %+v", left, want, pl.Backstop.For(1).IOUring)
	}
}
