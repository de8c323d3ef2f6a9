package plan

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/watcherhq/watcher/internal/namerelay"
	"github.com/watcherhq/watcher/internal/policy"
)

func TestNameBindingPlan(t *testing.T) {
	p := parse(t, `version: 1
sandboxes:
  - name: bound
    select: {cgroups: [/b]}
    dns: {allow: [.example.com]}
    egress:
      names:
        bind: true
        read_only: [.docs.example.com]
        ech: [ech.example.net]
        unnamed_ports: ["22", "2200-2299"]
  - name: unbound
    select: {cgroups: [/u]}
`)
	env := Env{LSM: lsmEnv(t, errRefused), DNSProxy4: netip.MustParseAddrPort("127.0.0.1:5300")}
	plan, rt := compile(t, p, env)
	nb, ok := plan.Names[plan.SandboxIDs["bound"]]
	if !ok {
		t.Fatal("no name binding for the bound sandbox")
	}
	if _, ok := plan.Names[plan.SandboxIDs["unbound"]]; ok {
		t.Error("name binding for a sandbox without egress.names.bind")
	}
	want := []namerelay.PortRange{{Lo: 22, Hi: 22}, {Lo: 2200, Hi: 2299}}
	if nb.Sandbox != "bound" || nb.QUIC || !slices.Equal(nb.UnnamedPorts, want) || !slices.Equal(nb.ReadOnly, []string{".docs.example.com"}) ||
		!slices.Equal(nb.ECH, []string{"ech.example.net"}) || rt.Name(nb.RuleID) != "egress-names" {
		t.Errorf("binding = %+v", nb)
	}
	if _, note, ok := findLayer(plan, "egress names"); !ok || !strings.Contains(note, "QUIC") {
		t.Errorf("layer note: %q %v", note, ok)
	}
}

func TestNameBindingNeedsResolved(t *testing.T) {
	_, err := policy.Parse("test.yaml", []byte(`version: 1
sandboxes:
  - name: x
    select: {cgroups: [/x]}
    egress: {default: deny, names: {bind: true, read_only: ["bad name!"]}}
`))
	if err == nil || !strings.Contains(err.Error(), "egress default resolved") || !strings.Contains(err.Error(), "read_only") {
		t.Fatalf("err = %v", err)
	}
}
