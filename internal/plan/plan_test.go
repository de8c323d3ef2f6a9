package plan

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/enforce/backstop"
	"github.com/watcherhq/watcher/internal/enforce/lsm"
	"github.com/watcherhq/watcher/internal/enforce/rules"
	"github.com/watcherhq/watcher/internal/enforce/rules/backstoprules"
	"github.com/watcherhq/watcher/internal/enforce/rules/cgrouprules"
	"github.com/watcherhq/watcher/internal/enforce/rules/egressrules"
	"github.com/watcherhq/watcher/internal/enforce/rules/lsmrules"
	"github.com/watcherhq/watcher/internal/policy"
)

// lsmEnv returns the LSM status of a host where every hook loads (err nil)
// or none does (err set, as on the development machines).
func lsmEnv(t *testing.T, err error) map[string]error {
	t.Helper()
	hooks := lsm.Hooks()
	if len(hooks) == 0 {
		t.Fatal("lsm.Hooks() lists no hooks: the embedded LSM object did not parse")
	}
	out := map[string]error{}
	for _, h := range hooks {
		out[h] = err
	}
	return out
}

var errRefused = fmt.Errorf("load program: %w", unix.EPERM)

func parse(t *testing.T, src string) *policy.Policy {
	t.Helper()
	p, err := policy.Parse("test.yaml", []byte(src))
	if err != nil {
		t.Fatalf("parse policy: %v", err)
	}
	return p
}

func compile(t *testing.T, p *policy.Policy, env Env) (*Plan, *RuleTable) {
	t.Helper()
	rt := NewRuleTable()
	plan, err := Compile(p, env, rt)
	if err != nil {
		t.Fatalf("compile: %v", err)
	}
	return plan, rt
}

func layerOf(t *testing.T, plan *Plan, rule string) string {
	t.Helper()
	for _, l := range plan.Layers {
		if strings.Contains(l.Rule, rule) {
			return l.Mechanism
		}
	}
	t.Fatalf("no layer for %q in %v", rule, plan.Layers)
	return ""
}

func findLayer(plan *Plan, rule string) (mech, note string, ok bool) {
	for _, l := range plan.Layers {
		if strings.Contains(l.Rule, rule) {
			return l.Mechanism, l.Note, true
		}
	}
	return "", "", false
}

func TestCompileDefaultAndPresets(t *testing.T) {
	envs := map[string]Env{
		"all-lsm": {LSM: lsmEnv(t, nil), DNSProxy4: netip.MustParseAddrPort("127.0.0.1:5300")},
		"no-lsm":  {LSM: lsmEnv(t, errRefused), DNSProxy4: netip.MustParseAddrPort("127.0.0.1:5300")},
	}
	policies := map[string]*policy.Policy{"default": policy.Default()}
	for _, preset := range policy.PresetNames() {
		policies[preset] = parse(t, fmt.Sprintf(`version: 1
sandboxes:
  - name: sb
    select: {cgroups: [/watcher/sb]}
    preset: %s
    workspace: [/srv/agent]
`, preset))
	}
	for pname, p := range policies {
		for ename, env := range envs {
			t.Run(pname+"/"+ename, func(t *testing.T) {
				plan, rt := compile(t, p, env)
				if len(plan.SandboxIDs) != len(p.Sandboxes) {
					t.Fatalf("SandboxIDs = %v", plan.SandboxIDs)
				}
				if len(plan.Layers) == 0 {
					t.Fatal("no Layers")
				}
				for _, l := range plan.Layers {
					switch l.Mechanism {
					case MechLSM, MechCgroupBPF, MechKill, MechEntry, MechLaunch, MechRecord, MechNone:
					default:
						t.Errorf("layer %q: unknown mechanism %q", l.Rule, l.Mechanism)
					}
				}
				if ename == "no-lsm" && plan.LSM != nil {
					t.Errorf("LSM rules without any LSM hook: %v", plan.LSM)
				}
				if ename == "all-lsm" && len(plan.LSM) != len(p.Sandboxes) {
					t.Errorf("LSM rules for %d sandboxes, want %d", len(plan.LSM), len(p.Sandboxes))
				}
				// Every id in the tables names a rule.
				for _, r := range plan.Backstop.Paths {
					if r.ID != 0 && rt.Name(r.ID) == "" {
						t.Errorf("backstop path %s: id %d has no name", r.Path, r.ID)
					}
					if len(r.Path) > maxRulePath {
						t.Errorf("backstop path too long: %s", r.Path)
					}
				}
				if len(plan.Backstop.Sandboxes) != len(p.Sandboxes) {
					t.Errorf("backstop rule sets for %d sandboxes, want %d", len(plan.Backstop.Sandboxes), len(p.Sandboxes))
				}
				for _, sr := range plan.Backstop.Sandboxes {
					for _, r := range sr.Syscalls {
						if _, ok := backstop.Syscalls[r.Name]; !ok || r.ID == 0 || rt.Name(r.ID) == "" {
							t.Errorf("backstop syscall %q unknown to the backstop, or id %d has no name", r.Name, r.ID)
						}
					}
				}
				for _, sb := range p.Sandboxes {
					if _, ok := plan.Launch[sb.Name]; !ok {
						t.Errorf("no launch restrictions for %s", sb.Name)
					}
					if plan.DNS.Sandboxes[sb.Name] == nil {
						t.Errorf("no DNS policy for %s", sb.Name)
					}
					if r := plan.Launch[sb.Name]; r.Files != nil {
						if err := r.Files.Validate(); err != nil {
							t.Errorf("landlock rules of %s: %v", sb.Name, err)
						}
					}
				}
			})
		}
	}
}

