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
    egress: {names: {bind: false}}
  - name: preset-default
    select: {cgroups: [/d]}
  - name: default-deny
    select: {cgroups: [/n]}
    egress: {default: deny}
`)
	env := Env{LSM: lsmEnv(t, errRefused), DNSProxy4: netip.MustParseAddrPort("127.0.0.1:5300")}
	plan, rt := compile(t, p, env)
	nb, ok := plan.Names[plan.SandboxIDs["bound"]]
	if !ok {
		t.Fatal("no name binding for the bound sandbox")
	}
	if _, ok := plan.Names[plan.SandboxIDs["unbound"]]; ok {
		t.Error("name binding for a sandbox with egress.names.bind false")
	}
	// The presets bind names; leaving the resolved default leaves it.
	if _, ok := plan.Names[plan.SandboxIDs["preset-default"]]; !ok {
		t.Error("no name binding for a sandbox on the baseline preset")
	}
	if _, ok := plan.Names[plan.SandboxIDs["default-deny"]]; ok {
		t.Error("name binding for a sandbox with egress default deny")
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

func TestSecretEnv(t *testing.T) {
	p := parse(t, `version: 1
agent: {ledger_dir: /var/lib/w/ledger}
sandboxes:
  - name: bound
    select: {cgroups: [/b]}
    egress:
      names:
        bind: true
        secrets:
          - {name: openai, env: OPENAI_API_KEY, from_env: OPENAI_API_KEY, hosts: [api.openai.com]}
          - {name: gh, env: GH_TOKEN, from_env: HOST_GH_TOKEN, hosts: [api.github.com]}
`)
	env := SecretEnv(p, "bound", []string{"PATH=/bin", "OPENAI_API_KEY=sk-real", "HOST_GH_TOKEN=ghp-real", "SSL_CERT_FILE=/x"})
	got := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		if _, dup := got[k]; dup {
			t.Errorf("%s twice", k)
		}
		got[k] = v
	}
	ca := "/var/lib/w/sandbox-ca/bound.pem"
	if got["OPENAI_API_KEY"] != Placeholder("bound", "openai") || got["GH_TOKEN"] != Placeholder("bound", "gh") ||
		got["SSL_CERT_FILE"] != ca || got["NODE_EXTRA_CA_CERTS"] != ca || got["PATH"] != "/bin" {
		t.Errorf("env = %v", got)
	}
	for _, kv := range env {
		if strings.Contains(kv, "real") {
			t.Errorf("a real value reached the command: %s", kv)
		}
	}
	if e := SecretEnv(p, "other", []string{"A=1"}); len(e) != 1 {
		t.Errorf("sandbox without secrets: %v", e)
	}
	if _, err := policy.Parse("t.yaml", []byte(`version: 1
sandboxes:
  - name: x
    select: {cgroups: [/x]}
    egress: {names: {secrets: [{name: "a b", env: "1X", from_env: A, from_file: /f}]}}
`)); err == nil || !strings.Contains(err.Error(), "names.bind") || !strings.Contains(err.Error(), "exactly one") || !strings.Contains(err.Error(), "hosts") {
		t.Errorf("bad secrets: %v", err)
	}
}

// egress.names.inspect: the names reach the relay's binding, the layer
// note says TLS is terminated for them, watcher exec points the trust
// variables at the sandbox's bundle (no placeholders: no secrets), and a
// bad entry or inspect without bind is refused.
func TestInspectPlan(t *testing.T) {
	p := parse(t, `version: 1
agent: {ledger_dir: /var/lib/w/ledger}
sandboxes:
  - name: inspected
    select: {cgroups: [/i]}
    egress: {names: {bind: true, inspect: [.cdn.example.net]}}
  - name: plain
    select: {cgroups: [/p]}
    egress: {names: {bind: true}}
`)
	env := Env{LSM: lsmEnv(t, errRefused), DNSProxy4: netip.MustParseAddrPort("127.0.0.1:5300")}
	plan, _ := compile(t, p, env)
	if nb := plan.Names[plan.SandboxIDs["inspected"]]; !slices.Equal(nb.Inspect, []string{".cdn.example.net"}) {
		t.Errorf("inspect = %v", nb.Inspect)
	}
	var inspected, plain int
	for _, l := range plan.Layers {
		if strings.Contains(l.Rule, "egress names") {
			if strings.Contains(l.Note, "1 inspected names") {
				inspected++
			}
			if strings.Contains(l.Note, "inside TLS only the server name is judged") {
				plain++
			}
		}
	}
	if inspected != 1 || plain != 1 {
		t.Errorf("egress names notes: %d say inspected, %d say only the server name (want 1 and 1)", inspected, plain)
	}
	ca := "/var/lib/w/sandbox-ca/inspected.pem"
	got := strings.Join(SecretEnv(p, "inspected", []string{"PATH=/bin"}), " ")
	if !strings.Contains(got, "SSL_CERT_FILE="+ca) || !strings.Contains(got, "REQUESTS_CA_BUNDLE="+ca) || strings.Contains(got, "placeholder") {
		t.Errorf("inspected sandbox env: %s", got)
	}
	if e := SecretEnv(p, "plain", []string{"A=1"}); len(e) != 1 {
		t.Errorf("sandbox inspecting nothing: %v", e)
	}
	_, err := policy.Parse("t.yaml", []byte(`version: 1
sandboxes:
  - name: x
    select: {cgroups: [/x]}
    egress: {names: {bind: false, inspect: ["bad name!"]}}
`))
	if err == nil || !strings.Contains(err.Error(), "inspect") || !strings.Contains(err.Error(), "names.bind") {
		t.Errorf("bad inspect: %v", err)
	}
}
