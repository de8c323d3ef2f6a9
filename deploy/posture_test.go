package deploy

import "testing"

func TestPrometheusPostureRules(t *testing.T) {
	r := promRules(t, "posture")
	// The test can fail: against a rule that waits for two lacking
	// cgroups, it does.
	r.mustCatch(t, "WatcherPostureMissing", "watcher_posture_missing > 0", "watcher_posture_missing > 1")
}
