package metrics

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/watcherhq/watcher/internal/audit"
)

// The canary's series come from the record of each run (its CanaryDetail)
// as it passes the pipeline, like every other counter: a passing check's
// series exists from the first run at 0, a failing one counts up, and the
// check events and the run's own event are counted as events too.
func TestCanarySeriesFromRunRecords(t *testing.T) {
	m := New()
	run := func(at time.Time, mountOK bool) {
		e := audit.Event{Time: at, Kind: audit.KindCanary, Verdict: audit.VerdictRecorded,
			Sandbox: audit.Sandbox{Name: "a", Labels: map[string]string{audit.LabelCanary: "run"}},
			Canary: &audit.CanaryDetail{Reason: "interval", Checks: []audit.CanaryCheck{
				{Name: "runtime/file_read_blocked", OK: true}, {Name: "exec/mount", OK: mountOK}}}}
		if _, err := m.Consume(&e); err != nil {
			t.Fatal(err)
		}
	}
	t0 := time.Unix(1_800_000_000, 0)
	run(t0, true)
	run(t0.Add(time.Minute), false)
	run(t0.Add(2*time.Minute), false)
	// A canary event without a run record (a failed check's alert) counts
	// as an event only.
	if _, err := m.Consume(&audit.Event{Kind: audit.KindCanary, Verdict: audit.VerdictRecorded,
		Sandbox: audit.Sandbox{Name: "a", Labels: map[string]string{audit.LabelCanary: "mount"}}}); err != nil {
		t.Fatal(err)
	}

	want := `
# HELP watcher_canary_failures_total Canary checks whose result differed from the policy (a forbidden operation that worked, an allowed one refused, an event that never reached the ledger), by sandbox and check (PATH/CHECK).
# TYPE watcher_canary_failures_total counter
watcher_canary_failures_total{check="exec/mount",sandbox="a"} 2
watcher_canary_failures_total{check="runtime/file_read_blocked",sandbox="a"} 0
# HELP watcher_canary_last_run_timestamp_seconds Unix time of the sandbox's last canary run.
# TYPE watcher_canary_last_run_timestamp_seconds gauge
watcher_canary_last_run_timestamp_seconds{sandbox="a"} 1.80000012e+09
# HELP watcher_canary_runs_total Canary runs, by sandbox.
# TYPE watcher_canary_runs_total counter
watcher_canary_runs_total{sandbox="a"} 3
`
	if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(want),
		"watcher_canary_failures_total", "watcher_canary_last_run_timestamp_seconds", "watcher_canary_runs_total"); err != nil {
		t.Error(err)
	}
	var canaryEvents uint64
	counts, _ := m.events.Load().(map[eventKey]*atomic.Uint64)
	for k, c := range counts {
		if k.kind == audit.KindCanary && k.canary {
			canaryEvents += c.Load()
		}
	}
	if canaryEvents != 4 {
		t.Errorf("%d canary events counted, want 4 (three runs, one check alert)", canaryEvents)
	}
}
