package plan

import (
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/rules"
	"github.com/watcherhq/watcher/internal/enforce/rules/lsmrules"
	"github.com/watcherhq/watcher/internal/policy"
)

// Mappings below vm.mmap_min_addr ask CAP_SYS_RAWIO without the capable
// hook: the line of the rule deciding that capability names the
// mmap_addr hook where it loads, and says what covers it where not (the
// backstop's low-mapping category, after the fact, each sandbox its own
// action; watcher exec's seccomp before the fact);
// the seccomp filter refuses them for a blocking rule in an enforce-mode
// sandbox.
func TestLowMappingsLayer(t *testing.T) {
	p := parse(t, `version: 1
sandboxes:
  - {name: base, select: {cgroups: [/a]}}
  - {name: trial, select: {cgroups: [/b]}, mode: record}
  - name: rec
    select: {cgroups: [/c]}
    operations: {capabilities: {rules: [{cap: CAP_SYS_RAWIO, action: record}]}}
  - name: strict
    select: {cgroups: [/d]}
    operations: {capabilities: {default: block, rules: [{cap: CAP_CHOWN, action: allow}]}}
  - name: free
    select: {cgroups: [/e]}
    operations: {capabilities: {rules: [{cap: CAP_SYS_RAWIO, action: allow}]}}
`)
	// Every sandbox starts from the baseline, whose default refuses
	// CAP_SYS_RAWIO; strict leaves it to its own default.
	for i := range p.Sandboxes {
		if sb := &p.Sandboxes[i]; sb.Name == "strict" {
			sb.Operations.Capabilities.Rules = slices.DeleteFunc(sb.Operations.Capabilities.Rules,
				func(r policy.CapabilityRule) bool {
					n, _ := policy.CapabilityNumber(r.Cap)
					return n == unix.CAP_SYS_RAWIO
				})
		}
	}
	want := map[string]policy.Action{"base": policy.ActionBlock, "trial": policy.ActionBlock, "rec": policy.ActionRecord, "strict": policy.ActionBlock, "free": policy.ActionAllow}
	for i := range p.Sandboxes {
		sb := &p.Sandboxes[i]
		if got := sb.CapabilityAction(unix.CAP_SYS_RAWIO); got != want[sb.Name] {
			t.Fatalf("%s: CAP_SYS_RAWIO %s, want %s (fixture)", sb.Name, got, want[sb.Name])
		}
	}
	rawioLine := func(plan *Plan, sb string) (string, string) {
		t.Helper()
		// The baseline leaves CAP_SYS_RAWIO to its default (block).
		rule := sb + ": capability CAP_SYS_RAWIO"
		if sb == "strict" || sb == "base" || sb == "trial" {
			rule = sb + ": capabilities (default)"
		}
		for _, l := range plan.Layers {
			if l.Rule == rule {
				return l.Mechanism, l.Note
			}
		}
		t.Fatalf("no layer %q", rule)
		return "", ""
	}
	fmod := map[string]string{}
	for h := range lsmEnv(t, nil) {
		fmod[h] = lsmrules.MechFmodRet
	}
	hosts := []struct {
		name string
		env  Env
		mech string
	}{
		{"lsm", Env{LSM: lsmEnv(t, nil)}, MechLSM},
		{"fmod_ret", Env{LSM: lsmEnv(t, nil), LSMMech: fmod}, MechFmodRet},
	}
	for _, h := range hosts {
		plan, _ := compile(t, p, h.env)
		for _, sb := range []string{"base", "strict"} {
			mech, note := rawioLine(plan, sb)
			if mech != h.mech || !strings.Contains(note, "lsm mmap_addr: mappings below vm.mmap_min_addr") {
				t.Errorf("%s host: %s: %s (%s), want %s naming mmap_addr", h.name, sb, mech, note, h.mech)
			}
			caps := plan.LSM[plan.SandboxIDs[sb]].Caps
			if !slices.ContainsFunc(caps, func(c lsmrules.CapRule) bool {
				return c.Cap == unix.CAP_SYS_RAWIO && c.Action == rules.ActionBlock
			}) {
				t.Errorf("%s host: %s: no blocking CAP_SYS_RAWIO rule for the hooks: %+v", h.name, sb, caps)
			}
		}
		if mech, note := rawioLine(plan, "rec"); mech != MechRecord || !strings.Contains(note, "recorded by "+h.mech) || !strings.Contains(note, "mmap_addr") {
			t.Errorf("%s host: rec: %s (%s), want recorded by %s with mmap_addr", h.name, mech, note, h.mech)
		}
		for name, sid := range plan.SandboxIDs {
			if lm := plan.Backstop.For(sid).LowMapping; lm.Action != rules.ActionAllow {
				t.Errorf("%s host: %s: backstop low-mapping rule %+v, want none (the hook refuses them)", h.name, name, lm)
			}
		}
	}

	// This host: no LSM, no fmod_ret. The backstop kills them after the
	// fact, each sandbox with its own rule's action (rec records, free is
	// left alone), and the line says so.
	plan, _ := compile(t, p, Env{LSM: lsmEnv(t, errRefused)})
	for _, sb := range []string{"base", "strict"} {
		mech, note := rawioLine(plan, sb)
		if mech != MechNone || !strings.Contains(note, "no mmap_addr hook here; backstop: killed when mmap, mremap, shmat or an i386 mapping call returns with one, not refused") ||
			!strings.Contains(note, "another thread of the process could use it in that window") || !strings.Contains(note, "at exec when the ELF loader mapped one") ||
			strings.Contains(note, "not refused for other members") {
			t.Errorf("no-LSM host: %s: %s (%s)", sb, mech, note)
		}
	}
	wantLow := map[string]uint32{"base": rules.ActionKill, "strict": rules.ActionKill, "trial": rules.ActionKill,
		"rec": enforce.ActionRecord, "free": enforce.ActionAllow}
	for name, a := range wantLow {
		lm := plan.Backstop.For(plan.SandboxIDs[name]).LowMapping
		if lm.Action != a || (a != rules.ActionAllow) != (lm.ID != 0) {
			t.Errorf("no-LSM host: %s: backstop low-mapping rule %+v, want action %d with a rule id", name, lm, a)
		}
	}
	if !plan.Backstop.NeedsSyscallTracepoints() {
		t.Error("no-LSM host: the low-mapping rule needs sys_exit, NeedsSyscallTracepoints is false")
	}
	for _, sb := range []string{"rec", "trial"} {
		if _, note := rawioLine(plan, sb); !strings.Contains(note, "recorded by the backstop when mmap, mremap, shmat, an i386 mapping call or an exec leaves one") {
			t.Errorf("no-LSM host: %s: %s", sb, note)
		}
	}
	for _, l := range plan.Layers {
		if strings.Contains(l.Note, "another sandbox") {
			t.Errorf("no-LSM host: %s: %s (no sandbox's rule applies to another)", l.Rule, l.Note)
		}
	}
	// A record rule alone makes the category record.
	recOnly := parse(t, `version: 1
sandboxes:
  - name: rec
    select: {cgroups: [/c]}
    operations: {capabilities: {rules: [{cap: CAP_SYS_RAWIO, action: record}]}}
`)
	if rp, _ := compile(t, recOnly, Env{LSM: lsmEnv(t, errRefused)}); rp.Backstop.For(1).LowMapping.Action != rules.ActionRecord {
		t.Errorf("no-LSM host, one recording sandbox: low-mapping rule %+v, want record", rp.Backstop.For(1).LowMapping)
	}
	// Seccomp refuses them for the blocking rules of enforce-mode sandboxes.
	for sb, deny := range map[string]bool{"base": true, "strict": true, "rec": false, "trial": false, "free": false} {
		if got := plan.Launch[sb].Seccomp.DenyLowMappings; got != deny {
			t.Errorf("%s: DenyLowMappings %v, want %v", sb, got, deny)
		}
		_, note, _ := findLayer(plan, sb+": watcher exec")
		if deny != strings.Contains(note, "mappings below vm.mmap_min_addr refused") {
			t.Errorf("%s: watcher exec line %q", sb, note)
		}
	}
	// require_lsm: the blocking rule names the missing hook.
	plan, _ = compile(t, p, Env{LSM: lsmEnv(t, errRefused), RequireLSM: true})
	if !slices.ContainsFunc(plan.Missing, func(m string) bool {
		return strings.Contains(m, "base: capabilities (default)") && strings.Contains(m, "lsm/mmap_addr")
	}) {
		t.Errorf("Missing lacks CAP_SYS_RAWIO with lsm/mmap_addr: %v", plan.Missing)
	}
	// A host where capable loads but mmap_addr does not.
	env := lsmEnv(t, nil)
	env["mmap_addr"] = errRefused
	plan, _ = compile(t, p, Env{LSM: env})
	if _, note := rawioLine(plan, "base"); !strings.Contains(note, "lsm capable") || !strings.Contains(note, "no mmap_addr hook here; backstop: killed") {
		t.Errorf("capable without mmap_addr: %s", note)
	}
	if lm := plan.Backstop.For(1).LowMapping; lm.Action != rules.ActionKill {
		t.Errorf("capable without mmap_addr: low-mapping rule %+v, want kill", lm)
	}
}
