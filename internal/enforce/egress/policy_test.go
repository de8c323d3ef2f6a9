package egress_test

import (
	"testing"

	"github.com/watcherhq/watcher/internal/plan"
	"github.com/watcherhq/watcher/internal/policy"
)

// compiledPolicy is what the agent makes of a policy file: parsed by
// internal/policy and compiled by internal/plan, whose Plan.Egress and
// Plan.DNS the tests apply like the agent (Egress.SetSandbox,
// dnsproxy.Server.SetPolicy). The sandboxes are declared in the body
// ("  - name: sb\n    dns: ...").
func compiledPolicy(t testing.TB, sandboxes string) *plan.Plan {
	t.Helper()
	p, err := policy.Parse("test.yaml", []byte("version: 1\nsandboxes:\n"+sandboxes))
	if err != nil {
		t.Fatalf("policy: %v", err)
	}
	pl, err := plan.Compile(p, plan.Env{}, plan.NewRuleTable())
	if err != nil {
		t.Fatalf("compile policy: %v", err)
	}
	return pl
}

// dnsSandbox declares a sandbox that may resolve the names allow lists
// and no other, with no query rate limit; extra is more of its YAML. A
// policy sandbox needs a selector: the tests bind sandboxes by address.
func dnsSandbox(name, allow, extra string) string {
	return "  - name: " + name + "\n    select: {cgroups: [/" + name + "]}\n" +
		"    dns: {default: deny, allow: [" + allow + "], detection: {rate_limit: 0}}\n" + extra
}