func TestCredentialRulesGoToLSMWhenAvailable(t *testing.T) {
	plan, rt := compile(t, policy.Default(), Env{LSM: lsmEnv(t, nil)})
	sid := plan.SandboxIDs["exec"]
	lr := plan.LSM[sid]
	var found bool
	for _, pr := range lr.Paths {
		if pr.Path == "/etc/shadow" && !pr.Prefix {
			found = true
			if pr.Action != rules.ActionBlock || rt.Name(pr.RuleID) != "cred-shadow" {
				t.Errorf("/etc/shadow LSM rule = %+v (rule %q)", pr, rt.Name(pr.RuleID))
			}
		}
	}
	if !found {
		t.Fatalf("/etc/shadow not in the LSM path rules: %+v", lr.Paths)
	}
	for _, pr := range plan.Backstop.Paths {
		if pr.Ops&(backstoprules.OpRead|backstoprules.OpWrite) != 0 {
			t.Errorf("file rule in the backstop although file_open loads: %+v", pr)
		}
	}
	if got := layerOf(t, plan, "cred-shadow"); got != MechLSM {
		t.Errorf("cred-shadow layer = %s, want lsm", got)
	}
	if d := lr.Ops[lsmrules.OpPtraceAttach]; d.Action != rules.ActionBlock {
		t.Errorf("ptrace attach op = %+v", d)
	}
	if d := lr.Ops[lsmrules.OpProcMem]; d.Action != rules.ActionBlock || rt.Name(d.RuleID) != "proc-mem" {
		t.Errorf("proc mem op = %+v", d)
	}
	for _, s := range plan.Backstop.For(1).Syscalls {
		if s.Name == "ptrace" || s.Name == "mount" || s.Name == "bpf" {
			t.Errorf("%s in the backstop although its LSM hook loads", s.Name)
		}
	}
	// No hook of their own: judged by the capability they ask for in
	// that syscall (the mount and module rules' decisions), io_uring at
	// its entry points; none stays with the backstop.
	for _, name := range []string{"mount_setattr", "delete_module", "io_uring_enter"} {
		if slices.ContainsFunc(plan.Backstop.For(1).Syscalls, func(s backstoprules.SyscallRule) bool { return s.Name == name }) {
			t.Errorf("%s in the backstop although the capable hook and fentry load", name)
		}
	}
	if plan.Backstop.For(1).IOUring.Action != 0 || lr.Ops[lsmrules.OpIOUring].Action != rules.ActionBlock {
		t.Errorf("io_uring: backstop %+v, lsm op %+v", plan.Backstop.For(1).IOUring, lr.Ops[lsmrules.OpIOUring])
	}
	if lr.Ops[lsmrules.OpMount].Action != rules.ActionBlock || lr.Ops[lsmrules.OpKernelLoadData].Action != rules.ActionBlock ||
		lr.Ops[lsmrules.OpKernelIface].Action != rules.ActionBlock || lr.Ops[lsmrules.OpKeyring].Action != rules.ActionBlock {
		t.Errorf("ops for the syscall-scoped checks: mount %+v module %+v kernel %+v keyring %+v", lr.Ops[lsmrules.OpMount],
			lr.Ops[lsmrules.OpKernelLoadData], lr.Ops[lsmrules.OpKernelIface], lr.Ops[lsmrules.OpKeyring])
	}
	if len(plan.Missing) != 0 {
		t.Errorf("Missing with every hook loaded: %v", plan.Missing)
	}
	// Capabilities through the capable hook.
	caps := map[int]uint32{}
	for _, c := range lr.Caps {
		caps[c.Cap] = c.Action
	}
	// Default-deny: the presets grant four, the rest are refused.
	if caps[unix.CAP_SYS_MODULE] != rules.ActionBlock || caps[unix.CAP_SYS_ADMIN] != rules.ActionBlock ||
		caps[unix.CAP_NET_ADMIN] != rules.ActionBlock || caps[unix.CAP_CHOWN] != rules.ActionAllow {
		t.Errorf("capability rules = %v", caps)
	}
}

func TestCredentialRulesGoToBackstopWithoutLSM(t *testing.T) {
	plan, rt := compile(t, policy.Default(), Env{LSM: lsmEnv(t, errRefused)})
	sid := plan.SandboxIDs["exec"]
	var shadow *backstoprules.PathRule
	for i, pr := range plan.Backstop.Paths {
		if pr.Path == "/etc/shadow" && !pr.Prefix && pr.SandboxID == sid {
			shadow = &plan.Backstop.Paths[i]
		}
	}
	if shadow == nil {
		t.Fatalf("/etc/shadow not in the backstop: %+v", plan.Backstop.Paths)
	}
	if shadow.Action != rules.ActionKill || shadow.Ops&(backstoprules.OpRead|backstoprules.OpWrite) != backstoprules.OpRead|backstoprules.OpWrite ||
		rt.Name(shadow.ID) != "cred-shadow" {
		t.Errorf("/etc/shadow backstop rule = %+v (rule %q)", *shadow, rt.Name(shadow.ID))
	}
	mech, note, _ := findLayer(plan, "cred-shadow")
	if mech != MechKill || !strings.Contains(note, "kill") {
		t.Errorf("cred-shadow layer = %s (%s), want kill", mech, note)
	}
	for _, op := range []string{": ptrace", ": mount", ": module", ": bpf"} {
		if got := layerOf(t, plan, op); got != MechKill {
			t.Errorf("%s layer = %s, want kill", op, got)
		}
	}
	want := []string{"ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "mount", "umount2",
		"move_mount", "pivot_root", "chroot", "fsopen", "fsconfig", "init_module", "finit_module", "bpf"}
	for _, w := range want {
		i := slices.IndexFunc(plan.Backstop.For(1).Syscalls, func(s backstoprules.SyscallRule) bool { return s.Name == w })
		if i < 0 || plan.Backstop.For(1).Syscalls[i].Action != rules.ActionKill {
			t.Errorf("backstop syscall %s missing or not kill", w)
		}
	}
	if plan.Backstop.For(1).ProcMem.Action != rules.ActionKill || plan.Backstop.For(1).CgroupWrite.Action != rules.ActionKill ||
		plan.Backstop.For(1).CloneFiles.Action != rules.ActionKill || plan.Backstop.For(1).SignalAgent.Action != rules.ActionKill {
		t.Errorf("backstop categories = %+v", plan.Backstop)
	}
	// Devices, /proc/sys and raw sockets still get a real EPERM.
	if got := layerOf(t, plan, "procsys-write"); got != MechCgroupBPF {
		t.Errorf("procsys-write layer = %s, want cgroup_bpf", got)
	}
	if !slices.ContainsFunc(plan.Sysctl, func(r cgrouprules.SysctlRule) bool {
		return r.Sandbox == sid && r.Name == "" && r.Write && r.Action == rules.ActionBlock
	}) {
		t.Errorf("no sysctl write rule: %+v", plan.Sysctl)
	}
	if !slices.ContainsFunc(plan.Devices, func(r cgrouprules.DeviceRule) bool {
		return r.Sandbox == sid && r.Type == cgrouprules.CharDevice && r.Major == 1 && r.Minor == 1 && r.Action == rules.ActionBlock
	}) {
		t.Errorf("no /dev/mem device rule: %+v", plan.Devices)
	}
	if !slices.ContainsFunc(plan.Sockets, func(r cgrouprules.SocketRule) bool { return r.Type == unix.SOCK_RAW && r.Sandbox == sid }) {
		t.Errorf("no raw socket rule: %+v", plan.Sockets)
	}
	// The kill at open must not pre-empt cgroup/sysctl's EPERM.
	for _, pr := range plan.Backstop.Paths {
		if (strings.HasPrefix(pr.Path, "/proc/sys/") || pr.Path == "/proc/sys") && pr.Ops&backstoprules.OpWrite != 0 && pr.Action != rules.ActionAllow {
			t.Errorf("backstop kills /proc/sys writes that cgroup/sysctl refuses: %+v", pr)
		}
	}
	// Without RequireLSM, a kill backstop is enforcement, and rules only
	// an LSM hook judges (capabilities, other_ipc, notify_marks) are not
	// missing: `watcher status` stays healthy on such a host.
	if len(plan.Missing) != 0 {
		t.Errorf("Missing without RequireLSM: %v", plan.Missing)
	}
	for _, m := range plan.Missing {
		if strings.Contains(m, "ptrace") || strings.Contains(m, "cred-shadow") {
			t.Errorf("Missing without RequireLSM: %s", m)
		}
	}
}

