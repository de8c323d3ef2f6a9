package agent

import (
	"testing"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/plan"
)

// TestEnrichNamesDecodedIDs: the reader decodes ids only; the enrich stage
// names sandbox and rule once, from the plan in force and the rule table.
// An id no table knows keeps its "rule-N" label, and a producer's own names
// (the DNS proxy's) are left alone.
func TestEnrichNamesDecodedIDs(t *testing.T) {
	a := &Agent{rules: plan.NewRuleTable()}
	shadow := a.rules.ID("cred-shadow")
	names := map[uint32]string{1: "sb"}
	a.names.Store(&names)

	ev := audit.Event{Kind: audit.KindFileOpen, Verdict: audit.VerdictDenied, Severity: audit.SeverityAlert,
		RuleID: shadow, Rule: enforce.RuleLabel(shadow), Sandbox: audit.Sandbox{ID: 1}}
	a.enrich(&ev)
	if ev.Rule != "cred-shadow" || ev.Sandbox.Name != "sb" {
		t.Errorf("enriched: rule %q sandbox %q, want cred-shadow, sb", ev.Rule, ev.Sandbox.Name)
	}

	unknown := audit.Event{Kind: audit.KindFileOpen, Verdict: audit.VerdictDenied, RuleID: 99, Rule: enforce.RuleLabel(99), Sandbox: audit.Sandbox{ID: 7}}
	a.enrich(&unknown)
	if unknown.Rule != "rule-99" || unknown.Sandbox.Name != "" {
		t.Errorf("unknown ids: rule %q sandbox %q, want rule-99 and no name", unknown.Rule, unknown.Sandbox.Name)
	}

	dns := audit.Event{Kind: audit.KindDNS, Verdict: audit.VerdictDenied, Rule: "dns:other", Sandbox: audit.Sandbox{Name: "other"}}
	a.enrich(&dns)
	if dns.Rule != "dns:other" || dns.Sandbox.Name != "other" {
		t.Errorf("producer's names changed: rule %q sandbox %q", dns.Rule, dns.Sandbox.Name)
	}
}
