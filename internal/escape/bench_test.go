package escape

import (
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
)

// The scorer sits on the event path (target: 500k events/s end to end), so
// the cost per routine event matters most. Rerun:
//
//	go test -run - -bench . ./internal/escape
func benchEvents(b *testing.B) []audit.Event {
	evs := replayStrace(&testing.T{}, benignWorkloads[0].file)
	if len(evs) == 0 {
		b.Fatal("no events")
	}
	return evs
}

func BenchmarkClassifyBenign(b *testing.B) {
	evs := benchEvents(b)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		ev := &evs[i%len(evs)]
		Classify(ev)
	}
}

func BenchmarkObserveBenign(b *testing.B) {
	evs := benchEvents(b)
	c := newClock()
	s := newScorer(c)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c.advance(time.Microsecond)
		s.Observe(evs[i%len(evs)])
	}
}

func BenchmarkObserveEscapeSignals(b *testing.B) {
	evs := escapeSequence()
	c := newClock()
	s := newScorer(c)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c.advance(time.Millisecond)
		if s.Observe(evs[i%len(evs)]) != nil {
			s.Reset("agent-1")
		}
	}
}