func TestRequireLSMMissing(t *testing.T) {
	plan, _ := compile(t, policy.Default(), Env{LSM: lsmEnv(t, errRefused), RequireLSM: true})
	for _, want := range []string{"ptrace", "cred-shadow", "mount", "capabilities (default)"} {
		if !slices.ContainsFunc(plan.Missing, func(m string) bool { return strings.Contains(m, want) }) {
			t.Errorf("Missing lacks %s: %v", want, plan.Missing)
		}
	}
	for _, m := range plan.Missing {
		if strings.Contains(m, "devices") || strings.Contains(m, "procsys-write") || strings.Contains(m, "raw_sockets") {
			t.Errorf("Missing lists a rule cgroup BPF blocks: %s", m)
		}
		if !strings.Contains(m, "operation not permitted") {
			t.Errorf("Missing entry does not say why: %s", m)
		}
	}
	// The policy's own require_lsm has the same effect.
	p := policy.Default()
	p.Agent.RequireLSM = true
	plan, _ = compile(t, p, Env{LSM: lsmEnv(t, errRefused)})
	if len(plan.Missing) == 0 {
		t.Error("agent.require_lsm: no Missing")
	}
	// One hook refused: only its rules are missing.
	env := lsmEnv(t, nil)
	env["sb_mount"] = errRefused
	plan, _ = compile(t, policy.Default(), Env{LSM: env, RequireLSM: true})
	if len(plan.Missing) != 1 || !strings.Contains(plan.Missing[0], "mount") || !strings.Contains(plan.Missing[0], "lsm/sb_mount") {
		t.Errorf("Missing with sb_mount refused = %v", plan.Missing)
	}
	if !slices.ContainsFunc(plan.Backstop.For(1).Syscalls, func(s backstoprules.SyscallRule) bool { return s.Name == "mount" }) ||
		slices.ContainsFunc(plan.Backstop.For(1).Syscalls, func(s backstoprules.SyscallRule) bool { return s.Name == "umount2" }) {
		t.Errorf("with only sb_mount refused the backstop should kill mount and not umount2: %+v", plan.Backstop.For(1).Syscalls)
	}
	// Record mode requires nothing.
	p = parse(t, `version: 1
sandboxes:
  - {name: trial, select: {cgroups: [/t]}, mode: record}
`)
	plan, _ = compile(t, p, Env{LSM: lsmEnv(t, errRefused), RequireLSM: true})
	if len(plan.Missing) != 0 {
		t.Errorf("Missing for a record-mode sandbox: %v", plan.Missing)
	}
}

func TestRecordMode(t *testing.T) {
	p := parse(t, `version: 1
sandboxes:
  - {name: live, select: {cgroups: [/a]}, preset: restricted}
  - {name: trial, select: {cgroups: [/b]}, preset: restricted, mode: record}
`)
	plan, _ := compile(t, p, Env{LSM: lsmEnv(t, errRefused)})
	live, trial := plan.SandboxIDs["live"], plan.SandboxIDs["trial"]
	if live != 1 || trial != 2 {
		t.Fatalf("ids = %v", plan.SandboxIDs)
	}
	if plan.Flags[trial]&rules.SandboxRecordOnly == 0 || plan.Flags[live] != 0 {
		t.Errorf("flags = %v", plan.Flags)
	}
	if !plan.Egress[trial].RecordOnly || plan.Egress[live].RecordOnly {
		t.Errorf("egress record-only: live %v trial %v", plan.Egress[live].RecordOnly, plan.Egress[trial].RecordOnly)
	}
	if m := plan.DNS.Sandboxes["trial"].Detection.Mode; m != "record" {
		t.Errorf("trial DNS detection mode = %q", m)
	}
	if m := plan.DNS.Sandboxes["live"].Detection.Mode; m != "enforce" {
		t.Errorf("live DNS detection mode = %q", m)
	}
	// Record mode keeps the lists and records what they would refuse.
	if sp := plan.DNS.Sandboxes["trial"]; !sp.RecordOnly || sp.Default != "deny" {
		t.Errorf("trial DNS: record_only %v default %q, want the lists kept in record-only mode", sp.RecordOnly, sp.Default)
	}
	if plan.DNS.Sandboxes["live"].RecordOnly {
		t.Errorf("live DNS is record-only")
	}
	mech, note, _ := findLayer(plan, "trial: file rule cred-shadow")
	if mech != MechRecord || !strings.Contains(note, "kill") {
		t.Errorf("trial cred-shadow layer = %s (%s)", mech, note)
	}
	if got := layerOf(t, plan, "live: file rule cred-shadow"); got != MechKill {
		t.Errorf("live cred-shadow layer = %s", got)
	}
	if plan.Launch["trial"].Files != nil || !plan.Launch["trial"].Seccomp.AllowIOUring {
		t.Errorf("record-mode launch restrictions = %+v", plan.Launch["trial"])
	}
	if plan.Launch["live"].Files == nil || plan.Launch["live"].Seccomp.AllowIOUring {
		t.Errorf("enforce-mode launch restrictions = %+v", plan.Launch["live"])
	}
}

