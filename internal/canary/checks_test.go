package canary

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/control"
	"github.com/watcherhq/watcher/internal/policy"
)

// layersFor is a layer table like the compiler's: every operation and
// file rule of the sandbox enforced by mech, DNS and egress by the cgroup
// hooks.
func layersFor(pol *policy.Policy, sb *policy.Sandbox, mech string) []control.Layer {
	var out []control.Layer
	for _, r := range []string{"ptrace", "mount", "bpf"} {
		out = append(out, control.Layer{Rule: sb.Name + ": " + r, Mechanism: mech})
	}
	for _, r := range pol.FileRules(sb) {
		out = append(out, control.Layer{Rule: fmt.Sprintf("%s: file rule %s (%s %s %s)", sb.Name, r.Name, r.Access, r.Match, r.Path), Mechanism: mech})
	}
	out = append(out, control.Layer{Rule: sb.Name + ": dns", Mechanism: "cgroup_bpf"},
		control.Layer{Rule: sb.Name + ": egress default " + string(sb.Egress.Default), Mechanism: "cgroup_bpf"})
	return out
}

func load(t *testing.T, sandboxYAML string) (*policy.Policy, *policy.Sandbox) {
	t.Helper()
	pol, err := policy.Parse("test.yaml", []byte("version: 1\nsandboxes:\n  - name: s\n    select: {cgroups: [/canary-test]}\n"+sandboxYAML))
	if err != nil {
		t.Fatal(err)
	}
	return pol, pol.Sandbox("s")
}

func byName(checks []Check) map[string]Check {
	m := map[string]Check{}
	for _, c := range checks {
		m[c.Name] = c
	}
	return m
}

func TestPlanRestricted(t *testing.T) {
	ws := t.TempDir()
	pol, sb := load(t, "    preset: restricted\n    workspace: ["+ws+"]\n")
	scratch := t.TempDir()
	checks := byName(Plan(pol, sb, layersFor(pol, sb, "kill"), scratch, "abc"))
	for _, name := range []string{"file_read_blocked", "file_read_allowed", "file_write_outside", "file_write_allowed",
		"mount", "ptrace", "bpf", "dns_unlisted", "connect_unanswered"} {
		if _, ok := checks[name]; !ok {
			t.Errorf("restricted: no %s check; planned %v", name, checks)
		}
	}
	hp := checks["file_read_blocked"]
	if !hp.Forbidden || hp.Fixture != "honeytoken" || !strings.Contains(hp.Target, honeytokenName+"abc") || hp.Mechanism != "kill" {
		t.Errorf("honeytoken check %+v", hp)
	}
	if r, ok := policy.DecideFile(pol.FileRules(sb), hp.Target, false); !ok || r.Action != policy.ActionBlock {
		t.Errorf("honeytoken %s is not under a blocked path (rule %+v)", hp.Target, r)
	}
	// The allowed write goes to the workspace; the forbidden one outside.
	if w := checks["file_write_allowed"]; !strings.HasPrefix(w.Target, ws+"/") || w.Forbidden {
		t.Errorf("allowed write %+v, want inside %s", w, ws)
	}
	if w := checks["file_write_outside"]; strings.HasPrefix(w.Target, ws) || !w.Forbidden {
		t.Errorf("forbidden write %+v", w)
	}
	// Where the backstop enforces, a runtime-placed probe is killed; watcher
	// exec's seccomp and Landlock refuse with an errno first.
	for _, name := range []string{"mount", "ptrace", "bpf", "file_read_blocked"} {
		c := checks[name]
		if got := c.Expected(PathRuntime); got != Killed {
			t.Errorf("%s runtime: expected %s, want killed", name, got)
		}
		if got := c.Expected(PathExec); got != Denied {
			t.Errorf("%s exec: expected %s, want denied", name, got)
		}
	}
	if c := checks["connect_unanswered"]; c.Expected(PathRuntime) != Denied || !c.NeedsEvent() {
		t.Errorf("connect check %+v expects %s", c, c.Expected(PathRuntime))
	}
	if c := checks["dns_unlisted"]; !c.uniqueName || !strings.HasSuffix(c.Target, ".invalid") || c.Reason != "not on allowlist" {
		t.Errorf("dns check %+v", c)
	}
	if c := checks["file_read_allowed"]; c.Expected(PathRuntime) != Allowed || c.NeedsEvent() {
		t.Errorf("allowed read %+v", c)
	}
	// With the LSM, the same checks expect a refusal.
	if c := byName(Plan(pol, sb, layersFor(pol, sb, "lsm"), scratch, "abc"))["mount"]; c.Expected(PathRuntime) != Denied {
		t.Errorf("mount under lsm expects %s", c.Expected(PathRuntime))
	}
}

func TestPlanRecordMode(t *testing.T) {
	pol, sb := load(t, "    preset: restricted\n    mode: record\n")
	checks := Plan(pol, sb, layersFor(pol, sb, "record"), t.TempDir(), "abc")
	if len(checks) == 0 {
		t.Fatal("no checks in record mode")
	}
	for _, c := range checks {
		if c.Forbidden && (!c.Recorded || c.Expected(PathRuntime) != Allowed || !c.NeedsEvent()) {
			t.Errorf("record mode: %+v expects %s (want allowed, with a recorded event)", c, c.Expected(PathRuntime))
		}
	}
}

