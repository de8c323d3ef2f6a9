package pipeline

import "github.com/watcherhq/watcher/internal/audit"

// The fan-out: the pipeline's sinks, in order (Pipeline.run), and the
// adapters that make sinks of what is not one.

// RedactedAppender is a ledger (ledger.Ledger) seen by its sink: it
// appends events the redact stage has already redacted, as they are.
type RedactedAppender interface {
	// NotifyRedacted appends ev, which it neither keeps nor changes. It
	// fails only once the ledger is closed.
	NotifyRedacted(ev *audit.Event) error
	Close() error
}

// LedgerSink is the ledger's sink. It hands the event over by pointer and
// the ledger does not redact it again: the redact stage did, once.
type LedgerSink struct{ Ledger RedactedAppender }

// Name implements Sink.
func (LedgerSink) Name() string { return "ledger" }

// Consume implements Sink.
func (s LedgerSink) Consume(ev *audit.Event) (Decision, error) {
	return Decision{}, s.Ledger.NotifyRedacted(ev)
}

// Close implements Sink.
func (s LedgerSink) Close() error { return s.Ledger.Close() }

// SinkFunc adapts a function (a sink with nothing to close and no
// decisions: logs) to Sink.
type SinkFunc struct {
	SinkName string
	Fn       func(*audit.Event)
}

// Name implements Sink.
func (f SinkFunc) Name() string { return f.SinkName }

// Consume implements Sink.
func (f SinkFunc) Consume(ev *audit.Event) (Decision, error) { f.Fn(ev); return Decision{}, nil }

// Close implements Sink.
func (f SinkFunc) Close() error { return nil }

// Notifier adapts an audit.Sink (tail) to Sink: it gets a copy.
type Notifier struct {
	SinkName string
	Sink     audit.Sink
}

// Name implements Sink.
func (n Notifier) Name() string { return n.SinkName }

// Consume implements Sink.
func (n Notifier) Consume(ev *audit.Event) (Decision, error) { return Decision{}, n.Sink.Notify(*ev) }

// Close implements Sink.
func (n Notifier) Close() error { return n.Sink.Close() }

// EmitFunc adapts the function that emits into the pipeline (the agent's
// emit) to audit.Sink, for producers that take one (the DNS proxy): the
// way in, where Notifier is a way out. Notify never fails.
type EmitFunc func(audit.Event)

// Notify implements audit.Sink.
func (f EmitFunc) Notify(ev audit.Event) error { f(ev); return nil }

// Close implements audit.Sink.
func (EmitFunc) Close() error { return nil }
