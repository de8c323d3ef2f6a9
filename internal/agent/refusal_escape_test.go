package agent

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/watcherhq/watcher/internal/audit"
)

// A process named with terminal escape sequences must not erase or hide
// its own refusal line (issue 26): the summary shows every field a sandbox
// names escaped, one line per refusal, printable UTF-8 as it is; the JSON
// report keeps the exact text.
func TestRefusalSummaryEscapesSandboxNames(t *testing.T) {
	const (
		evil      = "x\x1b[G\x1b[K\x1b[8mhid\nden\rline\u202eevil\u0085c1\xffbad"
		evilShown = `x\x1b[G\x1b[K\x1b[8mhid\nden\rline\u202eevil\u0085c1\xffbad`
		benign    = "café-日本🦀e\u0301"
	)
	p := parse(t, `version: 1
sandboxes:
  - {name: r, select: {cgroups: [/r]}, preset: restricted}
`)
	sb := p.Sandbox("r")
	summary := func(name string) (string, *RunReport) {
		proc := audit.Process{Comm: name, TGID: 7}
		events := []audit.Event{
			{Kind: audit.KindFileOpen, Verdict: audit.VerdictDenied, Mechanism: "landlock", Sandbox: audit.Sandbox{Name: "r"}, Process: proc,
				File: &audit.FileDetail{Path: "/etc/" + name, Write: true}, Syscall: &audit.SyscallDetail{Name: "openat", Ret: -13}},
			{Kind: audit.KindDNS, Verdict: audit.VerdictDenied, Mechanism: "dnsproxy", Sandbox: audit.Sandbox{Name: "r"}, Process: proc,
				DNS: &audit.DNSDetail{Name: name + ".example.", Reason: "not in the allowlist: " + name}},
			{Kind: audit.KindNet, Verdict: audit.VerdictKilled, Mechanism: "kill", Sandbox: audit.Sandbox{Name: "r"}, Process: proc,
				Net: &audit.NetDetail{Family: 1, Op: "connect", Addr: "/run/" + name, Reason: name}},
			{Kind: audit.KindMount, Verdict: audit.VerdictDenied, Mechanism: "lsm", Sandbox: audit.Sandbox{Name: "r"}, Process: proc,
				Mount: &audit.MountDetail{Op: "mount", Target: "/mnt/" + name}, Message: "mount of " + name},
		}
		rep := &RunReport{Label: "call-" + name, Sandbox: "r", Mode: "enforce", Refusals: Refusals(p, sb, events, "/")}
		var b bytes.Buffer
		rep.WriteSummary(&b)
		return b.String(), rep
	}
	plain, _ := summary("plain")
	out, rep := summary(evil)
	if !utf8.ValidString(out) {
		t.Errorf("invalid UTF-8 in the summary:\n%q", out)
	}
	for _, r := range out {
		if r != '\n' && !unicode.IsPrint(r) {
			t.Errorf("raw %U in the summary:\n%q", r, out)
			break
		}
	}
	if got, want := strings.Count(out, "\n"), strings.Count(plain, "\n"); got != want {
		t.Errorf("%d lines with the hostile name, %d with a plain one:\n%s", got, want, out)
	}
	for _, want := range []string{"label=call-" + evilShown, "/etc/" + evilShown, evilShown + "[7]", "/run/" + evilShown, "path: /etc/" + evilShown} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q:\n%s", want, out)
		}
	}

	// The JSON report keeps the exact text (encoding/json's own escapes).
	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back RunReport
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if exact := strings.ToValidUTF8(evil, "\ufffd"); back.Label != "call-"+exact || back.Refusals[0].Path != "/etc/"+exact {
		t.Errorf("JSON report changed the names: %q %q", back.Label, back.Refusals[0].Path)
	}

	// The benign neighbour: printable UTF-8 as it is.
	nice, _ := summary(benign)
	if !strings.Contains(nice, "/etc/"+benign) || !strings.Contains(nice, benign+"[7]") || strings.Contains(nice, `\`) {
		t.Errorf("printable UTF-8 changed:\n%s", nice)
	}
}
