package audit

import (
	"errors"
	"sync"
	"testing"
)

type recordingSink struct {
	mu     sync.Mutex
	got    []Event
	fail   error
	closed bool
	block  chan struct{}
}

func (s *recordingSink) Notify(e Event) error {
	if s.block != nil {
		<-s.block
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return s.fail
	}
	s.got = append(s.got, e)
	return nil
}

func (s *recordingSink) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	return nil
}

func TestFanoutRemovesFailingSink(t *testing.T) {
	f := NewFanout()
	good, bad := &recordingSink{}, &recordingSink{fail: errors.New("disk gone")}
	var removed []string
	f.OnRemove = func(name string, err error) { removed = append(removed, name) }
	f.Add("good", good)
	f.Add("bad", bad)
	if err := f.Notify(Event{Kind: KindExec}); err == nil {
		t.Fatal("Notify hid the failing sink")
	}
	if err := f.Notify(Event{Kind: KindExit}); err != nil {
		t.Fatalf("failing sink not removed: %v", err)
	}
	if len(good.got) != 2 || !bad.closed || len(removed) != 1 || removed[0] != "bad" {
		t.Fatalf("good got %d, bad closed %v, removed %v", len(good.got), bad.closed, removed)
	}
}

func TestQueueNeverBlocksAndCountsDrops(t *testing.T) {
	slow := &recordingSink{block: make(chan struct{})}
	q := NewQueue(slow, 8)
	for i := 0; i < 100; i++ {
		if err := q.Notify(Event{}); err != nil {
			t.Fatal(err)
		}
	}
	// One event may be held by the delivering goroutine, 8 in the queue.
	if d := q.Dropped(); d < 91 || d > 92 {
		t.Fatalf("dropped %d of 100 with a queue of 8", d)
	}
	close(slow.block)
	q.Close()
	if got := uint64(len(slow.got)) + q.Dropped(); got != 100 {
		t.Fatalf("delivered+dropped = %d, want 100", got)
	}
}

func TestIsAlert(t *testing.T) {
	for _, e := range []Event{{Verdict: VerdictDenied}, {Verdict: VerdictKilled}, {Kind: KindLoss}, {Severity: SeverityAlert}} {
		if !e.IsAlert() {
			t.Errorf("%+v not an alert", e)
		}
	}
	if (&Event{Kind: KindExec, Verdict: VerdictAllowed}).IsAlert() {
		t.Error("routine exec is an alert")
	}
}
