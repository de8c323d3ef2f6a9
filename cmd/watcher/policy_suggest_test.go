package main

import (
	"strings"
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/policy"
)

// TestSuggestRender: the additions for a recorded run land in the
// sandbox's lists with a comment naming the event, the result is a valid
// policy in enforce mode that allows what was recorded, and what the
// baseline blocks as dangerous is left commented out and still refused.
func TestSuggestRender(t *testing.T) {
	src := []byte(`version: 1
sandboxes:
  - name: agents
    select: {cgroups: [/suggest-test]}
    preset: restricted
    mode: record
    workspace: [/srv/ws]
    tools:
      enabled: true
  - name: other
    select: {cgroups: [/other]}
`)
	pol, err := policy.Parse("p.yaml", src)
	if err != nil {
		t.Fatal(err)
	}
	sb := &pol.Sandboxes[0]
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	proc := audit.Process{Comm: "make", TGID: 42}
	recs := []suggestEvent{
		{seq: 10, ev: audit.Event{Time: at, Kind: audit.KindFileOpen, Verdict: audit.VerdictRecorded, Rule: "write-outside-workspace", Mechanism: "landlock",
			Process: proc, File: &audit.FileDetail{Path: "/opt/out/build.log", Write: true}}},
		{seq: 11, ev: audit.Event{Time: at, Kind: audit.KindFileOpen, Verdict: audit.VerdictRecorded, Rule: "write-outside-workspace", Mechanism: "landlock",
			Process: proc, File: &audit.FileDetail{Path: "/opt/out/build.log", Write: true}}},
		{seq: 12, ev: audit.Event{Time: at, Kind: audit.KindDNS, Verdict: audit.VerdictRecorded, Rule: "dns-default", Mechanism: "dnsproxy",
			Process: proc, DNS: &audit.DNSDetail{Name: "pkg.example.test."}}},
		{seq: 13, ev: audit.Event{Time: at, Kind: audit.KindFileOpen, Verdict: audit.VerdictRecorded, Rule: "cred-shadow", Mechanism: "landlock",
			Process: proc, File: &audit.FileDetail{Path: "/etc/shadow"}}},
		{seq: 14, ev: audit.Event{Time: at, Kind: audit.KindTool, Verdict: audit.VerdictDenied, Rule: "default-deny", Mechanism: "gateway",
			Tool: &audit.ToolDetail{CallID: "c-1", Tool: "shell", Stage: "decision", Decision: "deny"}}},
	}
	adds := suggestAdditions(pol, sb, recs)
	out, err := renderSuggestion(src, "agents", adds)
	if err != nil {
		t.Fatal(err)
	}
	text := string(out)
	t.Logf("suggestion:\n%s", text)
	for _, want := range []string{
		"seq 10 03:04:05: make[42] write /opt/out/build.log, would-refuse by rule write-outside-workspace (landlock) (and 1 more)",
		"seq 12 03:04:05: make[42] resolve pkg.example.test.",
		"seq 14 03:04:05: tool call c-1 (shell) refused by rule default-deny",
		"#   files: [{name: allow-", // /etc/shadow: commented out
	} {
		if !strings.Contains(text, want) {
			t.Errorf("suggestion lacks %q", want)
		}
	}
	got, err := policy.Parse("suggested.yaml", out)
	if err != nil {
		t.Fatalf("the suggestion is not a valid policy: %v\n%s", err, text)
	}
	s := &got.Sandboxes[0]
	if s.Mode != policy.ModeEnforce || got.Sandboxes[1].Name != "other" {
		t.Errorf("mode %q, sandboxes %v", s.Mode, got.Sandboxes)
	}
	files := got.FileRules(s)
	if r, ok := policy.DecideFile(files, "/opt/out/build.log", true); !ok || r.Action != policy.ActionAllow {
		t.Errorf("/opt/out/build.log write: %+v %v, want allowed", r, ok)
	}
	if r, ok := policy.DecideFile(files, "/opt/out/other", true); !ok || r.Action == policy.ActionAllow {
		t.Errorf("/opt/out/other write: %+v %v, want still blocked (the suggestion is exact)", r, ok)
	}
	if r, ok := policy.DecideFile(files, "/etc/shadow", false); !ok || r.Action != policy.ActionBlock {
		t.Errorf("/etc/shadow: %+v %v, want still blocked", r, ok)
	}
	if !contains(s.DNS.Allow, "pkg.example.test") {
		t.Errorf("dns.allow %v lacks pkg.example.test", s.DNS.Allow)
	}
	if r := s.Tools.Tool("shell"); r == nil || r.Action != policy.ToolAllow {
		t.Errorf("shell rule %+v, want allow", r)
	}
	if r := s.Tools.Tool("list_dir"); r == nil || r.Action != policy.ToolAllow {
		t.Errorf("the preset's list_dir rule was lost: %+v", r)
	}
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}
