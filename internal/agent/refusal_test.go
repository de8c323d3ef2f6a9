package agent

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/policy"
)

func TestRefusalsNameRuleLayerAndAllowingLine(t *testing.T) {
	ws := t.TempDir()
	p := parse(t, `version: 1
sandboxes:
  - {name: r, select: {cgroups: [/r]}, preset: restricted, workspace: [`+ws+`]}
`)
	sb := p.Sandbox("r")
	open := func(path string, write bool, mech string, v audit.Verdict) audit.Event {
		return audit.Event{Kind: audit.KindFileOpen, Verdict: v, Mechanism: mech, Sandbox: audit.Sandbox{Name: "r"},
			Process: audit.Process{Comm: "cat", TGID: 7}, File: &audit.FileDetail{Path: path, Write: write},
			Syscall: &audit.SyscallDetail{Name: "openat", Ret: -13}}
	}
	events := []audit.Event{
		open("/etc/shadow", false, "landlock", audit.VerdictDenied),
		open("/etc/shadow", false, "landlock", audit.VerdictDenied),
		open("/etc/motd-new", true, "landlock", audit.VerdictDenied),
		open("/root/.aws/credentials", false, "kill", audit.VerdictKilled),
		{Kind: audit.KindSyscall, Verdict: audit.VerdictDenied, Mechanism: "seccomp", Sandbox: audit.Sandbox{Name: "r"},
			Syscall: &audit.SyscallDetail{Name: "ptrace", Ret: -1}, Message: "ptrace refused by the seccomp filter (EPERM)"},
		{Kind: audit.KindSyscall, Verdict: audit.VerdictDenied, Mechanism: "seccomp", Sandbox: audit.Sandbox{Name: "r"},
			Syscall: &audit.SyscallDetail{Name: "unshare", Ret: -1}, Message: "unshare(flags 0x20000) refused by the seccomp filter (EPERM)"},
		{Kind: audit.KindDNS, Verdict: audit.VerdictDenied, Mechanism: "dnsproxy", Sandbox: audit.Sandbox{Name: "r"},
			DNS: &audit.DNSDetail{Name: "example.org.", Reason: "not in the allowlist"}},
		{Kind: audit.KindNet, Verdict: audit.VerdictKilled, Mechanism: "kill", Sandbox: audit.Sandbox{Name: "r"},
			Net: &audit.NetDetail{Family: 1, Op: "connect", Addr: "/run/docker.sock", Reason: "unix peer outside the sandbox's socket paths (resolved)"}},
		{Kind: audit.KindNet, Verdict: audit.VerdictDenied, Mechanism: "cgroup_bpf", Sandbox: audit.Sandbox{Name: "r"},
			Net: &audit.NetDetail{Family: 2, Op: "sendmsg", Addr: "198.18.0.7", Port: 4445, Protocol: 17,
				Reason: "answered address, but not on a port or protocol its name allows"},
			Message: "admitted for stun.example.org, cdn.example.org on tcp/80, tcp/443"},
		{Kind: audit.KindCapability, Verdict: audit.VerdictDenied, Mechanism: "lsm", Sandbox: audit.Sandbox{Name: "r"},
			Process: audit.Process{Comm: "date", TGID: 9}, Target: &audit.TargetDetail{Capability: 25}},
		// The benign neighbour: an allowed open is no refusal.
		open(ws+"/main.go", true, "landlock", audit.VerdictAllowed),
	}
	got := Refusals(p, sb, events, ws)
	if len(got) != 9 {
		t.Fatalf("got %d refusals, want 9: %+v", len(got), got)
	}
	byOp := map[string]Refusal{}
	for _, r := range got {
		byOp[r.Operation+" "+r.Path+r.Address] = r
	}
	if p := byOp["sendmsg 198.18.0.7:4445"]; len(p.Allow) != 1 || p.Allow[0] != `egress: {name_ports: [{name: stun.example.org, ports: ["4445"], protocol: udp}]}` {
		t.Errorf("port refusal = %+v", p)
	}
	sh := byOp["read /etc/shadow"]
	if sh.Count != 2 || sh.Rule != "cred-shadow" || sh.Layer != "landlock" || sh.Errno != "EACCES" || sh.Result != "refused" ||
		len(sh.Allow) != 1 || !strings.Contains(sh.Allow[0], "path: /etc/shadow, match: exact, access: read, action: allow") {
		t.Errorf("shadow refusal = %+v", sh)
	}
	if w := byOp["write /etc/motd-new"]; w.Rule != "write-outside-workspace" || len(w.Allow) == 0 || !strings.Contains(w.Allow[0], "access: write") {
		t.Errorf("write refusal = %+v", w)
	}
	if k := byOp["read /root/.aws/credentials"]; k.Result != "killed" || k.Rule != "cloud-credentials" {
		t.Errorf("killed refusal = %+v", k)
	}
	if pt := byOp["ptrace "]; len(pt.Allow) != 1 || pt.Allow[0] != "operations: {ptrace: allow}" {
		t.Errorf("ptrace refusal = %+v", pt)
	}
	if un := byOp["unshare "]; un.Allow != nil || !strings.Contains(un.Note, "fixed seccomp list") {
		t.Errorf("namespace refusal = %+v", un)
	}
	// A capability the preset does not grant: named, with the line that grants it.
	if c := byOp["capability CAP_SYS_TIME"]; len(c.Allow) != 1 || c.Allow[0] != "operations: {capabilities: {rules: [{cap: CAP_SYS_TIME, action: allow}]}}" {
		t.Errorf("capability refusal = %+v", c)
	}
	if d := byOp["resolve example.org."]; len(d.Allow) != 1 || d.Allow[0] != "dns: {allow: [example.org]}" {
		t.Errorf("dns refusal = %+v", d)
	}
	if u := byOp["connect /run/docker.sock"]; len(u.Allow) != 1 || u.Allow[0] != "egress: {unix: [/run/docker.sock]}" || u.Result != "killed" {
		t.Errorf("unix connect refusal = %+v", u)
	}

	rep := &RunReport{Label: "call-1", Sandbox: "r", Mode: "enforce", Refusals: got, Killed: true}
	var text bytes.Buffer
	rep.WriteSummary(&text)
	for _, want := range []string{"10 operation(s) refused", "label=call-1", "cred-shadow", "landlock", "would be allowed by", "kill backstop killed", "{cap: CAP_SYS_TIME, action: allow}"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, text.String())
		}
	}
	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back RunReport
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || back.Label != "call-1" || len(back.Refusals) != 9 {
		t.Errorf("JSON report round trip: %v %+v", err, back)
	}
}

