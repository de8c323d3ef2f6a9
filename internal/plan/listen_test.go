package plan

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/watcherhq/watcher/internal/enforce/rules"
	"github.com/watcherhq/watcher/internal/enforce/rules/cgrouprules"
)

const listenPolicy = `version: 1
sandboxes:
  - name: web
    select: {cgroups: [/web]}
    preset: dev
    listen: {ports: ["8080", "9000-9100"]}
  - name: quiet
    select: {cgroups: [/quiet]}
    preset: restricted
  - name: trial
    select: {cgroups: [/trial]}
    preset: dev
    mode: record
  - name: open
    select: {cgroups: [/open]}
    listen: {action: allow}
`

func TestListenRulesAndLayers(t *testing.T) {
	plan, _ := compile(t, parse(t, listenPolicy), Env{LSM: lsmEnv(t, errRefused)})
	bySandbox := map[uint32]cgrouprules.ListenRule{}
	for _, r := range plan.Listen {
		bySandbox[r.Sandbox] = r
	}
	web, quiet, trial, open := bySandbox[plan.SandboxIDs["web"]], bySandbox[plan.SandboxIDs["quiet"]],
		bySandbox[plan.SandboxIDs["trial"]], plan.SandboxIDs["open"]
	if fmt.Sprint(web.Ports) != "[{8080 8080} {9000 9100}]" || web.Action != rules.ActionBlock || web.RuleID == 0 {
		t.Errorf("web rule %+v, want ports 8080 and 9000-9100, block", web)
	}
	if quiet.Sandbox == 0 || len(quiet.Ports) != 0 || quiet.Action != rules.ActionBlock {
		t.Errorf("restricted preset rule %+v, want no ports, block", quiet)
	}
	// Record mode is the sandbox flag's business: the rule still blocks.
	if trial.Action != rules.ActionBlock || plan.Flags[trial.Sandbox]&rules.SandboxRecordOnly == 0 {
		t.Errorf("record-mode sandbox rule %+v flags %d", trial, plan.Flags[trial.Sandbox])
	}
	if _, ok := bySandbox[open]; ok {
		t.Errorf("listen: allow compiled a rule: %+v", bySandbox[open])
	}

	mech, note, ok := findLayer(plan, "web: "+listenRule)
	if !ok || mech != MechCgroupBPF || !strings.Contains(note, "ports 8080, 9000-9100") || !strings.Contains(note, "after the fact") {
		t.Errorf("web layer %q %q", mech, note)
	}
	if mech, note, _ := findLayer(plan, "trial: "+listenRule); mech != MechRecord || !strings.Contains(note, "mode: record") {
		t.Errorf("record-mode layer %q %q", mech, note)
	}
	if mech, note, _ := findLayer(plan, "open: "+listenRule); !strings.HasPrefix(note, "allow") {
		t.Errorf("allow layer %q %q", mech, note)
	}
}

func TestListenWithoutCgroupBPFIsMissing(t *testing.T) {
	plan, _ := compile(t, parse(t, listenPolicy), Env{LSM: lsmEnv(t, errRefused), CgroupBPF: errors.New("no cgroup2")})
	if len(plan.Listen) != 0 {
		t.Errorf("rules without cgroup BPF: %+v", plan.Listen)
	}
	if mech, _, _ := findLayer(plan, "web: "+listenRule); mech != MechNone {
		t.Errorf("layer %q, want %q", mech, MechNone)
	}
	if !slices.ContainsFunc(plan.Missing, func(m string) bool { return strings.HasPrefix(m, "web: "+listenRule) }) {
		t.Errorf("Missing %v lacks the listen rule", plan.Missing)
	}
}
