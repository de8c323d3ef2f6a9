package plan

// The layer table: mechanism names, policy actions as kernel actions, and
// add, the one place a rule's line in Plan.Layers (mechanism, mode,
// action) and its Missing entry are decided. The backstop's syscall and
// category rules of the sandbox being compiled are raised here too (per
// sandbox: another sandbox's rules never change them).

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/watcherhq/watcher/internal/control"
	"github.com/watcherhq/watcher/internal/enforce/rules"
	"github.com/watcherhq/watcher/internal/enforce/rules/backstoprules"
	"github.com/watcherhq/watcher/internal/enforce/rules/cgrouprules"
	"github.com/watcherhq/watcher/internal/enforce/rules/lsmrules"
	"github.com/watcherhq/watcher/internal/enforce/rules/tracerules"
	"github.com/watcherhq/watcher/internal/policy"
)

// Mechanisms named in Plan.Layers: the names the layers put in their
// events, defined once by each layer's package.
const (
	MechLSM     = lsmrules.MechLSM
	MechFmodRet = lsmrules.MechFmodRet // the LSM layer's decisions as fmod_ret programs on security_* functions
	// MechEntry: fentry programs on the syscalls' own entry points kill
	// the caller at entry (as the backstop, without its host-wide tax).
	MechEntry     = lsmrules.MechFentry
	MechCgroupBPF = cgrouprules.Mechanism
	MechKill      = backstoprules.Mechanism
	// MechLaunch is watcher exec's pair: its refusals are events of
	// mechanism "seccomp" or "landlock".
	MechLaunch = tracerules.MechanismSeccomp + "+" + tracerules.MechanismLandlock
	MechRecord = "record"
	MechNone   = "none"
	// MechUnavailable: the kernel itself offers no such operation (32-bit
	// system calls where IA-32 emulation is off), so there is nothing to
	// enforce and no layer to claim.
	MechUnavailable = "n/a"
)

func (c *compiler) hook(name string) bool {
	err, ok := c.env.LSM[name]
	return ok && err == nil
}

func (c *compiler) hookErr(name string) string {
	if err, ok := c.env.LSM[name]; ok && err != nil {
		return err.Error()
	}
	if err, ok := c.env.LSM["*"]; ok && err != nil {
		return err.Error()
	}
	return "not loaded"
}

// lsmMechanism names the LSM layer as this host runs it: "lsm" (BPF LSM
// programs), "fmod_ret" (the same decisions on the security_* functions,
// where BPF LSM is built but not enabled), or "lsm" with a note naming
// the hooks that run as fmod_ret when both are in use.
func (c *compiler) lsmMechanism(notes []string) (string, []string) {
	var fmod, lsmHooks []string
	for hook, err := range c.env.LSM {
		if err != nil || hook == "*" || c.env.LSMMech[hook] == lsmrules.MechFentry {
			continue
		}
		if c.env.LSMMech[hook] == lsmrules.MechFmodRet {
			fmod = append(fmod, hook)
		} else {
			lsmHooks = append(lsmHooks, hook)
		}
	}
	switch {
	case len(fmod) == 0:
		return MechLSM, notes
	case len(lsmHooks) == 0:
		return MechFmodRet, notes
	}
	sort.Strings(fmod)
	return MechLSM, append(slices.Clone(notes), "fmod_ret for "+strings.Join(fmod, ", "))
}

// kernelAction maps a policy action to the kernel's.
func kernelAction(a policy.Action) uint32 {
	switch a {
	case policy.ActionRecord:
		return rules.ActionRecord
	case policy.ActionBlock:
		return rules.ActionBlock
	case policy.ActionKill:
		return rules.ActionKill
	}
	return rules.ActionAllow
}

// backstopAction is kernelAction for the backstop, which cannot refuse:
// block is carried out as a kill.
func backstopAction(a policy.Action) uint32 {
	if a == policy.ActionBlock {
		return rules.ActionKill
	}
	return kernelAction(a)
}

func blocking(a policy.Action) bool { return a == policy.ActionBlock || a == policy.ActionKill }

func orAllow(a policy.Action) policy.Action {
	if a == "" {
		return policy.ActionAllow
	}
	return a
}

func actionWord(a uint32) string {
	switch a {
	case rules.ActionRecord:
		return "record"
	case rules.ActionBlock:
		return "block"
	case rules.ActionKill:
		return "kill"
	}
	return "allow"
}