// In record mode only events of rules that would refuse count; routine
// records without a rule do not.
func TestRefusalsRecordMode(t *testing.T) {
	p := parse(t, `version: 1
sandboxes:
  - {name: r, select: {cgroups: [/r]}, preset: restricted, mode: record}
`)
	sb := p.Sandbox("r")
	ev := func(rule string) audit.Event {
		return audit.Event{Kind: audit.KindFileOpen, Verdict: audit.VerdictRecorded, Rule: rule, Mechanism: "kill",
			Sandbox: audit.Sandbox{Name: "r"}, File: &audit.FileDetail{Path: "/etc/shadow"}}
	}
	got := Refusals(p, sb, []audit.Event{ev("cred-shadow"), ev("")}, "/")
	if len(got) != 1 || got[0].Result != "would-refuse" {
		t.Fatalf("record mode refusals = %+v", got)
	}
	if sb.Mode != policy.ModeRecord {
		t.Fatal("sandbox not in record mode")
	}
}

func parse(t *testing.T, src string) *policy.Policy {
	t.Helper()
	p, err := policy.Parse("test.yaml", []byte(src))
	if err != nil {
		t.Fatalf("parse policy: %v", err)
	}
	return p
}

func TestRefusalsNameSubtreeTargetAndRule(t *testing.T) {
	p := parse(t, `version: 1
sandboxes:
  - {name: r, select: {cgroups: [/r]}, preset: restricted}
`)
	sb := p.Sandbox("r")
	ev := func(kind audit.Kind, msg string, target *audit.TargetDetail, file *audit.FileDetail) audit.Event {
		return audit.Event{Kind: kind, Verdict: audit.VerdictDenied, Mechanism: "lsm", Rule: "rule-x", Sandbox: audit.Sandbox{Name: "r"},
			Process: audit.Process{Comm: "sh", TGID: 7}, Message: msg, Target: target, File: file}
	}
	events := []audit.Event{
		ev(audit.KindSignal, "other_process: signal 9 to pid 42 (sshd), outside the sandbox", &audit.TargetDetail{PID: 42, Comm: "sshd"}, nil),
		ev(audit.KindPtrace, "other_process: ptrace-mode read (/proc/PID/environ, maps, fd, ns...) of pid 42 (sshd), outside the sandbox", &audit.TargetDetail{PID: 42, Comm: "sshd", Mode: 0x11}, nil),
		ev(audit.KindFileOpen, "other_ipc: a POSIX message queue created outside the sandbox", nil, &audit.FileDetail{Path: "/q"}),
		ev(audit.KindOperation, "tty_inject: ioctl 0x5412 (TIOCSTI/TIOCLINUX)", &audit.TargetDetail{}, nil),
		ev(audit.KindFileOp, "notify_mark: a mark outside the sandbox's workspaces", nil, &audit.FileDetail{Path: "/root/.aws/credentials", Op: "notify_mark"}),
		// Not an own-subtree event: its own branch.
		ev(audit.KindOperation, "perf_event_open", &audit.TargetDetail{}, nil),
	}
	got := Refusals(p, sb, events, "")
	want := map[string]string{
		"other_processes sshd[42]":            "operations: {other_processes: allow}",
		"other_ipc /q":                        "operations: {other_ipc: allow}",
		"terminals ":                          "operations: {terminals: allow}",
		"notify_marks /root/.aws/credentials": "operations: {notify_marks: allow}",
	}
	seen := map[string]bool{}
	for _, r := range got {
		key := r.Operation + " " + r.Path + r.Address
		if w, ok := want[key]; ok {
			seen[key] = true
			if len(r.Allow) != 1 || r.Allow[0] != w || r.Rule != "rule-x" || r.Result != "refused" {
				t.Errorf("%s: %+v, want allow %q and rule rule-x", key, r, w)
			}
		} else if r.Operation == "other_processes" || strings.HasPrefix(r.Note, "perf_event_open") && len(r.Allow) == 1 && strings.Contains(r.Allow[0], "other") {
			t.Errorf("unexpected refusal %+v", r)
		}
	}
	for k := range want {
		if !seen[k] {
			t.Errorf("no refusal %q in %+v", k, got)
		}
	}
}
