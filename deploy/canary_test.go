package deploy

import (
	"bytes"
	"testing"
)

// TestPrometheusCanaryRules: the canary's alert rules load, their unit
// tests pass, every alert is tested, and the tests fail against rules that
// ignore a single failure or never notice a stopped canary.
func TestPrometheusCanaryRules(t *testing.T) {
	r := promRules(t, "canary")
	if n := len(r.alerts()); n != 2 {
		t.Fatalf("canary.yml has %d alerts, want the failure and the not-running rules", n)
	}
	r.requireTested(t)
	// The metric the rule reads is the one the agent exports.
	if !bytes.Contains(r.rules, []byte("watcher_canary_failures_total")) {
		t.Error("canary.yml does not read watcher_canary_failures_total")
	}
	r.mustCatch(t, "WatcherCanaryFailed", "increase(watcher_canary_failures_total[10m]) > 0", "increase(watcher_canary_failures_total[10m]) > 1")
	r.mustCatch(t, "WatcherCanaryNotRunning", "watcher_canary_last_run_timestamp_seconds > 900", "watcher_canary_last_run_timestamp_seconds > 3600")
}
