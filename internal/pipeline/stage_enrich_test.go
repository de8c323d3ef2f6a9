package pipeline

import (
	"testing"

	"github.com/watcherhq/watcher/internal/audit"
)

// TestEnrichStage: defaults fill only what the producer left out, then the
// naming function runs; a kernel event's decoded fields stay as they are.
func TestEnrichStage(t *testing.T) {
	named := 0
	run := Enrich(func(ev *audit.Event) { named++; ev.Sandbox.Name = "sb" })

	agent := audit.Event{Kind: audit.KindAgent, Verdict: audit.VerdictRecorded}
	run(&agent)
	if agent.Time.IsZero() || agent.Severity != audit.SeverityRoutine || agent.Mechanism != "agent" || agent.Sandbox.Name != "sb" {
		t.Fatalf("agent event %+v", agent)
	}
	refused := audit.Event{Kind: audit.KindNet, Verdict: audit.VerdictDenied}
	run(&refused)
	if refused.Severity != audit.SeverityAlert || refused.Mechanism != "" {
		t.Fatalf("refusal: severity %q mechanism %q", refused.Severity, refused.Mechanism)
	}
	decoded := audit.Event{Kind: audit.KindFileOpen, Verdict: audit.VerdictRecorded, Severity: audit.SeverityAlert, Mechanism: "lsm"}
	decoded.Time = decoded.Time.AddDate(2020, 0, 0)
	at := decoded.Time
	run(&decoded)
	if decoded.Severity != audit.SeverityAlert || decoded.Mechanism != "lsm" || !decoded.Time.Equal(at) {
		t.Fatalf("decoded fields changed: %+v", decoded)
	}
	if named != 3 {
		t.Fatalf("naming ran %d times, want 3", named)
	}
	if !Enrich(nil)(&audit.Event{}) {
		t.Fatal("enrich dropped an event")
	}
}
