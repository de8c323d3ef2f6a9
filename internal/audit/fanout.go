package audit

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// Sink receives events. Notify must not block for long: the fan-out runs on
// the kernel reader's goroutine. A sink whose Notify returns an error is
// removed and closed (as Tetragon does with its listeners).
type Sink interface {
	Notify(Event) error
	io.Closer
}

// Fanout delivers each event to every registered sink, in order.
type Fanout struct {
	mu      sync.RWMutex
	sinks   map[string]Sink
	removed []RemovedSink
	// OnRemove, when set, is called (without locks held) with the name of a
	// sink that failed and was removed, so the caller can record it.
	OnRemove func(name string, err error)
}

// RemovedSink records a sink dropped after a failure.
type RemovedSink struct {
	Name string
	Err  error
	At   time.Time
}

// NewFanout returns an empty fan-out.
func NewFanout() *Fanout { return &Fanout{sinks: map[string]Sink{}} }

// Add registers sink under name, replacing (and closing) any sink of that name.
func (f *Fanout) Add(name string, s Sink) {
	f.mu.Lock()
	old := f.sinks[name]
	f.sinks[name] = s
	f.mu.Unlock()
	if old != nil {
		old.Close()
	}
}

// Remove unregisters and closes the named sink.
func (f *Fanout) Remove(name string) error {
	f.mu.Lock()
	s := f.sinks[name]
	delete(f.sinks, name)
	f.mu.Unlock()
	if s == nil {
		return nil
	}
	return s.Close()
}

// Notify delivers e to every sink. Failing sinks are removed; Notify itself
// returns an error naming them but keeps delivering to the others.
func (f *Fanout) Notify(e Event) error {
	f.mu.RLock()
	var failed map[string]error
	for name, s := range f.sinks {
		if err := s.Notify(e); err != nil {
			if failed == nil {
				failed = map[string]error{}
			}
			failed[name] = err
		}
	}
	f.mu.RUnlock()
	if failed == nil {
		return nil
	}
	var errs []error
	for name, err := range failed {
		f.mu.Lock()
		s := f.sinks[name]
		delete(f.sinks, name)
		f.removed = append(f.removed, RemovedSink{Name: name, Err: err, At: time.Now()})
		f.mu.Unlock()
		if s != nil {
			s.Close()
		}
		if f.OnRemove != nil {
			f.OnRemove(name, err)
		}
		errs = append(errs, fmt.Errorf("sink %s removed: %w", name, err))
	}
	return errors.Join(errs...)
}

// Removed returns the sinks dropped so far.
func (f *Fanout) Removed() []RemovedSink {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return append([]RemovedSink(nil), f.removed...)
}

// Close closes every sink.
func (f *Fanout) Close() error {
	f.mu.Lock()
	sinks := f.sinks
	f.sinks = map[string]Sink{}
	f.mu.Unlock()
	var errs []error
	for name, s := range sinks {
		if err := s.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close sink %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// Queue decouples a possibly slow sink from the producer: Notify never
// blocks, and events that do not fit the bounded queue are counted as
// dropped. Dropped() lets the agent turn drops into loss events.
type Queue struct {
	ch      chan Event
	next    Sink
	dropped atomic.Uint64
	done    chan struct{}
	errMu   sync.Mutex
	err     error
	once    sync.Once
}

// NewQueue starts a goroutine delivering to next through a queue of size n.
func NewQueue(next Sink, n int) *Queue {
	q := &Queue{ch: make(chan Event, n), next: next, done: make(chan struct{})}
	go q.loop()
	return q
}

func (q *Queue) loop() {
	defer close(q.done)
	for e := range q.ch {
		if err := q.next.Notify(e); err != nil {
			q.errMu.Lock()
			q.err = err
			q.errMu.Unlock()
			// Drain so producers never block; everything left is a drop.
			for range q.ch {
				q.dropped.Add(1)
			}
			return
		}
	}
}

// Notify enqueues e without blocking. It returns the downstream sink's
// error once that sink has failed, so the fan-out removes this queue.
func (q *Queue) Notify(e Event) error {
	q.errMu.Lock()
	err := q.err
	q.errMu.Unlock()
	if err != nil {
		return err
	}
	select {
	case q.ch <- e:
	default:
		q.dropped.Add(1)
	}
	return nil
}

// Dropped returns how many events did not fit the queue.
func (q *Queue) Dropped() uint64 { return q.dropped.Load() }

// Close drains the queue into the sink, then closes the sink.
func (q *Queue) Close() error {
	q.once.Do(func() { close(q.ch) })
	<-q.done
	return q.next.Close()
}
