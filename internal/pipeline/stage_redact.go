package pipeline

import "github.com/watcherhq/watcher/internal/audit"

// Redact is the redact stage: audit.Redact, once, before the fan-out.
// The ledger's sink appends what it leaves without redacting again
// (LedgerSink); every other way into the ledger redacts on append.
func Redact(ev *audit.Event) bool {
	audit.Redact(ev)
	return true
}
