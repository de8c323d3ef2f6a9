package deploy

import (
	"testing"

	"github.com/watcherhq/watcher/internal/policy"
)

func TestPrometheusLimitRules(t *testing.T) {
	r := promRules(t, "limits")
	if n := len(r.alerts()); n < 5 {
		t.Fatalf("limits.yml has %d alerts, want the 80%% rules for memory, pids, cpu and the OOM and pids-hit rules", n)
	}
	r.requireTested(t)
	// The tests can fail: against rules that ignore a single OOM kill or
	// alert only at 90%, they do.
	r.mustCatch(t, "WatcherSandboxOOMKill", "increase(watcher_sandbox_oom_kills_total[5m]) > 0", "increase(watcher_sandbox_oom_kills_total[5m]) > 1")
	r.mustCatch(t, "WatcherSandboxPidsNearLimit", "watcher_sandbox_pids / watcher_sandbox_pids_limit > 0.8", "watcher_sandbox_pids / watcher_sandbox_pids_limit > 0.9")
	r.mustCatch(t, "WatcherSandboxMemoryNearLimit", "watcher_sandbox_memory_limit_bytes > 0.8", "watcher_sandbox_memory_limit_bytes > 0.95")
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
