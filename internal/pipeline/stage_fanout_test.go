package pipeline

import (
	"errors"
	"testing"

	"github.com/watcherhq/watcher/internal/audit"
)

type appender struct {
	got    []*audit.Event
	err    error
	closed bool
}

func (a *appender) NotifyRedacted(ev *audit.Event) error { a.got = append(a.got, ev); return a.err }
func (a *appender) Close() error                         { a.closed = true; return nil }

type notified struct {
	got    []audit.Event
	closed bool
}

func (n *notified) Notify(ev audit.Event) error { n.got = append(n.got, ev); return nil }
func (n *notified) Close() error                { n.closed = true; return nil }

// TestFanOutAdapters: the ledger's sink hands over the pipeline's event
// itself (redacted once, not copied) and passes on the ledger's error (the
// pipeline then removes it); Notifier hands a copy; EmitFunc is the way in
// for producers that take an audit.Sink.
func TestFanOutAdapters(t *testing.T) {
	led := &appender{}
	tail := &notified{}
	p := New([]Stage{{Name: "redact", Run: Redact}}, LedgerSink{Ledger: led}, Notifier{SinkName: "tail", Sink: tail})
	emit := EmitFunc(func(ev audit.Event) { p.Emit(&ev) })
	if err := emit.Notify(audit.Event{Kind: audit.KindExec, Message: "token=s3cr3t"}); err != nil {
		t.Fatal(err)
	}
	if len(led.got) != 1 || len(tail.got) != 1 || led.got[0].Message != tail.got[0].Message || tail.got[0].Message == "token=s3cr3t" {
		t.Fatalf("ledger %+v, tail %+v", led.got, tail.got)
	}
	if _, sinks := p.Names(); len(sinks) != 2 || sinks[0] != "ledger" {
		t.Fatalf("sinks %q", sinks)
	}
	led.err = errors.New("ledger closed")
	p.Emit(&audit.Event{Kind: audit.KindExec})
	if !led.closed || len(p.Removed()) != 1 || p.Removed()[0].Name != "ledger" {
		t.Fatalf("failed ledger sink not removed: %+v", p.Removed())
	}
	if err := p.Close(); err != nil || !tail.closed {
		t.Fatalf("close: %v", err)
	}

	var logged []string
	f := SinkFunc{SinkName: "log", Fn: func(ev *audit.Event) { logged = append(logged, ev.Message) }}
	if d, err := f.Consume(&audit.Event{Message: "x"}); err != nil || d.Kind != "" || len(logged) != 1 || f.Name() != "log" || f.Close() != nil {
		t.Fatalf("SinkFunc: %v %+v %q", err, d, logged)
	}
}
