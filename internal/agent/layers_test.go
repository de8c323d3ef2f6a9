package agent

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/watcherhq/watcher/internal/enforce/lsm"
	"github.com/watcherhq/watcher/internal/plan"
	"github.com/watcherhq/watcher/internal/policy"
)

// The one list serves loading and writing plans: the layers the plan is
// compiled with come first, and IPC creations are recorded before the
// backstop judges objects by them.
func TestLayerOrder(t *testing.T) {
	var l layers
	at := map[layer]int{}
	afterPlan := false
	for i, s := range l.steps() {
		at[s.layer] = i
		if s.beforePlan && afterPlan {
			t.Errorf("%s is loaded before the plan but listed after a layer loaded after it", s.step)
		}
		afterPlan = afterPlan || !s.beforePlan
	}
	if len(at) != 6 {
		t.Errorf("%d layers listed, want 6", len(at))
	}
	if at[&l.lsm] != 0 || at[&l.ipc] > at[&l.backstop] {
		t.Errorf("order %v: want lsm first, ipc tracking before the backstop", at)
	}
}

// Start and reload refuse a plan --require-lsm forbids with the same
// message, which says why BPF LSM cannot block.
func TestCompilePlanRequireLSM(t *testing.T) {
	pol := policy.Default()
	dir := t.TempDir()
	pol.Agent.LedgerDir, pol.Agent.SocketDir = filepath.Join(dir, "ledger"), filepath.Join(dir, "run")
	a := &Agent{opts: Options{RequireLSM: true}, rules: plan.NewRuleTable()}
	a.lsm.probe, a.lsm.probeMech = map[string]error{}, map[string]string{}
	for _, h := range lsm.Hooks() {
		a.lsm.probe[h] = errors.New("refused")
	}
	_, err := a.compilePlan(pol)
	if err == nil || !strings.HasPrefix(err.Error(), "--require-lsm: no BPF LSM program can block ") || !strings.HasSuffix(err.Error(), ")") {
		t.Fatalf("compilePlan: %v, want the --require-lsm refusal with its reason", err)
	}
	t.Log(err)
	a.opts.RequireLSM = false
	if _, err := a.compilePlan(pol); err != nil {
		t.Fatalf("compilePlan without --require-lsm: %v", err)
	}
}
