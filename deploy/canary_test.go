package deploy

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestPrometheusCanaryRules: the canary's alert rules load, their unit
// tests pass, every alert is tested, and the tests fail against rules that
// ignore a single failure or never notice a stopped canary.
func TestPrometheusCanaryRules(t *testing.T) {
	promtool := lookTool(t, "promtool", "prometheus")
	if out, err := run(t, "prometheus", promtool, "check", "rules", "canary.yml"); err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	if out, err := run(t, "prometheus", promtool, "test", "rules", "canary_test.yml"); err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
	rules, _ := os.ReadFile("prometheus/canary.yml")
	tests, _ := os.ReadFile("prometheus/canary_test.yml")
	names := regexp.MustCompile(`alert: (\w+)\n`).FindAllSubmatch(rules, -1)
	if len(names) != 2 {
		t.Fatalf("canary.yml has %d alerts, want the failure and the not-running rules", len(names))
	}
	for _, m := range names {
		if !bytes.Contains(tests, []byte("alertname: "+string(m[1])+"\n")) {
			t.Errorf("canary_test.yml does not test %s", m[1])
		}
	}
	// The metric the rule reads is the one the agent exports.
	if !bytes.Contains(rules, []byte("watcher_canary_failures_total")) {
		t.Error("canary.yml does not read watcher_canary_failures_total")
	}
	for name, broken := range map[string][]byte{
		"WatcherCanaryFailed":     bytes.Replace(rules, []byte("increase(watcher_canary_failures_total[10m]) > 0"), []byte("increase(watcher_canary_failures_total[10m]) > 1"), 1),
		"WatcherCanaryNotRunning": bytes.Replace(rules, []byte("watcher_canary_last_run_timestamp_seconds > 900"), []byte("watcher_canary_last_run_timestamp_seconds > 3600"), 1),
	} {
		if bytes.Equal(broken, rules) {
			t.Fatalf("could not break %s for the negative check", name)
		}
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, "canary.yml"), broken, 0o644)
		os.WriteFile(filepath.Join(dir, "canary_test.yml"), tests, 0o644)
		if out, err := run(t, dir, promtool, "test", "rules", "canary_test.yml"); err == nil || !strings.Contains(out, name) {
			t.Errorf("broken %s passed the tests (err %v):\n%s", name, err, out)
		}
	}
}
