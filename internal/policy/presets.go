package policy

import (
	"embed"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/parser"
)

// Preset names. Every preset builds on the baseline.
const (
	// PresetBaseline blocks the dangerous operations and nothing else; it
	// is what a sandbox without a preset gets.
	PresetBaseline = "baseline"
	// PresetReadOnly is the read-only query tier.
	PresetReadOnly = "read-only"
	// PresetRestricted is the restricted-write tier.
	PresetRestricted = "restricted"
	// PresetDev is the dev/test tier.
	PresetDev = "dev"
	// PresetOps is the production-ops tier.
	PresetOps = "ops"
)

//go:embed presets/*.yaml
var presetFiles embed.FS

var (
	presetOnce sync.Once
	presets    map[string]Sandbox
	presetErr  error
)

// PresetNames lists the presets a sandbox can name, baseline first.
func PresetNames() []string {
	return []string{PresetBaseline, PresetReadOnly, PresetRestricted, PresetDev, PresetOps}
}

func isPreset(name string) bool { return slices.Contains(PresetNames(), name) }

// PresetSource returns the YAML a preset is defined by (before it is
// merged with the baseline).
func PresetSource(name string) ([]byte, error) {
	if !isPreset(name) {
		return nil, fmt.Errorf("unknown preset %q", name)
	}
	return presetFiles.ReadFile("presets/" + name + ".yaml")
}

// Preset returns the effective sandbox settings of a preset (merged with
// the baseline), without name or selector. The result is a copy.
func Preset(name string) (Sandbox, error) {
	presetOnce.Do(loadPresets)
	if presetErr != nil {
		return Sandbox{}, presetErr
	}
	sb, ok := presets[name]
	if !ok {
		return Sandbox{}, fmt.Errorf("unknown preset %q (want one of %v)", name, PresetNames())
	}
	return cloneSandbox(sb), nil
}

func loadPresets() {
	presets = map[string]Sandbox{}
	base, err := decodePreset(PresetBaseline, Sandbox{})
	if err != nil {
		presetErr = err
		return
	}
	presets[PresetBaseline] = base
	for _, name := range PresetNames()[1:] {
		sb, err := decodePreset(name, base)
		if err != nil {
			presetErr = err
			return
		}
		sb.Preset = name
		presets[name] = sb
	}
}

// decodePreset reads presets/<name>.yaml on top of base, with the same
// merge rules as a sandbox on top of its preset.
func decodePreset(name string, base Sandbox) (Sandbox, error) {
	data, err := PresetSource(name)
	if err != nil {
		return Sandbox{}, err
	}
	file, err := parser.ParseBytes(data, 0)
	if err != nil {
		return Sandbox{}, fmt.Errorf("preset %s: %w", name, err)
	}
	body := file.Docs[0].Body
	var own Sandbox
	if err := yaml.NodeToValue(body, &own, yaml.Strict()); err != nil {
		return Sandbox{}, fmt.Errorf("preset %s: %w", name, err)
	}
	normalizeSandbox(&own)
	var c checker
	c.sandboxValues(path{}, &own)
	if len(c.errs) > 0 {
		return Sandbox{}, fmt.Errorf("preset %s: %w", name, Errors(c.errs))
	}
	merged := cloneSandbox(base)
	if err := yaml.NodeToValue(body, &merged, yaml.Strict()); err != nil {
		return Sandbox{}, fmt.Errorf("preset %s: %w", name, err)
	}
	mergeLists(&merged, &own, &base)
	return merged, nil
}

func cloneSandbox(sb Sandbox) Sandbox {
	out := sb
	out.Select.Cgroups = slices.Clone(sb.Select.Cgroups)
	out.Select.Globs = slices.Clone(sb.Select.Globs)
	out.Select.Containers = slices.Clone(sb.Select.Containers)
	out.Select.Labels = maps.Clone(sb.Select.Labels)
	out.Workspace = slices.Clone(sb.Workspace)
	out.Files = slices.Clone(sb.Files)
	out.Operations.Capabilities.Rules = slices.Clone(sb.Operations.Capabilities.Rules)
	out.Exec.Rules = slices.Clone(sb.Exec.Rules)
	out.DNS.Allow = slices.Clone(sb.DNS.Allow)
	out.DNS.Deny = slices.Clone(sb.DNS.Deny)
	out.DNS.Detection.HighCardinality = slices.Clone(sb.DNS.Detection.HighCardinality)
	out.Egress.Allow = slices.Clone(sb.Egress.Allow)
	for i := range out.Egress.Allow {
		out.Egress.Allow[i].Ports = slices.Clone(out.Egress.Allow[i].Ports)
	}
	out.Egress.Loopback = slices.Clone(sb.Egress.Loopback)
	out.Egress.NamePorts = slices.Clone(sb.Egress.NamePorts)
	for i := range out.Egress.NamePorts {
		out.Egress.NamePorts[i].Ports = slices.Clone(out.Egress.NamePorts[i].Ports)
	}
	out.Tools.Rules = slices.Clone(sb.Tools.Rules)
	out.Tools.Exchange.Types = slices.Clone(sb.Tools.Exchange.Types)
	out.Tools.Exchange.Patterns = slices.Clone(sb.Tools.Exchange.Patterns)
	out.Egress.Unix = slices.Clone(sb.Egress.Unix)
	out.Egress.Names.ReadOnly = slices.Clone(sb.Egress.Names.ReadOnly)
	out.Egress.Names.ECH = slices.Clone(sb.Egress.Names.ECH)
	out.Egress.Names.Inspect = slices.Clone(sb.Egress.Names.Inspect)
	out.Egress.Names.UnnamedPorts = slices.Clone(sb.Egress.Names.UnnamedPorts)
	out.Egress.Names.Secrets = slices.Clone(sb.Egress.Names.Secrets)
	for i := range out.Egress.Names.Secrets {
		out.Egress.Names.Secrets[i].Hosts = slices.Clone(out.Egress.Names.Secrets[i].Hosts)
	}
	out.Listen.Ports = slices.Clone(sb.Listen.Ports)
	return out
}

//go:embed presets/default.yaml
var defaultPolicy []byte

// DefaultAgent returns the agent settings used for fields a policy file
// leaves out.
func DefaultAgent() Agent {
	return Agent{
		LedgerDir:   "/var/lib/watcher/ledger",
		SocketDir:   "/run/watcher",
		PinDir:      "/sys/fs/bpf/watcher",
		MetricsAddr: "127.0.0.1:9464",
		ExecCgroup:  "/watcher",
		Sampling:    Sampling{Rate: 1, SummaryInterval: D(10e9)},
		DNS:         AgentDNS{Listen: "127.0.0.1:5300"},
	}
}

// Default returns the policy used when no file is given: every command
// under the exec cgroup runs in the restricted preset, which blocks the
// dangerous operations.
func Default() *Policy {
	p, err := Parse("", defaultPolicy)
	if err != nil {
		// The embedded default is checked by the package's tests.
		panic(fmt.Sprintf("built-in default policy: %v", err))
	}
	p.Source = ""
	return p
}

// DefaultYAML is the built-in default policy as written.
func DefaultYAML() []byte { return slices.Clone(defaultPolicy) }
