package plan

import (
	"slices"
	"strings"
	"testing"

	"github.com/watcherhq/watcher/internal/enforce/rules"
	"github.com/watcherhq/watcher/internal/enforce/rules/backstoprules"
)

const hostStatePolicy = `version: 1
sandboxes:
  - name: denied
    select: {cgroups: [/a]}
    operations:
      capabilities:
        default: block
        rules: [{cap: SYS_ADMIN, action: block}]
  - name: granted
    select: {cgroups: [/b]}
    operations:
      other_processes: allow
      terminals: allow
      capabilities:
        default: block
        rules: [{cap: SYS_TIME, action: allow}, {cap: NET_ADMIN, action: allow}, {cap: SYS_ADMIN, action: allow}, {cap: SYSLOG, action: allow}]
`

// TestHostStatePerSandbox: without the capable hook, each sandbox's
// capability rules decide which host-state entries the backstop kills,
// and the own-subtree categories follow operations.other_processes and
// terminals; a sandbox granting them gets none, and the layer table says
// what is judged at entry and what after the fact.
func TestHostStatePerSandbox(t *testing.T) {
	plan, _ := compile(t, parse(t, hostStatePolicy), Env{LSM: lsmEnv(t, errRefused)})
	has := func(sr backstoprules.SandboxRules, name string) bool {
		return slices.ContainsFunc(sr.Syscalls, func(s backstoprules.SyscallRule) bool {
			return s.Name == name && s.Action == rules.ActionKill
		})
	}
	denied := plan.Backstop.For(plan.SandboxIDs["denied"])
	for _, name := range []string{"settimeofday", "clock_settime", "sethostname", "setdomainname"} {
		if !has(denied, name) {
			t.Errorf("denied: %s not killed", name)
		}
	}
	for what, r := range map[string]backstoprules.Rule{"clock_adjust": denied.ClockAdjust, "namespaces": denied.Namespaces,
		"syslog": denied.Syslog, "quota": denied.Quota, "net_config": denied.NetConfig,
		"other_task": denied.OtherTask, "tty_inject": denied.TTYInject,
		"cap_use SYS_TIME": denied.CapUse[25], "cap_use NET_ADMIN": denied.CapUse[12]} {
		if r.Action != rules.ActionKill || r.ID == 0 {
			t.Errorf("denied: %s = %+v, want kill with a rule id", what, r)
		}
	}
	if _, ok := denied.CapUse[21]; ok {
		t.Error("denied: CAP_SYS_ADMIN judged on use (silent probes on every mmap)")
	}
	granted := plan.Backstop.For(plan.SandboxIDs["granted"])
	for _, name := range []string{"settimeofday", "sethostname"} {
		if has(granted, name) {
			t.Errorf("granted: %s killed although the capability is granted", name)
		}
	}
	for what, r := range map[string]backstoprules.Rule{"clock_adjust": granted.ClockAdjust, "namespaces": granted.Namespaces,
		"net_config": granted.NetConfig, "other_task": granted.OtherTask, "tty_inject": granted.TTYInject} {
		if r.Action != rules.ActionAllow {
			t.Errorf("granted: %s = %+v, want allow", what, r)
		}
	}
	if len(granted.CapUse) != 0 {
		t.Errorf("granted: capability use judged: %+v", granted.CapUse)
	}
	line := layerNote(t, plan, "denied: host state (CAP_SYS_TIME)")
	for _, want := range []string{"the call itself completes before the process dies", "after the fact", "user memory"} {
		if !strings.Contains(line, want) {
			t.Errorf("CAP_SYS_TIME line lacks %q: %s", want, line)
		}
	}
	if line := layerNote(t, plan, "denied: other-processes"); !strings.Contains(line, "after the fact") || !strings.Contains(line, "not judged") {
		t.Errorf("other-processes line: %s", line)
	}
}

func layerNote(t *testing.T, p *Plan, rule string) string {
	t.Helper()
	for _, l := range p.Layers {
		if l.Rule == rule {
			return l.Note
		}
	}
	t.Fatalf("no layer line %q", rule)
	return ""
}
