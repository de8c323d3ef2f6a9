package policy

import (
	"slices"
	"strings"
)

// Requirement is one hardening item a sandbox may require of every
// container or cgroup it selects (`require: [no_new_privs, cap_drop_all]`).
// The agent reads each from the kernel (see internal/posture) when a
// cgroup joins and whenever its processes change, and raises an alert for a
// cgroup that lacks one; it does not change the container.
type Requirement string

// Requirements a sandbox can name. Each holds only when it holds for every
// thread of every process in the cgroup and its descendants.
const (
	// RequireNoNewPrivs: no_new_privs is set, so exec cannot gain
	// privileges through setuid binaries or file capabilities (docker
	// --security-opt no-new-privileges).
	RequireNoNewPrivs Requirement = "no_new_privs"
	// RequireCapDropAll: the effective and bounding capability sets are
	// empty (docker --cap-drop ALL).
	RequireCapDropAll Requirement = "cap_drop_all"
	// RequireSeccomp: a seccomp filter (or strict mode) is installed.
	RequireSeccomp Requirement = "seccomp"
	// RequireUserNamespace: the processes run in a user namespace other
	// than the host's (root inside is not root outside).
	RequireUserNamespace Requirement = "user_namespace"
	// RequireNonRoot: no process has effective uid 0 as the host sees it.
	RequireNonRoot Requirement = "non_root"
	// RequireReadonlyRoot: the root filesystem the processes see is
	// mounted read-only (docker --read-only).
	RequireReadonlyRoot Requirement = "readonly_root"
	// RequireTmpNoexec: /tmp as the processes see it is on a noexec mount.
	RequireTmpNoexec Requirement = "tmp_noexec"
	// RequireTmpNosuid: /tmp as the processes see it is on a nosuid mount.
	RequireTmpNosuid Requirement = "tmp_nosuid"
	// RequireWorkspaceNoexec: every workspace directory the processes see
	// is on a noexec mount.
	RequireWorkspaceNoexec Requirement = "workspace_noexec"
	// RequireWorkspaceNosuid: every workspace directory the processes see
	// is on a nosuid mount.
	RequireWorkspaceNosuid Requirement = "workspace_nosuid"
	// RequireMemoryLimit: the memory cgroup of every process (or one of
	// its ancestors) has a memory limit.
	RequireMemoryLimit Requirement = "memory_limit"
	// RequireCPULimit: the cpu cgroup of every process (or an ancestor)
	// has a CPU bandwidth limit.
	RequireCPULimit Requirement = "cpu_limit"
	// RequirePIDsLimit: the pids cgroup of every process (or an ancestor)
	// has a pids limit.
	RequirePIDsLimit Requirement = "pids_limit"
)

// Requirements lists every requirement a policy may name, in the order
// tables show them.
func Requirements() []Requirement {
	return []Requirement{RequireNoNewPrivs, RequireCapDropAll, RequireSeccomp, RequireUserNamespace, RequireNonRoot,
		RequireReadonlyRoot, RequireTmpNoexec, RequireTmpNosuid, RequireWorkspaceNoexec, RequireWorkspaceNosuid,
		RequireMemoryLimit, RequireCPULimit, RequirePIDsLimit}
}

func (c *checker) requirements(at path, req []Requirement) {
	seen := map[Requirement]bool{}
	for i, r := range req {
		if !slices.Contains(Requirements(), r) {
			names := make([]string, 0, len(Requirements()))
			for _, k := range Requirements() {
				names = append(names, string(k))
			}
			c.add(at.idx(i), "unknown requirement %q (want one of %s)", r, strings.Join(names, ", "))
		} else if seen[r] {
			c.add(at.idx(i), "requirement %q listed twice", r)
		}
		seen[r] = true
	}
}
