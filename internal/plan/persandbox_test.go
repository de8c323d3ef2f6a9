package plan

import (
	"slices"
	"strings"
	"testing"

	"github.com/watcherhq/watcher/internal/enforce/rules"
	"github.com/watcherhq/watcher/internal/enforce/rules/backstoprules"
)

const perSandboxPolicy = `version: 1
sandboxes:
  - name: strict
    select: {cgroups: [/a]}
    operations: {io_uring: block, mount: block, raw_sockets: block, ia32_syscalls: block, kill_agent: block}
  - name: ops
    select: {cgroups: [/b]}
    operations: {io_uring: allow, mount: allow, raw_sockets: allow, ia32_syscalls: allow, kill_agent: allow}
  - name: watch
    select: {cgroups: [/c]}
    operations: {io_uring: record, mount: record, raw_sockets: record}
  - name: trial
    select: {cgroups: [/d]}
    mode: record
    operations: {io_uring: block, mount: block}
`

// TestBackstopRulesPerSandbox: on a host without BPF LSM, each sandbox's
// backstop syscall and category rules carry its own policy's action (an
// allowing sandbox gets none, a recording one records), never the
// strictest of all sandboxes, and no layer line speaks of another
// sandbox's rule. Record mode stays the kernel's downgrade (Flags).
func TestBackstopRulesPerSandbox(t *testing.T) {
	plan, _ := compile(t, parse(t, perSandboxPolicy), Env{LSM: lsmEnv(t, errRefused)})
	if len(plan.Backstop.SandboxRules.Syscalls) != 0 || plan.Backstop.SandboxRules.IOUring.Action != 0 {
		t.Errorf("the every-sandbox set is not empty: %+v", plan.Backstop.SandboxRules)
	}
	sys := func(sr backstoprules.SandboxRules, name string) uint32 {
		i := slices.IndexFunc(sr.Syscalls, func(s backstoprules.SyscallRule) bool { return s.Name == name })
		if i < 0 {
			return rules.ActionAllow
		}
		return sr.Syscalls[i].Action
	}
	for _, c := range []struct {
		sb                     string
		ioUring, mount, packet uint32
	}{
		{"strict", rules.ActionKill, rules.ActionKill, rules.ActionKill},
		{"ops", rules.ActionAllow, rules.ActionAllow, rules.ActionAllow},
		{"watch", rules.ActionRecord, rules.ActionRecord, rules.ActionRecord},
		// Record mode: the kernel downgrades the kill per sandbox.
		// (raw_sockets: the preset's block)
		{"trial", rules.ActionKill, rules.ActionKill, rules.ActionKill},
	} {
		sid := plan.SandboxIDs[c.sb]
		sr, ok := plan.Backstop.Sandboxes[sid]
		if !ok {
			t.Fatalf("%s: no backstop rule set", c.sb)
		}
		if sr.IOUring.Action != c.ioUring || sys(sr, "io_uring_enter") != map[bool]uint32{true: rules.ActionKill}[c.ioUring == rules.ActionKill] {
			t.Errorf("%s: io_uring category %+v, io_uring_enter %d; want %d", c.sb, sr.IOUring, sys(sr, "io_uring_enter"), c.ioUring)
		}
		if got := sys(sr, "mount"); got != c.mount {
			t.Errorf("%s: mount rule %d, want %d", c.sb, got, c.mount)
		}
		if sr.PacketSocket.Action != c.packet {
			t.Errorf("%s: packet socket %+v, want %d", c.sb, sr.PacketSocket, c.packet)
		}
	}
	if plan.Flags[plan.SandboxIDs["trial"]]&rules.SandboxRecordOnly == 0 {
		t.Error("trial: not record-only")
	}
	// kill_agent: strict's refusal is its own; ops allows signalling the
	// agent (as the LSM task_kill rule would per sandbox).
	if a := plan.Backstop.For(plan.SandboxIDs["strict"]).SignalAgent.Action; a != rules.ActionKill {
		t.Errorf("strict: signal-agent %d, want kill", a)
	}
	if a := plan.Backstop.For(plan.SandboxIDs["ops"]).SignalAgent.Action; a != rules.ActionAllow {
		t.Errorf("ops: signal-agent %d, want allow", a)
	}
	for _, l := range plan.Layers {
		if strings.Contains(l.Note, "another sandbox") || strings.Contains(l.Note, "host-wide backstop rule") {
			t.Errorf("%s: %s", l.Rule, l.Note)
		}
	}
	// The layer lines still say killed after the fact where the backstop
	// kills, and the allowing sandbox's lines say allow.
	for rule, want := range map[string]string{"strict: io_uring": "killed, stopped after the fact", "strict: mount": "killed, stopped after the fact",
		"ops: io_uring": "allow", "ops: mount": "allow", "watch: io_uring": "recorded by"} {
		if _, note, ok := findLayer(plan, rule); !ok || !strings.Contains(note, want) {
			t.Errorf("%s: %q, want %q", rule, note, want)
		}
	}
}

// TestIA32PerSandbox: where every hook loads, 32-bit syscalls are killed
// only for the sandbox that refuses them; the other runs them.
func TestIA32PerSandbox(t *testing.T) {
	plan, _ := compile(t, parse(t, perSandboxPolicy), Env{LSM: lsmEnv(t, nil)})
	if c := plan.Backstop.For(plan.SandboxIDs["strict"]).Compat; c.Action != rules.ActionKill || c.ID == 0 {
		t.Errorf("strict: compat %+v, want kill", c)
	}
	if c := plan.Backstop.For(plan.SandboxIDs["ops"]).Compat; c.Action != rules.ActionAllow {
		t.Errorf("ops: compat %+v, want allow (strict's refusal is not ops')", c)
	}
	if mech, note, _ := findLayer(plan, "ops: ia32_syscalls"); mech != MechNone || strings.Contains(note, "killed") {
		t.Errorf("ops: ia32_syscalls %s (%s)", mech, note)
	}
	if mech, _, _ := findLayer(plan, "strict: ia32_syscalls"); mech != MechKill {
		t.Errorf("strict: ia32_syscalls %s, want %s", mech, MechKill)
	}
	// Without LSM, ops' own file rules rest on the backstop's x86_64
	// numbers: its 32-bit calls are killed too, and its line says why.
	plan, _ = compile(t, parse(t, perSandboxPolicy), Env{LSM: lsmEnv(t, errRefused)})
	if _, note, _ := findLayer(plan, "ops: ia32_syscalls"); !strings.Contains(note, "file rules judged at open by the backstop") || strings.Contains(note, "refused by sandbox") {
		t.Errorf("no LSM: ops: ia32_syscalls %q", note)
	}
}