func TestRuleTable(t *testing.T) {
	var rt RuleTable // the zero value works
	a, b := rt.ID("cred-shadow"), rt.ID("ptrace")
	if a == 0 || b == 0 || a == b {
		t.Fatalf("ids %d %d", a, b)
	}
	if rt.ID("cred-shadow") != a || rt.Name(a) != "cred-shadow" || rt.Name(b) != "ptrace" {
		t.Error("ids do not round-trip")
	}
	if rt.Name(0) != "" || rt.Name(99) != "" || rt.ID("") != 0 {
		t.Error("unknown ids must have no name")
	}
	// Ids survive a recompile with another policy (a reload).
	rt2 := NewRuleTable()
	if _, err := Compile(policy.Default(), Env{LSM: lsmEnv(t, nil)}, rt2); err != nil {
		t.Fatal(err)
	}
	shadow := rt2.ID("cred-shadow")
	p := parse(t, `version: 1
sandboxes:
  - name: other
    select: {cgroups: [/o]}
    files: [{name: extra, path: /srv/secret, match: exact, access: any, action: block}]
`)
	plan2, err := Compile(p, Env{LSM: lsmEnv(t, nil)}, rt2)
	if err != nil {
		t.Fatal(err)
	}
	if rt2.ID("cred-shadow") != shadow {
		t.Error("id changed across compiles")
	}
	extra := rt2.ID("extra")
	if !slices.ContainsFunc(plan2.LSM[1].Paths, func(r lsmrules.PathRule) bool { return r.Path == "/srv/secret" && r.RuleID == extra }) {
		t.Errorf("new rule not compiled with its id: %+v", plan2.LSM[1].Paths)
	}
	// Concurrent readers and writers (run with -race).
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			for j := range 200 {
				rt.ID(fmt.Sprintf("r%d-%d", i, j))
			}
		}()
		go func() {
			defer wg.Done()
			for j := range 200 {
				rt.Name(uint32(j))
			}
		}()
	}
	wg.Wait()
	for i := range 4 {
		for j := range 200 {
			n := fmt.Sprintf("r%d-%d", i, j)
			if rt.Name(rt.ID(n)) != n {
				t.Fatalf("%s does not round-trip", n)
			}
		}
	}
}

