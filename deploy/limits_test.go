package deploy

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/watcherhq/watcher/internal/policy"
)

func TestPrometheusLimitRules(t *testing.T) {
	promtool := lookTool(t, "promtool", "prometheus")
	if out, err := run(t, "prometheus", promtool, "check", "rules", "limits.yml"); err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	out, err := run(t, "prometheus", promtool, "test", "rules", "limits_test.yml")
	if err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
	rules, _ := os.ReadFile("prometheus/limits.yml")
	tests, _ := os.ReadFile("prometheus/limits_test.yml")
	names := regexp.MustCompile(`alert: (\w+)\n`).FindAllSubmatch(rules, -1)
	if len(names) < 5 {
		t.Fatalf("limits.yml has %d alerts, want the 80%% rules for memory, pids, cpu and the OOM and pids-hit rules", len(names))
	}
	for _, m := range names {
		if !bytes.Contains(tests, []byte("alertname: "+string(m[1])+"\n")) {
			t.Errorf("limits_test.yml does not test %s", m[1])
		}
	}
	// The tests can fail: against rules that ignore a single OOM kill or
	// alert only at 90%, they do.
	for name, broken := range map[string][]byte{
		"WatcherSandboxOOMKill":         bytes.Replace(rules, []byte("increase(watcher_sandbox_oom_kills_total[5m]) > 0"), []byte("increase(watcher_sandbox_oom_kills_total[5m]) > 1"), 1),
		"WatcherSandboxPidsNearLimit":   bytes.Replace(rules, []byte("watcher_sandbox_pids / watcher_sandbox_pids_limit > 0.8"), []byte("watcher_sandbox_pids / watcher_sandbox_pids_limit > 0.9"), 1),
		"WatcherSandboxMemoryNearLimit": bytes.Replace(rules, []byte("watcher_sandbox_memory_limit_bytes > 0.8"), []byte("watcher_sandbox_memory_limit_bytes > 0.95"), 1),
	} {
		if bytes.Equal(broken, rules) {
			t.Fatalf("could not break %s for the negative check", name)
		}
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, "limits.yml"), broken, 0o644)
		os.WriteFile(filepath.Join(dir, "limits_test.yml"), tests, 0o644)
		if out, err := run(t, dir, promtool, "test", "rules", "limits_test.yml"); err == nil || !strings.Contains(out, name) {
			t.Errorf("broken %s passed the tests (err %v):\n%s", name, err, out)
		}
	}
}

func TestWorkspaceLimitsExamplePolicy(t *testing.T) {
	p, err := policy.Load("policy/workspace-limits.yaml")
	if err != nil {
		t.Fatal(err)
	}
	sb := p.Sandbox("coder")
	if sb == nil || sb.WorkspaceOptions.Mode != policy.WorkspaceOverlay || sb.Limits.Memory.Bytes != 2<<30 || sb.Limits.PIDs != 512 {
		t.Fatalf("example policy: %+v", sb)
	}
}