// A class nothing enforces here is not probed: the operation would happen.
func TestPlanSkipsUnenforced(t *testing.T) {
	pol, sb := load(t, "    preset: restricted\n")
	layers := layersFor(pol, sb, "kill")
	for i := range layers {
		if layers[i].Rule == "s: mount" {
			layers[i].Mechanism = "none"
		}
	}
	checks := byName(Plan(pol, sb, layers, t.TempDir(), "abc"))
	if _, ok := checks["mount"]; ok {
		t.Error("mount probed although nothing enforces it")
	}
	if _, ok := checks["ptrace"]; !ok {
		t.Error("ptrace not probed")
	}
	// No layer table row at all: not probed either.
	if got := Plan(pol, sb, nil, t.TempDir(), "abc"); len(byName(got)) != 2 {
		t.Errorf("without a layer table only the allowed neighbours are planned, got %v", byName(got))
	}
}

func TestPlanBaselineAndAllowances(t *testing.T) {
	// Baseline: DNS allowed by default, nothing to refuse there.
	pol, sb := load(t, "")
	checks := byName(Plan(pol, sb, layersFor(pol, sb, "kill"), t.TempDir(), "abc"))
	if _, ok := checks["dns_unlisted"]; ok {
		t.Errorf("baseline allows every name, yet a refusal is expected: %+v", checks["dns_unlisted"])
	}
	if _, ok := checks["file_write_outside"]; ok {
		t.Error("baseline allows writes, yet a write is expected to fail")
	}
	for _, name := range []string{"file_read_blocked", "mount", "ptrace", "bpf", "connect_unanswered", "file_write_allowed"} {
		if _, ok := checks[name]; !ok {
			t.Errorf("baseline: no %s check", name)
		}
	}
	// A deny entry gives the refused name; an exact allow entry the
	// allowed query; a loopback allowance drops the connect check.
	pol, sb = load(t, "    dns: {deny: [\"*.evil.example\"], allow: [pypi.org]}\n    egress: {allow: [{cidr: 127.0.0.0/8}]}\n")
	checks = byName(Plan(pol, sb, layersFor(pol, sb, "kill"), t.TempDir(), "abc"))
	if c := checks["dns_unlisted"]; c.Target != "cabc.evil.example" || !c.uniqueName || c.Reason != "on denylist" {
		t.Errorf("refused name %+v", c)
	}
	if c := checks["dns_allowed"]; c.Target != "pypi.org" || c.Forbidden {
		t.Errorf("allowed name %+v", c)
	}
	if _, ok := checks["connect_unanswered"]; ok {
		t.Error("connect to loopback expected refused although egress.allow lists 127.0.0.0/8")
	}
}

// Every preset plans a honeytoken under a real blocked directory, never
// under /proc, /sys or /dev, and never under the agent's own files.
func TestPlanPresets(t *testing.T) {
	for _, preset := range policy.PresetNames() {
		pol, sb := load(t, "    preset: "+preset+"\n")
		for _, c := range Plan(pol, sb, layersFor(pol, sb, "kill"), t.TempDir(), "abc") {
			if c.Fixture == "honeytoken" {
				for _, bad := range []string{"/proc/", "/sys/", "/dev/", pol.Agent.LedgerDir} {
					if strings.HasPrefix(c.Target, bad) {
						t.Errorf("%s: honeytoken %s under %s", preset, c.Target, bad)
					}
				}
			}
			if c.Forbidden && c.Mechanism == "" {
				t.Errorf("%s: forbidden check %s without a mechanism", preset, c.Name)
			}
		}
	}
}

func TestDNSListed(t *testing.T) {
	for _, tc := range []struct {
		entries []string
		name    string
		want    bool
	}{
		{[]string{"example.com"}, "example.com.", true},
		{[]string{"example.com"}, "a.example.com", false},
		{[]string{"*.example.com"}, "a.example.com", true},
		{[]string{"*.example.com"}, "example.com", false},
		{[]string{".example.com"}, "example.com", true},
		{[]string{".example.com"}, "b.a.example.com", true},
		{[]string{"*"}, "anything.invalid", true},
	} {
		if got := dnsListed(tc.entries, tc.name); got != tc.want {
			t.Errorf("dnsListed(%v, %q) = %v, want %v", tc.entries, tc.name, got, tc.want)
		}
	}
}

// A honeytoken left by an agent killed mid-run is removed by a later run;
// a fresh one (another agent's run in progress) and other files stay.
func TestSweepStale(t *testing.T) {
	dir := t.TempDir()
	old := filepath.Join(dir, honeytokenName+"old")
	fresh := filepath.Join(dir, honeytokenName+"fresh")
	other := filepath.Join(dir, "credentials")
	for _, p := range []string{old, fresh, other} {
		if err := os.WriteFile(p, []byte("x\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	past := time.Now().Add(-time.Hour)
	os.Chtimes(old, past, past)
	os.Chtimes(other, past, past)
	sweepStale(dir)
	if _, err := os.Stat(old); !os.IsNotExist(err) {
		t.Errorf("stale honeytoken kept: %v", err)
	}
	for _, p := range []string{fresh, other} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s removed: %v", p, err)
		}
	}
}

func TestPlanFronted(t *testing.T) {
	pol, sb := load(t, "    preset: restricted\n    egress: {names: {bind: true}}\n")
	layers := append(layersFor(pol, sb, "kill"), control.Layer{Rule: sb.Name + ": egress names", Mechanism: "cgroup_bpf"})
	c, ok := byName(Plan(pol, sb, layers, t.TempDir(), "abc"))["sni_fronted"]
	if !ok || c.Op != opFronted || c.Target != FrontedAddr.String() || !c.Forbidden || c.Expected(PathExec) != Denied || c.Expected(PathRuntime) != Denied {
		t.Fatalf("sni_fronted = %+v (planned %v)", c, ok)
	}
	pol, sb = load(t, "    preset: restricted\n")
	if _, ok := byName(Plan(pol, sb, layersFor(pol, sb, "kill"), t.TempDir(), "abc"))["sni_fronted"]; ok {
		t.Error("sni_fronted planned without name binding")
	}
}