func TestNetworkTranslation(t *testing.T) {
	p := parse(t, `version: 1
sandboxes:
  - name: net
    select: {cgroups: [/n]}
    preset: restricted
    dns:
      allow: [pypi.org, "*.pythonhosted.org"]
      deny: [evil.pypi.org]
      detection:
        high_cardinality: [cloudfront.net]
        rate_limit: 25
        max_distinct_names: 40
        window: 2m
    egress:
      grace_seconds: 45
      admission_ttl_cap: 2m
      name_ports:
        - {name: github.com, ports: ["22"]}
        - {name: .stun.test, ports: ["3478-3479"], protocol: udp}
      allow:
        - {cidr: 10.20.0.0/16, ports: ["443", "8000-8100"], protocol: tcp}
        - {cidr: "2001:db8::/32"}
      loopback:
        - {name: postgres, port: 5432}
  - name: open
    select: {cgroups: [/o]}
    egress: {default: allow}
  - name: closed
    select: {cgroups: [/c]}
    egress: {default: deny}
`)
	env := Env{LSM: lsmEnv(t, errRefused),
		DNSProxy4: netip.MustParseAddrPort("127.0.0.1:5300"), DNSProxy6: netip.MustParseAddrPort("[::1]:5300")}
	plan, rt := compile(t, p, env)
	cfg := plan.Egress[plan.SandboxIDs["net"]]
	if cfg.Proxy4 != env.DNSProxy4 || cfg.Proxy6 != env.DNSProxy6 || cfg.RecordOnly || rt.Name(cfg.DNSRuleID) != "dns-redirect" {
		t.Errorf("egress config = %+v", cfg)
	}
	want := []egressrules.Rule{
		{Prefix: netip.MustParsePrefix("127.0.0.0/8"), Ports: egressrules.PortRange{Lo: 5432, Hi: 5432}, Protocol: egressrules.ProtoTCP},
		{Prefix: netip.MustParsePrefix("::1/128"), Ports: egressrules.PortRange{Lo: 5432, Hi: 5432}, Protocol: egressrules.ProtoTCP},
		{Prefix: netip.MustParsePrefix("10.20.0.0/16"), Ports: egressrules.PortRange{Lo: 443, Hi: 443}, Protocol: egressrules.ProtoTCP},
		{Prefix: netip.MustParsePrefix("10.20.0.0/16"), Ports: egressrules.PortRange{Lo: 8000, Hi: 8100}, Protocol: egressrules.ProtoTCP},
		{Prefix: netip.MustParsePrefix("2001:db8::/32"), Protocol: egressrules.ProtoAny},
	}
	if len(cfg.Rules) != len(want) {
		t.Fatalf("egress rules = %+v", cfg.Rules)
	}
	for i, w := range want {
		got := cfg.Rules[i]
		if got.Prefix != w.Prefix || got.Ports != w.Ports || got.Protocol != w.Protocol || got.ID == 0 {
			t.Errorf("rule %d = %+v, want %+v", i, got, w)
		}
	}
	scope := plan.Admission["net"]
	if scope == nil || scope.TTL(time.Hour) != 2*time.Minute || scope.TTL(30*time.Second) != 30*time.Second {
		t.Errorf("admission scope %+v: want a 2m cap", scope)
	} else {
		wantSpans := map[string][]egressrules.PortSpan{
			"example.org.":   egressrules.WebPorts,
			"github.com":     append(slices.Clone(egressrules.WebPorts), egressrules.PortSpan{Lo: 22, Hi: 22, Protocol: egressrules.ProtoTCP}),
			"a.stun.test.":   append(slices.Clone(egressrules.WebPorts), egressrules.PortSpan{Lo: 3478, Hi: 3479, Protocol: egressrules.ProtoUDP}),
			"API.GitHub.com": egressrules.WebPorts,
		}
		for name, w := range wantSpans {
			if got := scope.Spans(name); !slices.Equal(got, w) {
				t.Errorf("spans of %s = %+v, want %+v", name, got, w)
			}
		}
	}
	if _, ok := plan.Admission["open"]; ok {
		t.Error("a sandbox with egress default allow has an admission scope")
	}
	if rt.Name(cfg.Rules[0].ID) != "loopback:postgres" || rt.Name(cfg.Rules[2].ID) != "egress:10.20.0.0/16" {
		t.Errorf("rule names %q %q", rt.Name(cfg.Rules[0].ID), rt.Name(cfg.Rules[2].ID))
	}
	if g, ok := plan.ResolvedEgress["net"]; !ok || g != 45*time.Second {
		t.Errorf("resolved egress of net = %v %v", g, ok)
	}
	if _, ok := plan.ResolvedEgress["closed"]; ok {
		t.Error("default deny must not admit resolved addresses")
	}
	if _, ok := plan.ResolvedEgress["open"]; ok {
		t.Error("default allow needs no admission")
	}
	open := plan.Egress[plan.SandboxIDs["open"]]
	if !slices.ContainsFunc(open.Rules, func(r egressrules.Rule) bool { return r.Prefix.Bits() == 0 && r.Prefix.Addr().Is4() }) ||
		!slices.ContainsFunc(open.Rules, func(r egressrules.Rule) bool { return r.Prefix.Bits() == 0 && r.Prefix.Addr().Is6() }) {
		t.Errorf("default allow rules = %+v", open.Rules)
	}
	if len(plan.Egress[plan.SandboxIDs["closed"]].Rules) != 0 {
		t.Errorf("default deny has rules: %+v", plan.Egress[plan.SandboxIDs["closed"]].Rules)
	}

	d := plan.DNS.Sandboxes["net"]
	if d.Default != "deny" || !slices.Equal(d.Allow, []string{"pypi.org", "*.pythonhosted.org"}) || !slices.Equal(d.Deny, []string{"evil.pypi.org"}) {
		t.Errorf("dns lists = %+v", d)
	}
	if !slices.Contains(d.HighCardinality, "cloudfront.net") || d.RateLimit.QPS != 25 {
		t.Errorf("dns high-cardinality / rate = %+v", d)
	}
	if d.Detection.Mode != "enforce" || d.Detection.MaxDistinctNames != 40 || time.Duration(d.Detection.Window) != 2*time.Minute {
		t.Errorf("dns detection = %+v", d.Detection)
	}
	if d := plan.DNS.Sandboxes["open"]; d.Default != "allow" {
		t.Errorf("baseline dns default = %q", d.Default)
	}

	// Too many port ranges on one network is refused at compile time.
	var allow []string
	for i := range 9 {
		allow = append(allow, fmt.Sprintf(`{cidr: 10.0.0.0/8, ports: ["%d"]}`, 1000+i))
	}
	bad := parse(t, "version: 1\nsandboxes:\n  - name: x\n    select: {cgroups: [/x]}\n    egress:\n      allow: ["+strings.Join(allow, ", ")+"]\n")
	if _, err := Compile(bad, env, NewRuleTable()); err == nil || !strings.Contains(err.Error(), "10.0.0.0/8") {
		t.Errorf("9 port ranges on one network: err = %v", err)
	}
}

