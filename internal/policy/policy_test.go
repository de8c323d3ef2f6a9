package policy

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func writePolicy(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// decide is the action the sandbox's file rules give an open ("" = no rule).
func decide(p *Policy, sb *Sandbox, path string, write bool) Action {
	r, ok := DecideFile(p.FileRules(sb), path, write)
	if !ok {
		return ""
	}
	return r.Action
}

// dangerous lists opens every preset (and the default policy) must block:
// the enforcement engine's list of dangerous operations.
var dangerous = []struct {
	path  string
	write bool
}{
	{"/etc/shadow", false},
	{"/etc/gshadow", false},
	{"/etc/sudoers", false},
	{"/etc/sudoers.d/90-cloud-init-users", true},
	{"/etc/ssh/ssh_host_ed25519_key", false},
	{"/etc/ssh/ssh_host_rsa_key", false},
	{"/root/.ssh/authorized_keys", true},
	{"/root/.ssh/id_ed25519", false},
	{"/proc/1/mem", false},
	{"/proc/4242/task/4243/mem", true},
	{"/proc/kcore", false},
	{"/proc/sys/kernel/core_pattern", true},
	{"/proc/sys/net/ipv4/ip_forward", true},
	{"/sys/kernel/uevent_helper", true},
	{"/sys/fs/cgroup/cgroup.procs", true},
	{"/dev/mem", false},
	{"/dev/kmem", true},
	{"/var/lib/watcher/ledger/000001.log", true},
	{"/var/lib/watcher/ledger", false},
	{"/sys/fs/bpf/watcher/maps/sandboxes", false},
	{"/run/watcher/events.sock", false},
}

func checkBlocksDangerous(t *testing.T, p *Policy, sb *Sandbox) {
	t.Helper()
	for _, d := range dangerous {
		if got := decide(p, sb, d.path, d.write); got != ActionBlock {
			t.Errorf("sandbox %s (preset %s): open %s write=%v -> %q, want block", sb.Name, sb.Preset, d.path, d.write, got)
		}
	}
	o := sb.Operations
	for name, a := range map[string]Action{
		"ptrace": o.Ptrace, "mount": o.Mount, "module": o.Module, "bpf": o.BPF, "kill_agent": o.KillAgent,
		"agent_files": o.AgentFiles, "cgroup_write": o.CgroupWrite, "devices": o.Devices, "raw_sockets": o.RawSockets,
	} {
		if a != ActionBlock {
			t.Errorf("sandbox %s (preset %s): operations.%s = %q, want block", sb.Name, sb.Preset, name, a)
		}
	}
	// Benign reads stay untouched.
	for _, path := range []string{"/etc/passwd", "/etc/ssh/ssh_config", "/etc/ssh/ssh_host_ed25519_key.pub", "/proc/self/status", "/proc/sys/vm/overcommit_memory", "/usr/lib/x86_64-linux-gnu/libc.so.6"} {
		if got := decide(p, sb, path, false); got == ActionBlock || got == ActionKill {
			t.Errorf("sandbox %s (preset %s): read of %s -> %s", sb.Name, sb.Preset, path, got)
		}
	}
}

func TestEveryPresetLoadsAndBlocksDangerousOperations(t *testing.T) {
	var b strings.Builder
	b.WriteString("version: 1\nsandboxes:\n")
	for i, name := range PresetNames() {
		fmt.Fprintf(&b, "  - name: sb-%s\n    select: {cgroups: [/tier/%d]}\n    preset: %s\n    workspace: [/srv/ws]\n", name, i, name)
	}
	p, err := Load(writePolicy(t, b.String()))
	if err != nil {
		t.Fatalf("policy using every preset: %v", err)
	}
	if len(p.Sandboxes) != len(PresetNames()) {
		t.Fatalf("%d sandboxes", len(p.Sandboxes))
	}
	for i := range p.Sandboxes {
		sb := &p.Sandboxes[i]
		if sb.Mode != ModeEnforce || !sb.Escape.Enabled || !sb.DNS.Detection.Enabled {
			t.Errorf("%s: mode %s escape %v detection %v", sb.Name, sb.Mode, sb.Escape.Enabled, sb.DNS.Detection.Enabled)
		}
		checkBlocksDangerous(t, p, sb)
		if src, err := PresetSource(PresetNames()[i]); err != nil || len(src) == 0 {
			t.Errorf("PresetSource(%s): %v", PresetNames()[i], err)
		}
	}
	if _, err := Preset("lenient"); err == nil {
		t.Error("unknown preset accepted")
	}
}

func TestPresetTiersDiffer(t *testing.T) {
	p, err := Parse("tiers.yaml", []byte(`version: 1
sandboxes:
  - {name: ro, select: {cgroups: [/a]}, preset: read-only, workspace: [/srv/ws]}
  - {name: rw, select: {cgroups: [/b]}, preset: restricted, workspace: [/srv/ws]}
  - {name: dev, select: {cgroups: [/c]}, preset: dev, workspace: [/srv/ws]}
  - {name: ops, select: {cgroups: [/d]}, preset: ops, workspace: [/srv/ws]}
`))
	if err != nil {
		t.Fatal(err)
	}
	ro, rw, dev, ops := p.Sandbox("ro"), p.Sandbox("rw"), p.Sandbox("dev"), p.Sandbox("ops")

	// File write scope.
	writes := []struct {
		path             string
		ro, rw, dev, ops Action
	}{
		{"/srv/ws/main.go", ActionBlock, ActionAllow, ActionAllow, ""},
		{"/srv/wsx/evil", ActionBlock, ActionBlock, ActionBlock, ""},
		{"/tmp/scratch", ActionBlock, ActionAllow, ActionAllow, ""},
		{"/dev/null", ActionAllow, ActionAllow, ActionAllow, ""},
		{"/root/.cache/go-build/ab/cd", ActionBlock, ActionAllow, ActionAllow, ""},
		{"/root/.cargo/registry/x", ActionBlock, ActionBlock, ActionAllow, ""},
		{"/root/.bashrc", ActionBlock, ActionBlock, ActionBlock, ""},
		{"/etc/hosts", ActionBlock, ActionBlock, ActionBlock, ActionRecord},
		{"/opt/app/config", ActionBlock, ActionBlock, ActionBlock, ""},
		{"/boot/vmlinuz", ActionBlock, ActionBlock, ActionBlock, ActionBlock},
	}
	for _, w := range writes {
		for _, c := range []struct {
			sb   *Sandbox
			want Action
		}{{ro, w.ro}, {rw, w.rw}, {dev, w.dev}, {ops, w.ops}} {
			if got := decide(p, c.sb, w.path, true); got != c.want {
				t.Errorf("%s: write %s -> %q, want %q", c.sb.Name, w.path, got, c.want)
			}
		}
	}
	// Cloud credentials: blocked for agents below ops.
	for _, sb := range []*Sandbox{ro, rw, dev} {
		if got := decide(p, sb, "/home/alice/.aws/credentials", false); got != ActionBlock {
			t.Errorf("%s: read ~/.aws/credentials -> %q", sb.Name, got)
		}
	}

	// Command execution.
	execs := []struct {
		path             string
		ro, rw, dev, ops Action
	}{
		{"/usr/bin/git", ActionAllow, ActionAllow, ActionAllow, ActionAllow},
		{"/tmp/payload", ActionBlock, ActionBlock, ActionAllow, ActionAllow},
		{"/srv/ws/run.sh", ActionBlock, ActionAllow, ActionAllow, ActionAllow},
		{"/tmp/go-build1234/b001/pkg.test", ActionBlock, ActionAllow, ActionAllow, ActionAllow},
	}
	for _, e := range execs {
		for _, c := range []struct {
			sb   *Sandbox
			want Action
		}{{ro, e.ro}, {rw, e.rw}, {dev, e.dev}, {ops, e.ops}} {
			if got := c.sb.DecideExec(e.path); got != c.want {
				t.Errorf("%s: exec %s -> %q, want %q", c.sb.Name, e.path, got, c.want)
			}
		}
	}
	if !(ro.Exec.Timeouts.Kill.Duration < rw.Exec.Timeouts.Kill.Duration && rw.Exec.Timeouts.Kill.Duration < dev.Exec.Timeouts.Kill.Duration) {
		t.Errorf("timeouts do not grow with the tier: %v %v %v", ro.Exec.Timeouts.Kill, rw.Exec.Timeouts.Kill, dev.Exec.Timeouts.Kill)
	}

	// Network reach.
	if ro.DNS.Default != DNSDeny || rw.DNS.Default != DNSDeny || dev.DNS.Default != DNSDeny || ops.DNS.Default != DNSAllow {
		t.Errorf("dns defaults %s %s %s %s", ro.DNS.Default, rw.DNS.Default, dev.DNS.Default, ops.DNS.Default)
	}
	if len(ro.DNS.Allow) != 0 || len(rw.DNS.Allow) != 0 || !contains(dev.DNS.Allow, "pypi.org") || !contains(dev.DNS.Allow, "proxy.golang.org") {
		t.Errorf("dns allow lists: ro %v rw %v dev %v", ro.DNS.Allow, rw.DNS.Allow, dev.DNS.Allow)
	}
	if len(ops.Egress.Allow) == 0 || len(dev.Egress.Allow) != 0 {
		t.Errorf("egress allow: ops %v dev %v", ops.Egress.Allow, dev.Egress.Allow)
	}

	// Audit depth: ops records everything, unsampled, including each use
	// of the capabilities it holds, but not the syscall stream (a raw
	// tracepoint every task of the host pays for: opt-in); like every
	// preset it holds no CAP_SYS_ADMIN (default-deny privilege).
	if ops.Audit.FileOpens != FileOpensAll || ops.Audit.Syscalls || ops.Audit.SampleRate != 1 || ops.CapabilityAction(0) != ActionRecord {
		t.Errorf("ops audit %+v, CAP_CHOWN %s", ops.Audit, ops.CapabilityAction(0))
	}
	for _, sb := range []*Sandbox{ro, rw, dev, ops} {
		if a := sb.CapabilityAction(21); a != ActionBlock {
			t.Errorf("%s preset: CAP_SYS_ADMIN %s, want block", sb.Preset, a)
		}
	}
	if ro.Audit.Syscalls || rw.Audit.Syscalls || dev.Audit.Syscalls || dev.Audit.SampleRate >= rw.Audit.SampleRate {
		t.Errorf("audit depth: ro %+v rw %+v dev %+v", ro.Audit, rw.Audit, dev.Audit)
	}
}

func contains(list []string, s string) bool {
	for _, e := range list {
		if e == s {
			return true
		}
	}
	return false
}

func TestDefaultPolicy(t *testing.T) {
	p := Default()
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	if p.Agent.MetricsAddr != "127.0.0.1:9464" || p.Agent.SocketDir != "/run/watcher" || p.Agent.PinDir != "/sys/fs/bpf/watcher" {
		t.Errorf("agent defaults %+v", p.Agent)
	}
	sb := p.SandboxForCgroup("/watcher/exec/call-42")
	if sb == nil || sb.Name != "exec" {
		t.Fatalf("the exec leaf is not sandboxed: %v", sb)
	}
	if p.SandboxForCgroup("/system.slice/sshd.service") != nil {
		t.Error("a host service is sandboxed")
	}
	checkBlocksDangerous(t, p, sb)
}

func TestOverridesApplyOnTopOfPreset(t *testing.T) {
	path := writePolicy(t, `version: 1
agent:
  ledger_dir: /data/ledger
sandboxes:
  - name: ci
    select:
      containers: ["containerd://0123456789ab"]
    preset: dev
    mode: record
    workspace: [/work]
    files:
      # Own rule on the same path as the preset's: the sandbox wins.
      - {path: /tmp/, match: prefix, access: write, action: block, name: no-tmp}
      - {path: /data/ledger/, match: prefix, access: read, action: allow}
    exec:
      timeouts:
        warn: 1m
    dns:
      allow: [internal.example.com]
      deny: [gist.github.com]
    egress:
      allow:
        - cidr: 192.0.2.0/24
          ports: [443, "8000-8100"]
          protocol: tcp
      loopback:
        - {name: ollama, port: 11434}
    escape:
      threshold: 60
`)
	p, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	sb := p.Sandbox("ci")
	if sb.Mode != ModeRecord || sb.Preset != PresetDev {
		t.Errorf("mode %s preset %s", sb.Mode, sb.Preset)
	}
	// Nested settings merge field by field.
	dev, _ := Preset(PresetDev)
	if sb.Exec.Timeouts.Warn.Duration != time.Minute || sb.Exec.Timeouts.Term != dev.Exec.Timeouts.Term || sb.Exec.Timeouts.Kill != dev.Exec.Timeouts.Kill {
		t.Errorf("timeouts %+v, want warn 1m and the preset's term/kill %+v", sb.Exec.Timeouts, dev.Exec.Timeouts)
	}
	if sb.Escape.Threshold != 60 || sb.Escape.Window != dev.Escape.Window || !sb.Escape.Enabled {
		t.Errorf("escape %+v", sb.Escape)
	}
	// Lists extend the preset's.
	if !contains(sb.DNS.Allow, "internal.example.com") || !contains(sb.DNS.Allow, "pypi.org") || !contains(sb.DNS.Deny, "gist.github.com") {
		t.Errorf("dns %+v", sb.DNS)
	}
	if len(sb.Egress.Allow) != 1 || sb.Egress.Loopback[0].Port != 11434 {
		t.Errorf("egress %+v", sb.Egress)
	}
	lo, hi, err := sb.Egress.Allow[0].Ports[1].Bounds()
	if err != nil || lo != 8000 || hi != 8100 {
		t.Errorf("port range %v-%v %v", lo, hi, err)
	}
	// Own rule beats the preset's rule on the same path.
	if got := decide(p, sb, "/tmp/x", true); got != ActionBlock {
		t.Errorf("write /tmp/x -> %q, want the sandbox's block", got)
	}
	if r, _ := DecideFile(p.FileRules(sb), "/tmp/x", true); r.RuleName() != "no-tmp" {
		t.Errorf("deciding rule %q", r.RuleName())
	}
	// The preset's other rules are still there; agent files follow the
	// agent's ledger dir; the policy file itself is protected.
	if decide(p, sb, "/work/a.go", true) != ActionAllow || decide(p, sb, "/etc/shadow", false) != ActionBlock {
		t.Error("preset rules lost")
	}
	if decide(p, sb, "/data/ledger/x", true) != ActionBlock || decide(p, sb, "/data/ledger/x", false) != ActionAllow {
		t.Errorf("agent files: write %q read %q", decide(p, sb, "/data/ledger/x", true), decide(p, sb, "/data/ledger/x", false))
	}
	if decide(p, sb, path, true) != ActionBlock {
		t.Error("policy file writable from the sandbox")
	}
	// Record mode turns blocks into records.
	if sb.Effective(ActionBlock) != ActionRecord || sb.Effective(ActionAllow) != ActionAllow {
		t.Error("record mode")
	}
	refs := sb.Select.Refs()
	if len(refs) != 1 || refs[0].ID != "0123456789ab" {
		t.Errorf("refs %v", refs)
	}
	// The preset itself is not modified by the sandbox.
	again, _ := Preset(PresetDev)
	if !reflect.DeepEqual(again, dev) || contains(again.DNS.Allow, "internal.example.com") {
		t.Error("preset modified by a sandbox")
	}
}

func TestUnknownFieldNamesFileLineAndField(t *testing.T) {
	path := writePolicy(t, `version: 1
sandboxes:
  - name: a
    select: {cgroups: [/a]}
    preset: restricted
    egress:
      default: resolved
      alow:
        - cidr: 10.0.0.0/8
`)
	_, err := Load(path)
	if err == nil {
		t.Fatal("unknown field accepted")
	}
	want := path + ":8:7: sandboxes[0].egress.alow: unknown field \"alow\""
	if err.Error() != want {
		t.Fatalf("error\n %s\nwant\n %s", err, want)
	}
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Line != 8 || fe.Field != "sandboxes[0].egress.alow" {
		t.Fatalf("FieldError %+v", fe)
	}
}

func TestBadValuesNameLineAndField(t *testing.T) {
	head := "version: 1\nsandboxes:\n  - name: a\n    select: {cgroups: [/a]}\n    preset: restricted\n"
	cases := []struct {
		name, body string
		line       int
		field, msg string
	}{
		{"cidr", "    egress:\n      allow:\n        - cidr: 10.0.0.0/33\n", 8, "sandboxes[0].egress.allow[0].cidr", "not a valid CIDR"},
		{"cidr host bits", "    egress:\n      allow:\n        - cidr: 10.1.2.3/8\n", 8, "sandboxes[0].egress.allow[0].cidr", "host bits"},
		{"cidr zone", "    egress:\n      allow:\n        - cidr: fe80::1%eth0\n", 8, "sandboxes[0].egress.allow[0].cidr", "has a zone"},
		{"port range reversed", "    egress:\n      allow:\n        - cidr: 10.0.0.0/8\n          ports: [443, \"9000-8000\"]\n", 9, "sandboxes[0].egress.allow[0].ports[1]", "start above end"},
		{"port zero", "    egress:\n      allow:\n        - cidr: ::1\n          ports:\n            - 0\n", 10, "sandboxes[0].egress.allow[0].ports[0]", "out of range"},
		{"port too big", "    egress:\n      loopback:\n        - {name: x, port: 70000}\n", 8, "sandboxes[0].egress.loopback[0].port", "out of range"},
		{"duration", "    exec:\n      timeouts:\n        term: 5 parsecs\n", 8, "sandboxes[0].exec.timeouts.term", "not a duration"},
		{"timeouts order", "    exec:\n      timeouts:\n        warn: 20m\n        term: 10m\n", 9, "sandboxes[0].exec.timeouts.term", "later than warn"},
		{"action", "    operations:\n      ptrace: deny\n", 7, "sandboxes[0].operations.ptrace", "want allow, record, block or kill"},
		{"mode", "    mode: strict\n", 6, "sandboxes[0].mode", "want enforce or record"},
		{"capability", "    operations:\n      capabilities:\n        rules:\n          - {cap: CAP_SYS_GOD, action: block}\n", 9, "sandboxes[0].operations.capabilities.rules[0].cap", "unknown capability"},
		{"container", "    egress:\n      default: deny\n  - name: b\n    select:\n      containers: [\"docker://xyz\"]\n", 10, "sandboxes[1].select.containers[0]", "hex digits"},
		{"glob", "  - name: b\n    select:\n      globs: [\"/a/[x\"]\n", 8, "sandboxes[1].select.globs[0]", "syntax error"},
		{"file path", "    files:\n      - {path: etc/shadow, match: exact, access: read, action: block}\n", 7, "sandboxes[0].files[0].path", "absolute"},
		{"file match", "    files:\n      - path: /etc/x\n        match: glob\n        access: read\n        action: block\n", 8, "sandboxes[0].files[0].match", "want exact or prefix"},
		{"dns name", "    dns:\n      allow: [\"bad..name\"]\n", 7, "sandboxes[0].dns.allow[0]", "not a valid DNS label"},
		{"preset", "    preset: yolo\n", 5, "sandboxes[0].preset", "unknown preset"},
		{"type", "    exec:\n      circuit_breaker: many\n", 7, "sandboxes[0].exec.circuit_breaker", "want an integer"},
		{"sample rate", "    audit:\n      sample_rate: 2\n", 7, "sandboxes[0].audit.sample_rate", "out of range"},
		{"duplicate key", "    mode: enforce\n    mode: record\n", 6, "", "already defined"},
		{"admission cap", "    egress:\n      admission_ttl_cap: 48h\n", 7, "sandboxes[0].egress.admission_ttl_cap", "out of range 1s-24h"},
		{"admission cap text", "    egress:\n      admission_ttl_cap: forever\n", 7, "sandboxes[0].egress.admission_ttl_cap", "not a duration"},
		{"name ports missing", "    egress:\n      name_ports:\n        - {name: github.com}\n", 8, "sandboxes[0].egress.name_ports[0].ports", "required"},
		{"name port", "    egress:\n      name_ports:\n        - {name: github.com, ports: [\"70000\"]}\n", 8, "sandboxes[0].egress.name_ports[0].ports[0]", "out of range"},
		{"name pattern", "    egress:\n      name_ports:\n        - {name: \"bad..name\", ports: [\"22\"]}\n", 8, "sandboxes[0].egress.name_ports[0].name", "not a valid DNS label"},
		{"name protocol", "    egress:\n      name_ports:\n        - {name: github.com, ports: [\"22\"], protocol: sctp}\n", 8, "sandboxes[0].egress.name_ports[0].protocol", "want tcp, udp or any"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			body := head + c.body
			if c.name == "preset" || c.name == "duplicate key" {
				body = strings.Replace(head, "    preset: restricted\n", "", 1) + c.body
			}
			_, err := Parse("p.yaml", []byte(body))
			if err == nil {
				t.Fatalf("accepted:\n%s", body)
			}
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("error %v is not a FieldError", err)
			}
			if fe.File != "p.yaml" || fe.Line != c.line || (c.field != "" && fe.Field != c.field) || !strings.Contains(fe.Msg, c.msg) {
				t.Fatalf("got %s\nwant p.yaml:%d: %s: ...%s...", err, c.line, c.field, c.msg)
			}
			if !strings.HasPrefix(err.Error(), fmt.Sprintf("p.yaml:%d:", c.line)) {
				t.Fatalf("message %q does not start with file:line", err)
			}
		})
	}
}

