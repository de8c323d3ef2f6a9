// Package collect gathers the audit events a test's pipeline, reader or
// proxy emits, safe for a producer goroutine and the test reading at once.
package collect

import (
	"sync"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/testkit/poll"
)

// Events is a list of events under a lock. The zero value is ready.
type Events struct {
	mu   sync.Mutex
	list []audit.Event
}

// Add appends ev.
func (c *Events) Add(ev audit.Event) {
	c.mu.Lock()
	c.list = append(c.list, ev)
	c.mu.Unlock()
}

// Notify is Add as an audit notifier.
func (c *Events) Notify(ev audit.Event) error {
	c.Add(ev)
	return nil
}

// Drain adds every event of ch until it closes; run it in a goroutine.
func (c *Events) Drain(ch <-chan audit.Event) {
	for ev := range ch {
		c.Add(ev)
	}
}

// All is a copy of the events so far.
func (c *Events) All() []audit.Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]audit.Event(nil), c.list...)
}

// Reset forgets the events so far.
func (c *Events) Reset() {
	c.mu.Lock()
	c.list = nil
	c.mu.Unlock()
}

// Count is how many events so far match pred.
func (c *Events) Count(pred func(audit.Event) bool) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, ev := range c.list {
		if pred(ev) {
			n++
		}
	}
	return n
}

// Find waits up to timeout for an event matching pred and returns the
// first one.
func (c *Events) Find(timeout time.Duration, pred func(audit.Event) bool) (audit.Event, bool) {
	var found audit.Event
	ok := poll.Within(timeout, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, ev := range c.list {
			if pred(ev) {
				found = ev
				return true
			}
		}
		return false
	})
	return found, ok
}
