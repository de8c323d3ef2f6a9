package audit

import "io"

// Sink receives events (the ledger, the live tail). Notify must not block
// for long: it runs on the producer's goroutine. The agent's pipeline
// (internal/pipeline) removes a sink whose Notify returns an error.
type Sink interface {
	Notify(Event) error
	io.Closer
}
