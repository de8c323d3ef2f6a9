package agent

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/watcherhq/watcher/internal/policy"
)

// TestLocalAnswersPerPreset: every preset refuses DNS answers with local
// addresses (the proxy's LocalAllow is empty) except the networks the
// sandbox's egress rules name explicitly: ops' private ranges, a loopback
// service's 127.0.0.0/8 and ::1, everything for egress default allow.
func TestLocalAnswersPerPreset(t *testing.T) {
	env := Env{DNSProxy4: netip.MustParseAddrPort("127.0.0.1:5300")}
	want := map[string][]string{
		"baseline": nil, "read-only": nil, "restricted": nil, "dev": nil,
		"ops": {"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fd00::/8"},
	}
	for _, preset := range policy.PresetNames() {
		p := parse(t, fmt.Sprintf("version: 1\nsandboxes:\n  - name: sb\n    select: {cgroups: [/w/sb]}\n    preset: %s\n", preset))
		plan, _ := compile(t, p, env)
		got := plan.DNS.Sandboxes["sb"].LocalAllow
		w, ok := want[preset]
		if !ok {
			t.Errorf("preset %s: no expectation", preset)
			continue
		}
		if !slices.Equal(got, w) {
			t.Errorf("preset %s: LocalAllow %v, want %v", preset, got, w)
		}
	}
	p := parse(t, `version: 1
sandboxes:
  - name: svc
    select: {cgroups: [/w/svc]}
    preset: restricted
    egress: {loopback: [{name: db, port: 5432}]}
  - name: open
    select: {cgroups: [/w/open]}
    preset: restricted
    egress: {default: allow}
`)
	plan, _ := compile(t, p, env)
	if got := plan.DNS.Sandboxes["svc"].LocalAllow; !slices.Equal(got, []string{"127.0.0.0/8", "::1/128"}) {
		t.Errorf("loopback service: LocalAllow %v", got)
	}
	if got := plan.DNS.Sandboxes["open"].LocalAllow; !slices.Equal(got, []string{"0.0.0.0/0", "::/0"}) {
		t.Errorf("egress default allow: LocalAllow %v", got)
	}
}
