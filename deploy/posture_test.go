package deploy

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestPrometheusPostureRules(t *testing.T) {
	promtool := lookTool(t, "promtool", "prometheus")
	if out, err := run(t, "prometheus", promtool, "check", "rules", "posture.yml"); err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	if out, err := run(t, "prometheus", promtool, "test", "rules", "posture_test.yml"); err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
	// The test can fail: against a rule that waits for two lacking
	// cgroups, it does.
	rules, _ := os.ReadFile("prometheus/posture.yml")
	tests, _ := os.ReadFile("prometheus/posture_test.yml")
	broken := bytes.Replace(rules, []byte("watcher_posture_missing > 0"), []byte("watcher_posture_missing > 1"), 1)
	if bytes.Equal(broken, rules) {
		t.Fatal("could not break the rule for the negative check")
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "posture.yml"), broken, 0o644)
	os.WriteFile(filepath.Join(dir, "posture_test.yml"), tests, 0o644)
	if out, err := run(t, dir, promtool, "test", "rules", "posture_test.yml"); err == nil || !strings.Contains(out, "WatcherPostureMissing") {
		t.Errorf("the broken rule passed the tests (err %v):\n%s", err, out)
	}
}