func TestValidateInCodeAndWholePolicyErrors(t *testing.T) {
	p := &Policy{Version: 1, Agent: DefaultAgent(), Sandboxes: []Sandbox{
		{Name: "a", Mode: ModeEnforce, Select: Selector{Cgroups: []string{"/a"}}, DNS: DNS{Default: DNSDeny}, Egress: Egress{Default: EgressResolved}},
		{Name: "a", Mode: ModeEnforce, DNS: DNS{Default: DNSDeny}, Egress: Egress{Default: EgressResolved}},
	}}
	p.Agent.MetricsAddr = "localhost"
	p.Agent.DNS.Upstreams = []string{"dns.example:53"}
	err := p.Validate()
	var es Errors
	if !errors.As(err, &es) {
		t.Fatalf("Validate: %v", err)
	}
	want := []string{
		"policy: agent.metrics_addr: \"localhost\": want host:port",
		"policy: agent.dns.upstreams[0]: \"dns.example:53\": host must be an IP address",
		"policy: sandboxes[1].select: select at least one cgroup, glob, container or label",
		"policy: sandboxes[1].name: sandbox name \"a\" already used by sandboxes[0]",
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("missing %q in\n%s", w, err)
		}
	}
	if len(es) != len(want) {
		t.Errorf("%d errors, want %d:\n%s", len(es), len(want), err)
	}
	// A policy without version, and an empty file, are refused.
	if _, err := Parse("x.yaml", []byte("sandboxes: []\n")); err == nil || !strings.Contains(err.Error(), "x.yaml:") || !strings.Contains(err.Error(), "version") {
		t.Errorf("missing version: %v", err)
	}
	if _, err := Parse("x.yaml", []byte("# nothing\n")); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Errorf("empty: %v", err)
	}
	if _, err := Parse("x.yaml", []byte("version: 1\n---\nversion: 1\n")); err == nil || !strings.Contains(err.Error(), "x.yaml:3:") {
		t.Errorf("two documents: %v", err)
	}
	if _, err := Parse("x.yaml", []byte("version: 1\nsandboxes: [\n")); err == nil || !strings.Contains(err.Error(), "x.yaml:") {
		t.Errorf("syntax error: %v", err)
	}
}

