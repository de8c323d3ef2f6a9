package pipeline

import (
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/watcherhq/watcher/internal/audit"
)

type recorder struct {
	name   string
	mu     sync.Mutex
	seen   []string
	fail   error
	decide func(*audit.Event) Decision
	closed bool
}

func (r *recorder) Name() string { return r.name }
func (r *recorder) Close() error { r.closed = true; return nil }
func (r *recorder) Consume(ev *audit.Event) (Decision, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen = append(r.seen, string(ev.Kind)+":"+ev.Message)
	if r.fail != nil {
		return Decision{}, r.fail
	}
	if r.decide != nil {
		return r.decide(ev), nil
	}
	return Decision{}, nil
}

// TestStagesSinksDecisions: stages run in order before any sink; every
// sink sees the same (changed) event; a decision's events follow the event
// that caused it, through every stage and sink; a failing sink is removed
// and closed, and its removal is a loss event the others record.
func TestStagesSinksDecisions(t *testing.T) {
	var order []string
	stages := []Stage{
		{Name: "enrich", Run: func(ev *audit.Event) bool { order = append(order, "enrich"); ev.Message += "+e"; return true }},
		{Name: "redact", Run: func(ev *audit.Event) bool {
			order = append(order, "redact")
			ev.Message += "+r"
			return ev.Kind != "drop"
		}},
	}
	ledger := &recorder{name: "ledger"}
	watch := &recorder{name: "watch", decide: func(ev *audit.Event) Decision {
		if ev.Kind == audit.KindFileOpen {
			return Decision{Kind: "freeze", Value: 42}
		}
		return Decision{}
	}}
	broken := &recorder{name: "broken"}
	p := New(stages, ledger, watch, broken)
	var decided []Decision
	p.Decide = func(d Decision) []audit.Event {
		decided = append(decided, d)
		return []audit.Event{{Kind: audit.KindEscape, Message: "froze"}}
	}
	p.Emit(&audit.Event{Kind: audit.KindFileOpen, Message: "open"})
	want := []string{"file_open:open+e+r", "escape:froze+e+r"}
	if !slices.Equal(ledger.seen, want) || !slices.Equal(watch.seen, want) {
		t.Fatalf("ledger saw %q, watch saw %q; want %q", ledger.seen, watch.seen, want)
	}
	if len(decided) != 1 || decided[0].Sink != "watch" || decided[0].Value != 42 {
		t.Fatalf("decisions %+v", decided)
	}
	if !slices.Equal(order, []string{"enrich", "redact", "enrich", "redact"}) {
		t.Fatalf("stage order %q", order)
	}

	p.Emit(&audit.Event{Kind: "drop", Message: "x"})
	if _, dropped := p.Stats(); dropped["redact"] != 1 || len(ledger.seen) != 2 {
		t.Fatalf("dropped %v, ledger saw %q", dropped, ledger.seen)
	}

	broken.fail = errors.New("disk gone")
	p.Emit(&audit.Event{Kind: audit.KindExec, Message: "run"})
	if !broken.closed || len(p.Removed()) != 1 || p.Removed()[0].Name != "broken" {
		t.Fatalf("failing sink not removed: closed %v, removed %+v", broken.closed, p.Removed())
	}
	last := ledger.seen[len(ledger.seen)-1]
	if last != "loss:sink removed after an error: disk gone+e+r" {
		t.Fatalf("ledger's last record %q, want the loss of the broken sink", last)
	}
	if _, sinks := p.Names(); !slices.Equal(sinks, []string{"ledger", "watch"}) {
		t.Fatalf("sinks %q", sinks)
	}
	if err := p.Close(); err != nil || !ledger.closed || !watch.closed {
		t.Fatalf("close: %v", err)
	}
	p.Emit(&audit.Event{Kind: audit.KindExec, Message: "late"})
	if slices.Contains(ledger.seen, "exec:late+e+r") {
		t.Fatal("event after Close delivered")
	}
}

// TestDecisionLoopBounded: a decision whose event causes another decision,
// forever, stops after maxFollowUps.
func TestDecisionLoopBounded(t *testing.T) {
	loop := &recorder{name: "loop", decide: func(*audit.Event) Decision { return Decision{Kind: "again"} }}
	p := New(nil, loop)
	p.Decide = func(Decision) []audit.Event { return []audit.Event{{Kind: audit.KindEscape}} }
	p.Emit(&audit.Event{Kind: audit.KindExec})
	if n := len(loop.seen); n != 1+maxFollowUps {
		t.Fatalf("%d events, want %d", n, 1+maxFollowUps)
	}
}
