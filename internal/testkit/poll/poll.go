// Package poll replaces the hand-written wait loops of the tests: poll a
// condition until it holds or a deadline passes.
package poll

import (
	"testing"
	"time"
)

// Interval is how long the helpers sleep between two checks; most of the
// loops they replace slept 10-50 ms.
const Interval = 20 * time.Millisecond

// Within checks cond every Interval until it holds or timeout passes, and
// says whether it held. For waits whose caller goes on either way.
func Within(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(Interval)
	}
}

// Eventually fails the test with the formatted message when cond has not
// held within timeout.
func Eventually(t testing.TB, timeout time.Duration, cond func() bool, format string, args ...any) {
	t.Helper()
	if !Within(timeout, cond) {
		t.Fatalf(format+" (waited %s)", append(args, timeout)...)
	}
}
