package main

import (
	"encoding/json"
	"strings"
	"testing"
)

func feed(t *testing.T, events ...event) (string, bool) {
	t.Helper()
	var b strings.Builder
	r := newReport(&b)
	for _, e := range events {
		// Through JSON, as go test writes them.
		data, _ := json.Marshal(e)
		var back event
		if err := json.Unmarshal(data, &back); err != nil {
			t.Fatal(err)
		}
		r.add(back)
	}
	ok := r.finish()
	return b.String(), ok
}

// TestReport: a skip is listed with its reason and counted, a failure
// shows its output and fails the report, and a package cut off (go test
// killed) fails it too; a clean run passes.
func TestReport(t *testing.T) {
	const pkg = "example.com/p"
	out, ok := feed(t,
		event{Action: "start", Package: pkg},
		event{Action: "output", Package: pkg, Test: "TestA/ia32", Output: "=== RUN   TestA/ia32\n"},
		event{Action: "output", Package: pkg, Test: "TestA/ia32", Output: "    a_test.go:12: 32-bit system calls: not available\n"},
		event{Action: "output", Package: pkg, Test: "TestA/ia32", Output: "--- SKIP: TestA/ia32 (0.00s)\n"},
		event{Action: "skip", Package: pkg, Test: "TestA/ia32"},
		event{Action: "pass", Package: pkg, Test: "TestA"},
		event{Action: "pass", Package: pkg, Elapsed: 1.5},
	)
	if !ok || !strings.Contains(out, "1  32-bit system calls: not available\n        example.com/p TestA/ia32") || !strings.Contains(out, "ok  \texample.com/p\t1.500s") {
		t.Errorf("clean run with a skip: ok=%v\n%s", ok, out)
	}

	out, ok = feed(t,
		event{Action: "start", Package: pkg},
		event{Action: "output", Package: pkg, Test: "TestB", Output: "    b_test.go:3: want 2, got 3\n"},
		event{Action: "fail", Package: pkg, Test: "TestB"},
		event{Action: "fail", Package: pkg},
	)
	if ok || !strings.Contains(out, "want 2, got 3") || !strings.Contains(out, "FAIL\texample.com/p") {
		t.Errorf("failed test: ok=%v\n%s", ok, out)
	}

	out, ok = feed(t,
		event{Action: "start", Package: pkg},
		event{Action: "output", Package: pkg, Output: "panic: test timed out after 30m0s\n"},
	)
	if ok || !strings.Contains(out, "no result") || !strings.Contains(out, "test timed out") {
		t.Errorf("cut-off package: ok=%v\n%s", ok, out)
	}
}
