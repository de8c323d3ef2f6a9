package pipeline

import (
	"slices"
	"testing"

	"github.com/watcherhq/watcher/internal/audit"
)

// TestSampleStage: alerts are always kept; routine events 1 in N per
// sandbox and kind, in a pattern that depends only on the seed and the
// order of events (the same seed keeps the same events); the rows count
// what was seen and kept since the last Reset.
func TestSampleStage(t *testing.T) {
	const every = 10
	events := func() []audit.Event {
		var evs []audit.Event
		for i := range 200 {
			sb := []string{"a", "b"}[i%2]
			evs = append(evs, audit.Event{Kind: audit.KindFileOpen, Sandbox: audit.Sandbox{Name: sb}})
		}
		return evs
	}
	keep := func(seed uint64) ([]bool, *Sampler) {
		s := NewSampler(every, seed)
		var kept []bool
		for _, ev := range events() {
			kept = append(kept, s.Offer(&ev, false))
		}
		return kept, s
	}
	k1, s := keep(7)
	k2, _ := keep(7)
	if !slices.Equal(k1, k2) {
		t.Fatal("the same seed kept different events")
	}
	rows := s.Rows()
	want := []audit.SampleRow{{Sandbox: "a", Kind: audit.KindFileOpen, Seen: 100, Kept: 10},
		{Sandbox: "b", Kind: audit.KindFileOpen, Seen: 100, Kept: 10}}
	if !slices.Equal(rows, want) {
		t.Fatalf("rows %+v, want %+v", rows, want)
	}
	alert := audit.Event{Kind: audit.KindFileOpen, Sandbox: audit.Sandbox{CgroupID: 9}}
	for range 5 {
		if !s.Offer(&alert, true) {
			t.Fatal("an alert was sampled out")
		}
	}
	s.Reset()
	if rows := s.Rows(); len(rows) != 0 {
		t.Fatalf("rows after Reset: %+v", rows)
	}
	all := NewSampler(0, 1)
	for _, ev := range events() {
		if !all.Offer(&ev, false) {
			t.Fatal("every 0 sampled an event out")
		}
	}
}
