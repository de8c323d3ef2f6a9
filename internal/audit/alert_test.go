package audit

import "testing"

// TestIsAlert: what sampling may never drop.
func TestIsAlert(t *testing.T) {
	for _, tc := range []struct {
		ev   Event
		want bool
	}{
		{Event{Kind: KindDNS, Verdict: VerdictAllowed, Severity: SeverityRoutine}, false},
		{Event{Kind: KindDNS, Verdict: VerdictDenied, Severity: SeverityRoutine}, true},
		// The record-mode counterpart of the refusal above.
		{Event{Kind: KindDNS, Verdict: VerdictRecorded, Severity: SeverityRoutine}, true},
		{Event{Kind: KindAgent, Verdict: VerdictRecorded, Severity: SeverityRoutine}, false},
		{Event{Kind: KindAgent, Verdict: VerdictRecorded, Severity: SeverityAlert}, true},
		{Event{Kind: KindPosture, Verdict: VerdictRecorded, Severity: SeverityRoutine}, true},
	} {
		if got := tc.ev.IsAlert(); got != tc.want {
			t.Errorf("%s/%s/%s: IsAlert %v, want %v", tc.ev.Kind, tc.ev.Verdict, tc.ev.Severity, got, tc.want)
		}
	}
}