func TestMarshalRoundTrip(t *testing.T) {
	for _, name := range PresetNames() {
		src := fmt.Sprintf("version: 1\nsandboxes:\n  - {name: s, select: {globs: [\"/k/**\"]}, preset: %s, workspace: [/w]}\n", name)
		p, err := Parse("a.yaml", []byte(src))
		if err != nil {
			t.Fatal(err)
		}
		out, err := Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		q, err := Parse("b.yaml", out)
		if err != nil {
			t.Fatalf("%s: written policy does not load: %v\n%s", name, err, out)
		}
		if !reflect.DeepEqual(p.Sandboxes, q.Sandboxes) || !reflect.DeepEqual(p.Agent, q.Agent) {
			t.Errorf("%s: round trip changed the policy:\n%+v\n%+v", name, p.Sandboxes, q.Sandboxes)
		}
	}
}

func TestFileRuleMatching(t *testing.T) {
	rules := []FileRule{
		{Path: "/", Match: MatchPrefix, Access: AccessWrite, Action: ActionBlock},
		{Path: "/proc/*/mem", Match: MatchExact, Access: AccessAny, Action: ActionKill},
		{Path: "/home/*/.ssh/", Match: MatchPrefix, Access: AccessAny, Action: ActionBlock},
		{Path: "/etc/sudoers", Match: MatchPrefix, Access: AccessRead, Action: ActionRecord},
		{Path: "/tmp/", Match: MatchPrefix, Access: AccessWrite, Action: ActionAllow},
	}
	cases := []struct {
		path  string
		write bool
		want  Action
	}{
		{"/proc/1/mem", false, ActionKill},
		{"/proc/self/mem", true, ActionKill},
		{"/proc/1/maps", false, ""},
		{"/proc/1/task/2/mem", false, ""},
		{"/home/bob/.ssh/id_rsa", false, ActionBlock},
		{"/home/.ssh/x", false, ""},
		{"/etc/sudoers.d/x", false, ActionRecord},
		{"/etc/sudoers.d/x", true, ActionBlock},
		{"/tmp/a/b", true, ActionAllow},
		{"/tmpx", true, ActionBlock},
		{"/usr/bin/ls", false, ""},
	}
	for _, c := range cases {
		r, ok := DecideFile(rules, c.path, c.write)
		got := Action("")
		if ok {
			got = r.Action
		}
		if got != c.want {
			t.Errorf("%s write=%v -> %q, want %q", c.path, c.write, got, c.want)
		}
	}
	if n, ok := CapabilityNumber("sys_admin"); !ok || n != 21 || CapabilityName(39) != "CAP_BPF" {
		t.Errorf("capabilities: %d %v %s", n, ok, CapabilityName(39))
	}
}

