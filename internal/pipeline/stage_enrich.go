package pipeline

import (
	"time"

	"github.com/watcherhq/watcher/internal/audit"
)

// Enrich returns the enrich stage: the defaults an event's producer left
// out (Defaults), then name, the agent's own part (sandbox and rule names
// from its tables, labels), if any. It is the one place the pipeline's
// events get their defaults: the ledger sets none on them.
func Enrich(name func(*audit.Event)) func(*audit.Event) bool {
	return func(ev *audit.Event) bool {
		Defaults(ev)
		if name != nil {
			name(ev)
		}
		return true
	}
}

// Defaults sets what a producer may leave out: the time (now), the
// severity (alert for what audit.Event.IsAlert says must never be sampled
// out, routine otherwise) and, for the agent's own events, the mechanism.
// Kernel events arrive with all three decoded (enforce.Reader).
func Defaults(ev *audit.Event) {
	if ev.Time.IsZero() {
		ev.Time = time.Now()
	}
	if ev.Severity == "" {
		ev.Severity = audit.SeverityRoutine
		if ev.IsAlert() {
			ev.Severity = audit.SeverityAlert
		}
	}
	if ev.Kind == audit.KindAgent && ev.Mechanism == "" {
		ev.Mechanism = "agent"
	}
}
