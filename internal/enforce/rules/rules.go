// Package rules holds what the enforcement layers are told to do, without
// the BPF programs that do it: the actions and sandbox flags shared by
// every layer here, each layer's rule types in a subpackage (lsmrules,
// backstoprules, cgrouprules, egressrules, tracerules). The planner
// (internal/plan) builds these and imports nothing that loads BPF; the
// loaders (internal/enforce/...) write them into their maps and alias
// the types, so callers may use either name.
//
// Nothing here or below may import github.com/cilium/ebpf
// (TestNoBPF in internal/plan checks it).
package rules

// Actions of policy rules (enum action in bpf/include/common.h).
const (
	ActionAllow  uint32 = 0
	ActionRecord uint32 = 1
	ActionBlock  uint32 = 2
	ActionKill   uint32 = 3
)

// Sandbox flags, mirrored from bpf/include/common.h (SANDBOX_F_*).
const (
	// SandboxRecordOnly downgrades block and kill actions to record.
	SandboxRecordOnly uint32 = 1
)
