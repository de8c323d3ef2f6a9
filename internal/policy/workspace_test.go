package policy

import (
	"slices"
	"strings"
	"testing"
)

func TestWorkspaceOptionsAndLimitsParse(t *testing.T) {
	p, err := Parse("t.yaml", []byte(`version: 1
sandboxes:
  - name: a
    select: {cgroups: [/watcher]}
    preset: dev
    workspace: [/srv/a]
    workspace_options: {mode: overlay, max_snapshots: 3, max_snapshot_bytes: 1.5G}
    limits:
      cpu: 1.5
      memory: 2G
      memory_high: 1536MiB
      pids: 512
      io: [{device: /dev/vda, write_bps: 50M}]
`))
	if err != nil {
		t.Fatal(err)
	}
	sb := p.Sandboxes[0]
	if sb.WorkspaceOptions.Mode != WorkspaceOverlay || sb.WorkspaceOptions.MaxSnapshots != 3 ||
		sb.WorkspaceOptions.MaxSnapshotBytes.Bytes != 3<<29 {
		t.Errorf("workspace options: %+v", sb.WorkspaceOptions)
	}
	l := sb.Limits
	if l.CPU != 1.5 || l.Memory.Bytes != 2<<30 || l.MemoryHigh.Bytes != 1536<<20 || l.PIDs != 512 ||
		len(l.IO) != 1 || l.IO[0].WriteBPS.Bytes != 50<<20 {
		t.Errorf("limits: %+v", l)
	}
	// Round trip through Marshal.
	out, err := Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	q, err := Parse("again", out)
	if err != nil {
		t.Fatalf("reparse: %v\n%s", err, out)
	}
	if q.Sandboxes[0].Limits.Memory != l.Memory || q.Sandboxes[0].WorkspaceOptions.Mode != WorkspaceOverlay {
		t.Errorf("round trip lost limits: %+v", q.Sandboxes[0].Limits)
	}
}

func TestWorkspaceOptionsAndLimitsErrors(t *testing.T) {
	base := "version: 1\nsandboxes:\n  - name: a\n    select: {cgroups: [/watcher]}\n"
	for _, tc := range []struct{ body, want string }{
		{"    workspace_options: {mode: snapshot}\n", `sandboxes[0].workspace_options.mode: "snapshot": want direct or overlay`},
		{"    workspace_options: {mode: overlay}\n", `overlay needs at least one workspace directory`},
		{"    limits: {memory: lots}\n", `t.yaml:5:`},
		{"    limits: {memory: lots}\n", `"lots" is not a size`},
		{"    limits: {memory: 1G, memory_high: 2G}\n", `memory_high: 2G is above memory (1G)`},
		{"    limits: {pids: -1}\n", `limits.pids: must not be negative`},
		{"    limits: {cpu: 0.001}\n", `below the minimum of 0.01 cores`},
		{"    limits: {io: [{device: sda, read_bps: 1M}]}\n", `want a block device path`},
		{"    limits: {io: [{device: /dev/sda}]}\n", `sets no limit`},
		{"    limits: {memroy: 1G}\n", `memroy`},
	} {
		_, err := Parse("t.yaml", []byte(base+tc.body))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want %q", tc.body, err, tc.want)
		}
	}
}

func TestParseByteSize(t *testing.T) {
	for s, want := range map[string]int64{"4096": 4096, "1K": 1024, "1.5G": 3 << 29, "2GiB": 2 << 30, "100m": 100 << 20, "7B": 7} {
		if got, err := ParseByteSize(s); err != nil || got != want {
			t.Errorf("%q: %d, %v; want %d", s, got, err, want)
		}
	}
	for _, s := range []string{"", "G", "-1M", "1X", "abc"} {
		if _, err := ParseByteSize(s); err == nil {
			t.Errorf("%q parsed", s)
		}
	}
	if got := FormatBytes(3 << 29); got != "1.5G" {
		t.Errorf("FormatBytes = %q", got)
	}
}

// TestPresetPIDsLimit: the agent tiers cap tasks by default (a fork bomb
// must not take the host's PIDs and the agent with it); a sandbox setting
// other limits keeps the preset's pids, one setting pids wins, and an
// explicit 0 turns the cap off. The baseline leaves it to the runtime.
func TestPresetPIDsLimit(t *testing.T) {
	for _, name := range []string{PresetReadOnly, PresetRestricted, PresetDev, PresetOps} {
		sb, err := Preset(name)
		if err != nil {
			t.Fatal(err)
		}
		if sb.Limits.PIDs != 4096 {
			t.Errorf("preset %s: pids %d, want 4096", name, sb.Limits.PIDs)
		}
	}
	if sb, _ := Preset(PresetBaseline); sb.Limits.PIDs != 0 {
		t.Errorf("baseline: pids %d, want none", sb.Limits.PIDs)
	}
	for _, tc := range []struct {
		limits string
		pids   int
		memory int64
	}{
		{"", 4096, 0},
		{"    limits: {memory: 1G}\n", 4096, 1 << 30},
		{"    limits: {pids: 100}\n", 100, 0},
		{"    limits: {pids: 0}\n", 0, 0},
	} {
		p, err := Parse("t.yaml", []byte("version: 1\nsandboxes:\n  - name: a\n    select: {cgroups: [/watcher]}\n    preset: restricted\n    workspace: [/srv/a]\n"+tc.limits))
		if err != nil {
			t.Fatalf("%q: %v", tc.limits, err)
		}
		if l := p.Sandboxes[0].Limits; l.PIDs != tc.pids || l.Memory.Bytes != tc.memory {
			t.Errorf("%q: limits %+v, want pids %d memory %d", tc.limits, l, tc.pids, tc.memory)
		}
	}
}

// TestPresetNameBinding: every preset binds connections to names; dev and
// ops let SSH (port 22, the server speaks first) pass unnamed; a sandbox
// that leaves the resolved default leaves binding unless it asks for it.
func TestPresetNameBinding(t *testing.T) {
	for _, name := range PresetNames() {
		sb, err := Preset(name)
		if err != nil {
			t.Fatal(err)
		}
		ssh := slices.Contains(sb.Egress.Names.UnnamedPorts, PortRange("22"))
		if !sb.Egress.Names.Bind || ssh != (name == PresetDev || name == PresetOps) {
			t.Errorf("preset %s: bind %v, unnamed ports %v", name, sb.Egress.Names.Bind, sb.Egress.Names.UnnamedPorts)
		}
	}
	for _, tc := range []struct {
		egress string
		bind   bool
		err    string
	}{
		{"", true, ""},
		{"    egress: {names: {bind: false}}\n", false, ""},
		{"    egress: {default: allow}\n", false, ""},
		{"    egress: {default: deny}\n", false, ""},
		{"    egress: {default: deny, names: {bind: true}}\n", false, "egress default resolved"},
	} {
		p, err := Parse("t.yaml", []byte("version: 1\nsandboxes:\n  - name: a\n    select: {cgroups: [/watcher]}\n    preset: restricted\n    workspace: [/srv/a]\n"+tc.egress))
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: err %v, want %q", tc.egress, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%q: %v", tc.egress, err)
		}
		if got := p.Sandboxes[0].Egress.Names.Bind; got != tc.bind {
			t.Errorf("%q: bind %v, want %v", tc.egress, got, tc.bind)
		}
	}
}