// layer describes how one rule is enforced before mode and action are
// applied to the description.
type layer struct {
	mech       string
	notes      []string
	lsmMissing []string // LSM hooks the rule would use that did not load
	lsmOnly    bool     // only an LSM hook enforces it (see Plan.Missing)
}

// hooks reports whether every hook of names loaded.
func (c *compiler) hooks(names ...string) bool {
	for _, h := range names {
		if !c.hook(h) {
			return false
		}
	}
	return len(names) > 0
}

// choose is the rule-to-layer choice for one rule BPF LSM can enforce,
// made here for every such rule: the LSM layer when every hook the rule
// needs loaded on this host, else fallback (the kill backstop, cgroup BPF,
// or nothing). A fallback that cannot refuse before the fact (the backstop,
// nothing) keeps the hooks that did not load, so add makes the rule a
// Missing entry under require_lsm. The section writes its kernel tables for
// the layer chosen here, so the table and the layer line cannot disagree.
func (c *compiler) choose(fallback string, hooks ...string) layer {
	var missing []string
	for _, h := range hooks {
		if !c.hook(h) {
			missing = append(missing, h)
		}
	}
	if len(missing) == 0 {
		return layer{mech: MechLSM}
	}
	l := layer{mech: fallback}
	if fallback == MechKill || fallback == MechNone {
		l.lsmMissing = missing
	}
	return l
}

// add appends the Layers line of a rule of sb with action a, and the
// Missing entry when it is due. It returns the line's index.
func (c *compiler) add(sb *policy.Sandbox, rule string, a policy.Action, l layer) int {
	a = orAllow(a)
	mech := l.mech
	notes := l.notes
	if mech == MechLSM {
		mech, notes = c.lsmMechanism(notes)
	}
	switch {
	case a == policy.ActionAllow:
		notes = append([]string{"allow"}, notes...)
	case sb.Mode == policy.ModeRecord:
		if mech != MechNone {
			notes = append([]string{fmt.Sprintf("mode: record (%s would be enforced by %s)", a, mech)}, notes...)
			mech = MechRecord
		}
	case a == policy.ActionRecord:
		if mech != MechNone {
			notes = append([]string{"recorded by " + mech}, notes...)
			mech = MechRecord
		} else {
			notes = append([]string{"record (nothing records it on this host)"}, notes...)
		}
	case mech == MechKill || mech == MechEntry:
		// Never "block" where the kernel only kills afterwards.
		what := "killed, stopped after the fact"
		if a == policy.ActionBlock {
			what = "policy says block; killed, stopped after the fact (no layer refuses it here)"
		}
		notes = append([]string{what}, notes...)
	default:
		notes = append([]string{string(a)}, notes...)
	}
	line := control.Layer{Rule: sb.Name + ": " + rule, Mechanism: mech, Note: strings.Join(notes, "; ")}
	c.plan.Layers = append(c.plan.Layers, line)
	if sb.Mode != policy.ModeRecord && blocking(a) {
		switch {
		case c.requireLSM && len(l.lsmMissing) > 0:
			var why []string
			for _, h := range l.lsmMissing {
				why = append(why, "lsm/"+h+": "+c.hookErr(h))
			}
			c.plan.Missing = append(c.plan.Missing, fmt.Sprintf("%s: %s (%s; falls back to %s)", sb.Name, rule, strings.Join(why, ", "), l.mech))
		case l.mech == MechNone && (!l.lsmOnly || c.requireLSM):
			c.plan.Missing = append(c.plan.Missing, fmt.Sprintf("%s: %s (no mechanism on this host)", sb.Name, rule))
		}
	}
	return len(c.plan.Layers) - 1
}

// bsSyscall raises the backstop rule of a syscall, for the sandbox being
// compiled, to action (the strictest of its own rules on that syscall).
func (c *compiler) bsSyscall(name string, action, id uint32) {
	if cur, ok := c.syscalls[name]; !ok || action > cur.Action {
		c.syscalls[name] = backstoprules.Rule{Action: action, ID: id}
	}
}

// bsCategory raises a backstop category rule of the sandbox being compiled
// to action.
func (c *compiler) bsCategory(sel func(*backstoprules.SandboxRules) *backstoprules.Rule, action, id uint32) {
	r := sel(c.bs)
	if action > r.Action || r.ID == 0 && action == r.Action {
		*r = backstoprules.Rule{Action: action, ID: id}
	}
}