func TestWildcardExpansion(t *testing.T) {
	dir := t.TempDir()
	for _, d := range []string{"alice/.ssh", "bob", "carol/.ssh"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "notadir"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	p := parse(t, fmt.Sprintf(`version: 1
sandboxes:
  - name: w
    select: {cgroups: [/w]}
    files:
      - {name: keys, path: %s/*/.ssh/, match: prefix, access: any, action: block}
      - {name: mems, path: /proc/*/mem, match: exact, access: any, action: record}
      - {name: mems, path: /proc/*/task/*/mem, match: exact, access: any, action: record}
`, dir))
	want := []string{dir + "/alice/.ssh/", dir + "/bob/.ssh/", dir + "/carol/.ssh/"}

	plan, rt := compile(t, p, Env{LSM: lsmEnv(t, nil)})
	var got []string
	for _, r := range plan.LSM[1].Paths {
		if strings.HasPrefix(r.Path, dir) && r.Prefix {
			got = append(got, r.Path)
			if r.Action != rules.ActionBlock || rt.Name(r.RuleID) != "keys" {
				t.Errorf("%s: %+v", r.Path, r)
			}
		}
	}
	slices.Sort(got)
	// bob has no .ssh yet: the rule covers it before it is created.
	if !slices.Equal(got, want) {
		t.Errorf("expanded LSM rules = %v, want %v", got, want)
	}
	_, note, _ := findLayer(plan, "keys")
	if !strings.Contains(note, "expanded") || !strings.Contains(note, dir+"/carol/.ssh/") {
		t.Errorf("layer note does not list the expansion: %s", note)
	}
	// The sandbox's own rule overrides the baseline's proc-mem block.
	if d := plan.LSM[1].Ops[lsmrules.OpProcMem]; d.Action != rules.ActionRecord || rt.Name(d.RuleID) != "mems" {
		t.Errorf("/proc/*/mem → proc_mem op: %+v (rule %q)", d, rt.Name(d.RuleID))
	}
	for _, r := range plan.LSM[1].Paths {
		if strings.HasPrefix(r.Path, "/proc/") && strings.HasSuffix(r.Path, "/mem") || strings.Contains(r.Path, "*") {
			t.Errorf("/proc/*/mem expanded into paths: %s", r.Path)
		}
	}

	plan, rt = compile(t, p, Env{LSM: lsmEnv(t, errRefused)})
	got = nil
	for _, r := range plan.Backstop.Paths {
		if strings.HasPrefix(r.Path, dir) && r.Prefix {
			got = append(got, r.Path)
			if r.Action != rules.ActionKill {
				t.Errorf("%s: %+v", r.Path, r)
			}
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("expanded backstop rules = %v, want %v", got, want)
	}
	if plan.Backstop.For(1).ProcMem.Action != rules.ActionRecord || rt.Name(plan.Backstop.For(1).ProcMem.ID) != "mems" {
		t.Errorf("backstop ProcMem = %+v", plan.Backstop.For(1).ProcMem)
	}

	// Glob metacharacters in literal components are literal.
	odd := filepath.Join(dir, "we[ird")
	if err := os.MkdirAll(filepath.Join(odd, "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	paths, err := expandWildcards(odd + "/*/key")
	if err != nil || !slices.Equal(paths, []string{odd + "/x/key"}) {
		t.Errorf("expand with '[' = %v, %v", paths, err)
	}
}

// lookupBackstop models bs_path_rules as bpf/include/backstop_file.h reads it: the
// longest key matching path (prefix keys by bytes, exact keys whole), its
// action when its ops cover op, else nothing.
func lookupBackstop(rules []backstoprules.PathRule, sid uint32, path string, op backstoprules.Op) (uint32, bool) {
	best := -1
	var hit backstoprules.PathRule
	for _, r := range rules {
		if r.SandboxID != sid {
			continue
		}
		n := len(r.Path)
		if !r.Prefix {
			if r.Path != path {
				continue
			}
			n++ // the NUL
		} else if !strings.HasPrefix(path, r.Path) {
			continue
		}
		if n > best {
			best, hit = n, r
		}
	}
	if best < 0 || hit.Ops&op == 0 {
		return 0, false
	}
	return hit.Action, true
}

// lookupLSM models lsm_path_rules: the longest key matching path, and
// that key's decision for the access (the compiler writes both accesses
// of every key, so nothing is inherited in the kernel).
func lookupLSM(rules []lsmrules.PathRule, path string, access lsmrules.Access) uint32 {
	best := -1
	var action uint32
	for _, r := range rules {
		n := len(r.Path)
		if !r.Prefix {
			if r.Path != path {
				continue
			}
			n++
		} else if !strings.HasPrefix(path, r.Path) {
			continue
		}
		if r.Access&access == 0 {
			continue
		}
		if n > best {
			best, action = n, r.Action
		}
	}
	return action
}

// lookupExec is lookupLSM over the LSM exec rules.
func lookupExec(rules []lsmrules.ExecRule, path string) uint32 {
	var prs []lsmrules.PathRule
	for _, r := range rules {
		prs = append(prs, lsmrules.PathRule{Path: r.Path, Prefix: r.Prefix, Access: lsmrules.AccessAll, Decision: r.Decision})
	}
	return lookupLSM(prs, path, lsmrules.AccessRead)
}

// TestBackstopAgreesWithPolicy checks that the kernel's longest-prefix
// lookup over the compiled keys reaches the decision policy.DecideFile
// makes, for paths across the rule set of each tier.
func TestBackstopAgreesWithPolicy(t *testing.T) {
	probes := []string{
		"/etc/shadow", "/etc/shadow-", "/etc/passwd", "/etc/sudoers", "/etc/sudoers.d/x", "/etc/hosts",
		"/srv/agent/main.go", "/srv/agent", "/srv/agentx/y", "/tmp/x", "/tmp", "/var/tmp/a/b", "/dev/null",
		"/dev/pts/3", "/dev/mem", "/root/.ssh/id_rsa", "/root/.aws/credentials", "/home/u/.bashrc",
		"/usr/bin/ls", "/usr/lib/x", "/opt/tool/bin/t", "/sys/kernel/x", "/proc/kcore", "/boot/vmlinuz",
		"/var/lib/dpkg/status", "/etc/ssh/ssh_host_rsa_key", "/dev/shm/x",
	}
	for _, preset := range policy.PresetNames() {
		p := parse(t, fmt.Sprintf(`version: 1
sandboxes:
  - {name: sb, select: {cgroups: [/x]}, preset: %s, workspace: [/srv/agent]}
`, preset))
		plan, _ := compile(t, p, Env{LSM: lsmEnv(t, errRefused)})
		withLSM, _ := compile(t, p, Env{LSM: lsmEnv(t, nil)})
		sb := &p.Sandboxes[0]
		files := p.FileRules(sb)
		for _, path := range probes {
			for _, acc := range []struct {
				op    backstoprules.Op
				write bool
				exec  bool
			}{{backstoprules.OpRead, false, false}, {backstoprules.OpWrite, true, false}, {backstoprules.OpExec, false, true}} {
				var want uint32
				if acc.exec {
					want = backstopAction(sb.DecideExec(path))
				} else if r, ok := policy.DecideFile(files, path, acc.write); ok {
					want = backstopAction(r.Action)
				}
				got, _ := lookupBackstop(plan.Backstop.Paths, 1, path, acc.op)
				if got != want {
					t.Errorf("%s: %s op %d: backstop %s, policy %s", preset, path, acc.op, actionWord(got), actionWord(want))
				}
				if acc.exec {
					// With BPF LSM, exec rules go to the LSM exec table
					// (bprm_check_security, mmap_file), not the backstop.
					if got, _ := lookupBackstop(withLSM.Backstop.Paths, 1, path, acc.op); got != rules.ActionAllow {
						t.Errorf("%s: %s exec with LSM: backstop %s, want nothing", preset, path, actionWord(got))
					}
					if got, wantLSM := lookupExec(withLSM.LSM[1].Exec, path), kernelAction(sb.DecideExec(path)); got != wantLSM {
						t.Errorf("%s: %s exec with LSM: lsm %s, policy %s", preset, path, actionWord(got), actionWord(wantLSM))
					}
					continue
				}
				r, ok := policy.DecideFile(files, path, acc.write)
				wantLSM := rules.ActionAllow
				if ok {
					wantLSM = kernelAction(r.Action)
				}
				a := lsmrules.AccessRead
				if acc.write {
					a = lsmrules.AccessWrite
				}
				if got := lookupLSM(withLSM.LSM[1].Paths, path, a); got != wantLSM {
					t.Errorf("%s: %s write=%v: lsm %s, policy %s", preset, path, acc.write, actionWord(got), actionWord(wantLSM))
				}
			}
		}
	}
}

func TestSysctlRules(t *testing.T) {
	if _, err := os.Stat("/proc/sys/kernel/hostname"); err != nil {
		t.Skipf("no /proc/sys here: %v", err)
	}
	p := parse(t, `version: 1
sandboxes:
  - name: s
    select: {cgroups: [/s]}
    files:
      - {name: kernel-ok, path: /proc/sys/kernel/, match: prefix, access: write, action: allow}
      - {name: hostname-watch, path: /proc/sys/kernel/hostname, match: exact, access: write, action: record}
`)
	plan, rt := compile(t, p, Env{LSM: lsmEnv(t, errRefused)})
	byName := map[string]cgrouprules.SysctlRule{}
	for _, r := range plan.Sysctl {
		if r.Write {
			byName[r.Name] = r
		}
	}
	if r, ok := byName[""]; !ok || r.Action != rules.ActionBlock || rt.Name(r.RuleID) != "procsys-write" {
		t.Errorf("every-name write rule = %+v", r)
	}
	if r := byName["kernel/hostname"]; r.Action != rules.ActionRecord || rt.Name(r.RuleID) != "hostname-watch" {
		t.Errorf("kernel/hostname = %+v", r)
	}
	if r, ok := byName["kernel/domainname"]; !ok || r.Action != rules.ActionAllow {
		t.Errorf("kernel/domainname (below the allowed prefix) = %+v, %v", r, ok)
	}
	if _, ok := byName["net/ipv4/ip_forward"]; ok {
		t.Error("a name outside the prefix got its own rule")
	}
	for _, r := range plan.Sysctl {
		if len(r.Name) >= 96 {
			t.Errorf("name too long for the kernel map: %s", r.Name)
		}
	}
}

func TestLaunchRestrictions(t *testing.T) {
	ws := t.TempDir()
	p := parse(t, fmt.Sprintf(`version: 1
sandboxes:
  - {name: r, select: {cgroups: [/r]}, preset: restricted, workspace: [%s]}
  - {name: ro, select: {cgroups: [/ro]}, preset: read-only, workspace: [%s]}
  - name: ops
    select: {cgroups: [/o]}
    preset: ops
    operations: {io_uring: allow, raw_sockets: allow}
`, ws, ws))
	plan, _ := compile(t, p, Env{LSM: lsmEnv(t, errRefused)})
	r := plan.Launch["r"]
	if r.Files == nil || !r.Files.Derive {
		t.Fatalf("restricted landlock = %+v", r.Files)
	}
	wsRule := false
	for _, f := range r.Files.Files {
		if f.Path == ws+"/" && f.Action == policy.ActionAllow {
			wsRule = true
		}
	}
	if !wsRule || !slices.Contains(r.Files.Devices, "/dev/null") || slices.Contains(r.Files.Devices, "/dev/zero") {
		t.Errorf("restricted landlock: workspace rule %t, devices %v (want /dev/null, not the unwritable /dev/zero)", wsRule, r.Files.Devices)
	}
	if len(r.Files.ReadOnly) != 0 || len(r.Files.ReadWrite) != 0 {
		t.Errorf("landlock grants fixed lists besides the derived plan: %+v", r.Files)
	}
	if r.Seccomp.AllowIOUring || !slices.Contains(r.Seccomp.DeniedSocketFamilies, unix.AF_PACKET) {
		t.Errorf("restricted seccomp = %+v", r.Seccomp)
	}
	ro := plan.Launch["ro"]
	if ro.Files == nil || !ro.Files.Derive || ro.Files.ExecDefault != policy.ActionBlock {
		t.Errorf("read-only landlock = %+v", ro.Files)
	}
	ops := plan.Launch["ops"]
	if ops.Files != nil {
		t.Errorf("ops does not confine writes, yet landlock = %+v", ops.Files)
	}
	if !ops.Seccomp.AllowIOUring || slices.Contains(ops.Seccomp.DeniedSocketFamilies, unix.AF_PACKET) {
		t.Errorf("ops seccomp = %+v", ops.Seccomp)
	}
	if got := layerOf(t, plan, "r: watcher exec"); got != MechLaunch {
		t.Errorf("launch layer = %s", got)
	}
	// io_uring allowed while file rules rely on the backstop: opens
	// submitted to a ring are killed (their paths escape the backstop).
	opsRules := plan.Backstop.For(plan.SandboxIDs["ops"])
	if opsRules.IOUringOpen.Action != rules.ActionKill || opsRules.IOUring.Action != rules.ActionAllow {
		t.Errorf("ops: IOUringOpen = %+v, IOUring = %+v (want kill, allow)", opsRules.IOUringOpen, opsRules.IOUring)
	}
	// io_uring is ops' own rule: r's refusal does not kill ops' rings.
	if r := plan.Backstop.For(plan.SandboxIDs["r"]); r.IOUring.Action != rules.ActionKill || r.IOUringOpen.Action != rules.ActionAllow {
		t.Errorf("r: IOUring = %+v, IOUringOpen = %+v (want kill, none)", r.IOUring, r.IOUringOpen)
	}
	_, note, _ := findLayer(plan, "ops: io_uring")
	if strings.Contains(note, "another sandbox") || strings.Contains(note, "stricter") {
		t.Errorf("ops io_uring note = %q", note)
	}
}

func TestCompileErrors(t *testing.T) {
	if _, err := Compile(nil, Env{}, NewRuleTable()); err == nil {
		t.Error("nil policy compiled")
	}
	long := "/" + strings.Repeat("a", 300)
	p := parse(t, fmt.Sprintf(`version: 1
sandboxes:
  - name: l
    select: {cgroups: [/l]}
    files: [{name: long, path: %s, match: exact, access: any, action: block}]
`, long))
	_, err := Compile(p, Env{}, NewRuleTable())
	if err == nil || !strings.Contains(err.Error(), "longer than") || !strings.Contains(err.Error(), "sandbox l") {
		t.Errorf("long path: err = %v", err)
	}
	// Unavailable cgroup BPF: device and socket rules have no mechanism.
	plan, _ := compile(t, policy.Default(), Env{LSM: lsmEnv(t, errRefused), CgroupBPF: errors.New("no cgroup2")})
	if got := layerOf(t, plan, ": devices"); got != MechNone {
		t.Errorf("devices without cgroup BPF or LSM = %s", got)
	}
	if len(plan.Devices)+len(plan.Sysctl)+len(plan.Sockets) != 0 {
		t.Error("cgroup rules although cgroup BPF is unavailable")
	}
	if !slices.ContainsFunc(plan.Missing, func(m string) bool { return strings.Contains(m, "devices") }) {
		t.Errorf("Missing lacks devices: %v", plan.Missing)
	}
	// /proc/sys writes then fall back to the backstop.
	if k, ok := lookupBackstop(plan.Backstop.Paths, 1, "/proc/sys/kernel/x", backstoprules.OpWrite); !ok || k != rules.ActionKill {
		t.Errorf("/proc/sys write without cgroup BPF: %v %v", k, ok)
	}
}

// Where BPF LSM is built but not enabled, the same hooks run as fmod_ret:
// the layer table says so, and says "lsm" for none of them.
func TestLayerTableNamesFmodRet(t *testing.T) {
	mechs := map[string]string{}
	for _, h := range lsm.Hooks() {
		mechs[h] = lsmrules.MechFmodRet
	}
	plan, _ := compile(t, policy.Default(), Env{LSM: lsmEnv(t, nil), LSMMech: mechs})
	if got := layerOf(t, plan, "cred-shadow"); got != MechFmodRet {
		t.Errorf("cred-shadow layer = %s, want fmod_ret", got)
	}
	for _, l := range plan.Layers {
		if l.Mechanism == MechLSM {
			t.Errorf("%s: mechanism lsm although every hook runs as fmod_ret", l.Rule)
		}
	}
	// One hook as BPF LSM, the rest fmod_ret: "lsm" with a note.
	mechs["file_open"] = lsmrules.MechLSM
	plan, _ = compile(t, policy.Default(), Env{LSM: lsmEnv(t, nil), LSMMech: mechs})
	for _, l := range plan.Layers {
		if strings.HasPrefix(l.Rule, "exec: cred-shadow") && (l.Mechanism != MechLSM || !strings.Contains(l.Note, "fmod_ret for")) {
			t.Errorf("%s: %s (%s), want lsm with a fmod_ret note", l.Rule, l.Mechanism, l.Note)
		}
	}
}

// With every LSM hook loaded, exec rules are judged by bprm_check_security
// and mmap_file: the backstop keeps no path rule (no per-exec tracepoint
// work for them), and the layer table names the LSM for them.
func TestExecRulesOnLSM(t *testing.T) {
	for _, preset := range policy.PresetNames() {
		p := parse(t, fmt.Sprintf(`version: 1
sandboxes:
  - {name: sb, select: {cgroups: [/x]}, preset: %s, workspace: [/srv/agent]}
`, preset))
		plan, _ := compile(t, p, Env{LSM: lsmEnv(t, nil)})
		if len(plan.Backstop.Paths) > 0 {
			t.Errorf("%s: backstop path rules with every LSM hook: %+v", preset, plan.Backstop.Paths)
		}
		for _, l := range plan.Layers {
			if strings.Contains(l.Note, "sched_prepare_exec") {
				t.Errorf("%s: %s: %s (%s), want the LSM exec hooks", preset, l.Rule, l.Mechanism, l.Note)
			}
		}
	}
}

// The own-subtree operations go to their LSM hooks under the baseline,
// notify marks staying allowed in the workspace, and to nothing where the
// hooks are missing.
func TestOwnSubtreeOperationsPlanned(t *testing.T) {
	p := parse(t, `version: 1
sandboxes:
  - {name: sb, select: {cgroups: [/x]}, preset: restricted, workspace: [/srv/agent/]}
`)
	plan, rt := compile(t, p, Env{LSM: lsmEnv(t, nil)})
	lr := plan.LSM[plan.SandboxIDs["sb"]]
	for op, name := range map[lsmrules.Op]string{lsmrules.OpOtherTask: "other-processes", lsmrules.OpOtherIPC: "other-ipc",
		lsmrules.OpTTYInject: "terminals", lsmrules.OpNotifyMark: "notify-marks"} {
		if d := lr.Ops[op]; d.Action != rules.ActionBlock || rt.Name(d.RuleID) != name {
			t.Errorf("%s: %+v (rule %q), want block by %s", op, d, rt.Name(d.RuleID), name)
		}
		if got := layerOf(t, plan, name); got != MechLSM {
			t.Errorf("%s layer = %s, want lsm", name, got)
		}
	}
	if want := []string{"/srv/agent", "/srv/agent/"}; !slices.Equal(lr.NotifyPaths, want) {
		t.Errorf("notify paths = %q, want %q", lr.NotifyPaths, want)
	}
	if got := OperationOfSubtreeEvent("other_process: signal 9 to pid 1 (init), outside the sandbox"); got != "other_processes" {
		t.Errorf("operation of an other-process event = %q", got)
	}
	if got := OperationOfSubtreeEvent("kernel_read_file: module"); got != "" {
		t.Errorf("operation of a module event = %q, want none", got)
	}
}
