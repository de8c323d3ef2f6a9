package collect

import (
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
)

func TestFindWaitsForALateEvent(t *testing.T) {
	var c Events
	ch := make(chan audit.Event)
	go c.Drain(ch)
	go func() {
		time.Sleep(50 * time.Millisecond)
		ch <- audit.Event{Message: "late"}
		close(ch)
	}()
	ev, ok := c.Find(time.Second, func(ev audit.Event) bool { return ev.Message == "late" })
	if !ok || ev.Message != "late" {
		t.Fatalf("Find = %+v, %v", ev, ok)
	}
	if n := c.Count(func(audit.Event) bool { return true }); n != 1 {
		t.Fatalf("Count = %d, want 1", n)
	}
	c.Reset()
	if len(c.All()) != 0 {
		t.Fatal("Reset kept events")
	}
}