func TestWatchTargets(t *testing.T) {
	p, err := Parse("w.yaml", []byte(`version: 1
sandboxes:
  - name: k8s
    select:
      globs: ["/kubepods.slice/**/cri-containerd-*.scope"]
      containers: ["cri-o://0123456789abcdef", "pod://0f3c8a1e-5b2d-4c7e-9a10-77e2d4b6c801"]
  - name: exec
    select: {cgroups: [/watcher]}
`))
	if err != nil {
		t.Fatal(err)
	}
	ts := p.WatchTargets()
	if len(ts) != 3 {
		t.Fatalf("%d targets: %+v", len(ts), ts)
	}
	if ts[0].Name != "k8s" || ts[0].Glob == nil || !ts[0].Glob.Match("/kubepods.slice/kubepods-pod1.slice/cri-containerd-ab.scope") {
		t.Errorf("glob target %+v", ts[0])
	}
	if ts[1].Ref == nil || ts[1].Ref.Runtime != "cri-o" || ts[2].Ref == nil || !ts[2].Ref.Pod {
		t.Errorf("ref targets %+v %+v", ts[1], ts[2])
	}
	// A sandbox without a preset gets the baseline: the dangerous
	// operations are blocked there too.
	checkBlocksDangerous(t, p, p.Sandbox("exec"))
}

func TestWildcardPrefixCoversTheDirectory(t *testing.T) {
	r := FileRule{Path: "/home/*/.ssh/", Match: MatchPrefix}
	for p, want := range map[string]bool{"/home/u/.ssh": true, "/home/u/.ssh/id": true, "/home/u/.sshx": false, "/home/u": false, "/home//.ssh": false} {
		if got := r.Matches(p); got != want {
			t.Errorf("Matches(%q) = %t, want %t", p, got, want)
		}
	}
}
