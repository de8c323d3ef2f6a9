package poll

import (
	"testing"
	"time"
)

func TestWithinHoldsAfterSomeChecks(t *testing.T) {
	n := 0
	if !Within(time.Second, func() bool { n++; return n >= 3 }) {
		t.Fatalf("cond held on the third check, Within said no")
	}
}

func TestWithinTimesOut(t *testing.T) {
	start := time.Now()
	if Within(50*time.Millisecond, func() bool { return false }) {
		t.Fatal("cond never held, Within said yes")
	}
	if d := time.Since(start); d < 50*time.Millisecond {
		t.Fatalf("gave up after %s, before the timeout", d)
	}
}
