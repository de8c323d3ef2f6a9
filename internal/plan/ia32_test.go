package plan

import (
	"strings"
	"testing"

	"github.com/watcherhq/watcher/internal/enforce/rules"
	"github.com/watcherhq/watcher/internal/launch/ia32"
)

// TestIA32Unavailable: on a kernel without 32-bit system calls the plan
// has no 32-bit entries (no compat rule, nothing keyed by i386 number) and
// each sandbox's line says the kernel has none instead of claiming a
// layer, whatever the policy and the hooks; nothing is Missing for them
// under require_lsm. The same policy on a kernel with them still kills
// them for the sandbox that refuses them.
func TestIA32Unavailable(t *testing.T) {
	for _, lsmErr := range []error{nil, errRefused} {
		env := Env{LSM: lsmEnv(t, lsmErr), IA32: ia32.ErrUnavailable, RequireLSM: true}
		plan, _ := compile(t, parse(t, perSandboxPolicy), env)
		for _, sb := range []string{"strict", "ops"} {
			r := plan.Backstop.For(plan.SandboxIDs[sb])
			if r.Compat.Action != rules.ActionAllow || !r.NoI386 {
				t.Errorf("lsm %v: %s: compat %+v NoI386 %v, want allow and true", lsmErr, sb, r.Compat, r.NoI386)
			}
			mech, note, ok := findLayer(plan, sb+": ia32_syscalls")
			if !ok || mech != MechUnavailable || !strings.Contains(note, "not available on this kernel") || strings.Contains(note, "killed") {
				t.Errorf("lsm %v: %s: ia32_syscalls %q (%s), want %s saying the kernel has none", lsmErr, sb, mech, note, MechUnavailable)
			}
		}
		for _, m := range plan.Missing {
			if strings.Contains(m, "ia32") {
				t.Errorf("lsm %v: Missing %q: nothing is missing for calls the kernel does not run", lsmErr, m)
			}
		}
		for _, l := range plan.Layers {
			if strings.Contains(l.Note, "i386") {
				t.Errorf("lsm %v: %s names i386 calls: %s", lsmErr, l.Rule, l.Note)
			}
		}
	}
	// The neighbour: with 32-bit calls on, strict's refusal holds.
	plan, _ := compile(t, parse(t, perSandboxPolicy), Env{LSM: lsmEnv(t, errRefused)})
	if c := plan.Backstop.For(plan.SandboxIDs["strict"]); c.Compat.Action != rules.ActionKill || c.NoI386 {
		t.Errorf("32-bit on: strict compat %+v NoI386 %v, want kill", c.Compat, c.NoI386)
	}
}
