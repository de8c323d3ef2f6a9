package posture

import (
	"reflect"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/policy"
)

// Has reports whether the posture meets one requirement. An empty cgroup
// (no process read) meets every requirement on processes and mounts:
// nothing runs there to lack them; its limits are still checked. A reading
// that could not read some process (Errors: not one that exited) meets
// none: what was not read is not proven.
func Has(p *audit.Posture, r policy.Requirement) bool {
	if len(p.Errors) > 0 {
		return false
	}
	empty := p.Procs == 0
	allWorkspace := func(ok func(audit.MountPosture) bool) bool {
		for _, w := range p.Workspace {
			if !w.Absent && !ok(w) {
				return false
			}
		}
		return true
	}
	switch r {
	case policy.RequireNoNewPrivs:
		return empty || p.NoNewPrivs
	case policy.RequireCapDropAll:
		return empty || (p.CapEff == 0 && p.CapBnd == 0)
	case policy.RequireSeccomp:
		return empty || p.Seccomp == SeccompFilter || p.Seccomp == SeccompStrict
	case policy.RequireUserNamespace:
		return empty || p.UserNS
	case policy.RequireNonRoot:
		return empty || !p.RootUser
	case policy.RequireReadonlyRoot:
		return empty || p.Root.ReadOnly
	case policy.RequireTmpNoexec:
		return empty || p.Tmp.Absent || p.Tmp.NoExec
	case policy.RequireTmpNosuid:
		return empty || p.Tmp.Absent || p.Tmp.NoSuid
	case policy.RequireWorkspaceNoexec:
		return empty || allWorkspace(func(m audit.MountPosture) bool { return m.NoExec })
	case policy.RequireWorkspaceNosuid:
		return empty || allWorkspace(func(m audit.MountPosture) bool { return m.NoSuid })
	case policy.RequireMemoryLimit:
		return p.Limits.MemoryBytes > 0
	case policy.RequireCPULimit:
		return p.Limits.CPUMillis > 0
	case policy.RequirePIDsLimit:
		return p.Limits.PIDs > 0
	}
	return false // unknown: the policy validator refuses these
}

// Check sets p.Missing to the requirements p lacks, in the order given.
func Check(p *audit.Posture, req []policy.Requirement) {
	p.Missing = nil
	for _, r := range req {
		if !Has(p, r) {
			p.Missing = append(p.Missing, string(r))
		}
	}
}

// Same reports whether two readings of a cgroup describe the same
// hardening: process and thread counts and read errors aside (processes
// come and go all the time), but an empty cgroup differs from one where
// something runs.
func Same(a, b audit.Posture) bool {
	if (a.Procs == 0) != (b.Procs == 0) {
		return false
	}
	a.Procs, a.Threads, a.Errors = 0, 0, nil
	b.Procs, b.Threads, b.Errors = 0, 0, nil
	return reflect.DeepEqual(a, b)
}
