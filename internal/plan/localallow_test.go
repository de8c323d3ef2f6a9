package plan

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
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
		got := prefixStrings(plan.DNS.Sandboxes["sb"].LocalAllow)
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
	if got := prefixStrings(plan.DNS.Sandboxes["svc"].LocalAllow); !slices.Equal(got, []string{"127.0.0.0/8", "::1/128"}) {
		t.Errorf("loopback service: LocalAllow %v", got)
	}
	if got := prefixStrings(plan.DNS.Sandboxes["open"].LocalAllow); !slices.Equal(got, []string{"0.0.0.0/0", "::/0"}) {
		t.Errorf("egress default allow: LocalAllow %v", got)
	}
}

func prefixStrings(ps []netip.Prefix) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.String())
	}
	return out
}

// TestSideDoorsPlanned: a sandbox whose egress is not allow gets the ping
// socket rules, the resolver-port refusal and unix sockets limited to its
// workspace and egress.unix paths, with layer lines saying so; an egress
// allow sandbox gets none of it, and a kernel without unix hooks is told.
func TestSideDoorsPlanned(t *testing.T) {
	p := parse(t, `version: 1
sandboxes:
  - name: caged
    select: {cgroups: [/w/caged]}
    preset: restricted
    workspace: [/srv/agent]
    egress: {unix: [/run/app.sock]}
  - name: open
    select: {cgroups: [/w/open]}
    preset: restricted
    egress: {default: allow}
`)
	plan, _ := compile(t, p, Env{DNSProxy4: netip.MustParseAddrPort("127.0.0.1:5300")})
	caged, open := plan.Egress[plan.SandboxIDs["caged"]], plan.Egress[plan.SandboxIDs["open"]]
	if !caged.ResolverPorts || !caged.RestrictUnix || !slices.Equal(caged.UnixPaths, []string{"/srv/agent/", "/run/app.sock", "/run/watcher/sandboxes/caged/tools.sock"}) {
		t.Errorf("caged egress: %+v", caged)
	}
	if open.ResolverPorts || open.RestrictUnix {
		t.Errorf("egress allow sandbox restricted: %+v", open)
	}
	pings := map[uint32]int{}
	for _, r := range plan.Sockets {
		if r.Type == 2 && (r.Protocol == 1 || r.Protocol == 58) {
			pings[r.Sandbox]++
		}
	}
	if pings[plan.SandboxIDs["caged"]] != 2 || pings[plan.SandboxIDs["open"]] != 0 {
		t.Errorf("ping socket rules per sandbox: %v", pings)
	}
	mech := map[string]string{}
	for _, l := range plan.Layers {
		mech[l.Rule] = l.Mechanism
	}
	for _, r := range []string{"caged: egress: unix sockets", "caged: egress: ping sockets", "caged: egress: other resolvers' ports"} {
		if mech[r] != MechCgroupBPF {
			t.Errorf("layer %q: %q", r, mech[r])
		}
	}
	plan, _ = compile(t, p, Env{DNSProxy4: netip.MustParseAddrPort("127.0.0.1:5300"), UnixSockets: errors.New("kernel 6.1")})
	for _, l := range plan.Layers {
		if l.Rule == "caged: egress: unix sockets" && (l.Mechanism != MechNone || !strings.Contains(l.Note, "cannot refuse")) {
			t.Errorf("unix sockets without the hooks: %+v", l)
		}
	}
}

// TestProbeSocketsLeftWhenAbsent: the nscd paths glibc probes on every
// lookup stay connectable only while the host has no socket there
// (Env.AbsentProbeSockets lists them; the agent's probe is tested in
// internal/agent, TestProbeSocketsAbsent); otherwise they stay refused.
func TestProbeSocketsLeftWhenAbsent(t *testing.T) {
	p := parse(t, `version: 1
sandboxes:
  - name: caged
    select: {cgroups: [/w/caged]}
    preset: restricted
    workspace: [/srv/agent]
`)
	plan, _ := compile(t, p, Env{DNSProxy4: netip.MustParseAddrPort("127.0.0.1:5300"), AbsentProbeSockets: []string{"/var/run/nscd/socket"}})
	caged := plan.Egress[plan.SandboxIDs["caged"]]
	if !slices.Contains(caged.UnixPaths, "/var/run/nscd/socket") || !caged.RestrictUnix {
		t.Errorf("absent nscd socket not left connectable: %+v", caged)
	}
	plan, _ = compile(t, p, Env{DNSProxy4: netip.MustParseAddrPort("127.0.0.1:5300")})
	if caged := plan.Egress[plan.SandboxIDs["caged"]]; slices.Contains(caged.UnixPaths, "/var/run/nscd/socket") {
		t.Errorf("nscd socket connectable although the host has one: %+v", caged)
	}
}
