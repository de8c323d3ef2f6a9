package policy

import (
	"path/filepath"
	"strings"

	"github.com/watcherhq/watcher/internal/containers"
)

const workspaceVar = "$workspace"

// Sandbox returns the sandbox with the given name, or nil.
func (p *Policy) Sandbox(name string) *Sandbox {
	for i := range p.Sandboxes {
		if p.Sandboxes[i].Name == name {
			return &p.Sandboxes[i]
		}
	}
	return nil
}

// SandboxForCgroup returns the first sandbox whose cgroup paths or globs
// select the cgroup at rel (relative to the cgroup2 root) or one of its
// ancestors, or nil. Container selectors need resolving first (see
// internal/containers) and are not considered here.
func (p *Policy) SandboxForCgroup(rel string) *Sandbox {
	rel = filepath.Clean("/" + rel)
	for i := range p.Sandboxes {
		if p.Sandboxes[i].Select.MatchesCgroup(rel) {
			return &p.Sandboxes[i]
		}
	}
	return nil
}

// MatchesCgroup reports whether the selector's cgroups or globs select the
// cgroup at rel or one of its ancestors (a sandbox covers descendants).
func (s *Selector) MatchesCgroup(rel string) bool {
	rel = filepath.Clean("/" + rel)
	for {
		for _, cg := range s.Cgroups {
			if filepath.Clean(cg) == rel {
				return true
			}
		}
		for _, g := range s.Globs {
			if cg, err := containers.CompileGlob(g); err == nil && cg.Match(rel) {
				return true
			}
		}
		if rel == "/" {
			return false
		}
		rel = filepath.Dir(rel)
	}
}

// Refs returns the parsed container selectors (a validated policy has no
// bad ones; they are skipped).
func (s *Selector) Refs() []containers.Ref {
	var out []containers.Ref
	for _, c := range s.Containers {
		if r, err := containers.ParseRef(c); err == nil {
			out = append(out, r)
		}
	}
	return out
}

// Effective returns the action to apply for a rule's action in the
// sandbox's mode: record mode turns block and kill into record.
func (sb *Sandbox) Effective(a Action) Action {
	if sb.Mode == ModeRecord && (a == ActionBlock || a == ActionKill) {
		return ActionRecord
	}
	return a
}

// FileRules returns the sandbox's file rules as enforced: "$workspace"
// rules expanded once per workspace directory (dropped without one), and,
// unless agent_files is allow, rules protecting the agent's own files
// (ledger, socket and pin directories, the policy file) appended.
func (p *Policy) FileRules(sb *Sandbox) []FileRule {
	var out []FileRule
	for _, r := range sb.Files {
		out = append(out, expandWorkspace(r, sb.Workspace)...)
	}
	if a := sb.Operations.AgentFiles; a != "" && a != ActionAllow {
		dirs := []string{p.Agent.LedgerDir, p.Agent.SocketDir, p.Agent.PinDir}
		for _, d := range dirs {
			if d == "" {
				continue
			}
			out = append(out, FileRule{Name: "agent-files", Path: strings.TrimSuffix(d, "/") + "/", Match: MatchPrefix, Access: AccessAny, Action: a})
			out = append(out, FileRule{Name: "agent-files", Path: strings.TrimSuffix(d, "/"), Match: MatchExact, Access: AccessAny, Action: a})
		}
		if p.Source != "" {
			if abs, err := filepath.Abs(p.Source); err == nil {
				out = append(out, FileRule{Name: "agent-files", Path: abs, Match: MatchExact, Access: AccessWrite, Action: a})
			}
		}
	}
	return out
}

// ExecRules returns the sandbox's exec rules with "$workspace" expanded.
func (sb *Sandbox) ExecRules() []FileRule {
	var out []FileRule
	for _, r := range sb.Exec.Rules {
		out = append(out, expandWorkspace(r, sb.Workspace)...)
	}
	return out
}

func expandWorkspace(r FileRule, ws []string) []FileRule {
	if r.Path != workspaceVar && !strings.HasPrefix(r.Path, workspaceVar+"/") {
		return []FileRule{r}
	}
	rest := strings.TrimPrefix(r.Path, workspaceVar)
	var out []FileRule
	for _, w := range ws {
		e := r
		e.Path = strings.TrimSuffix(w, "/") + rest
		if rest == "" && r.Match == MatchPrefix {
			// A workspace prefix covers the directory's contents, not
			// siblings that share its name as a prefix.
			e.Path += "/"
		}
		out = append(out, e)
	}
	return out
}

// RuleName returns the rule's name for events.
func (r *FileRule) RuleName() string {
	if r.Name != "" {
		return r.Name
	}
	return "file:" + r.Path
}

// Matches reports whether the rule's path covers the resolved path p.
func (r *FileRule) Matches(p string) bool {
	if !strings.Contains(r.Path, "*") {
		if r.Match == MatchExact {
			return p == r.Path
		}
		return strings.HasPrefix(p, r.Path) || (strings.HasSuffix(r.Path, "/") && p == strings.TrimSuffix(r.Path, "/"))
	}
	// Component wildcards: compare component by component.
	rc := strings.Split(r.Path, "/")
	pc := strings.Split(p, "/")
	if r.Match == MatchPrefix && strings.HasSuffix(r.Path, "/") && len(pc) == len(rc)-1 {
		// The directory itself, as for literal paths ("/home/*/.ssh/"
		// covers /home/u/.ssh).
		rc = rc[:len(rc)-1]
		for i, c := range rc {
			if (c == "*" && pc[i] == "") || (c != "*" && pc[i] != c) {
				return false
			}
		}
		return true
	}
	if r.Match == MatchExact && len(pc) != len(rc) {
		return false
	}
	if len(pc) < len(rc) {
		return false
	}
	last := len(rc) - 1
	for i, c := range rc {
		switch {
		case c == "*":
			if pc[i] == "" {
				return false
			}
		case i == last && r.Match == MatchPrefix:
			if !strings.HasPrefix(pc[i], c) {
				return false
			}
		case pc[i] != c:
			return false
		}
	}
	return true
}

func (r *FileRule) covers(write bool) bool {
	switch r.Access {
	case AccessRead:
		return !write
	case AccessWrite:
		return write
	}
	return true
}

// specificity orders matching rules: exact beats prefix, then more literal
// characters beat fewer.
func (r *FileRule) specificity() int {
	n := len(strings.ReplaceAll(r.Path, "*", "")) * 2
	if r.Match == MatchExact {
		n += 1 << 20
	}
	return n
}

// DecideFile returns the rule deciding an open of path p (write for opens
// that can modify it): among matching rules whose access covers the open,
// the most specific wins, the first on a tie. ok is false when no rule
// matches (the open is allowed without a record).
func DecideFile(rules []FileRule, p string, write bool) (rule FileRule, ok bool) {
	best := -1
	for _, r := range rules {
		if !r.covers(write) || !r.Matches(p) {
			continue
		}
		if s := r.specificity(); s > best {
			best, rule, ok = s, r, true
		}
	}
	return rule, ok
}

// DecideExec returns the action for executing the file at p.
func (sb *Sandbox) DecideExec(p string) Action {
	if r, ok := DecideFile(sb.ExecRules(), p, false); ok {
		return r.Action
	}
	if sb.Exec.Default == "" {
		return ActionAllow
	}
	return sb.Exec.Default
}

// CapabilityAction returns the action for using capability number cap.
func (sb *Sandbox) CapabilityAction(capNum int) Action {
	for _, r := range sb.Operations.Capabilities.Rules {
		if n, ok := CapabilityNumber(r.Cap); ok && n == capNum {
			return r.Action
		}
	}
	if sb.Operations.Capabilities.Default == "" {
		return ActionAllow
	}
	return sb.Operations.Capabilities.Default
}

// capabilities are the Linux capability names in number order
// (include/uapi/linux/capability.h).
var capabilities = []string{
	"CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID",
	"SETPCAP", "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW",
	"IPC_LOCK", "IPC_OWNER", "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT",
	"SYS_ADMIN", "SYS_BOOT", "SYS_NICE", "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD",
	"LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP", "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG",
	"WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF", "CHECKPOINT_RESTORE",
}

// CapabilityNumber maps a capability name (CAP_SYS_ADMIN, sys_admin) to its
// number.
func CapabilityNumber(name string) (int, bool) {
	n := strings.TrimPrefix(strings.ToUpper(strings.TrimSpace(name)), "CAP_")
	for i, c := range capabilities {
		if c == n {
			return i, true
		}
	}
	return 0, false
}

// CapabilityName returns "CAP_<NAME>" for a capability number.
func CapabilityName(n int) string {
	if n < 0 || n >= len(capabilities) {
		return ""
	}
	return "CAP_" + capabilities[n]
}

// WatchTargets returns, for every sandbox, the globs and container
// references a containers.Watcher should look for; each target is named
// after its sandbox. Exact cgroup paths need no watching.
func (p *Policy) WatchTargets() []containers.Target {
	var out []containers.Target
	for i := range p.Sandboxes {
		sb := &p.Sandboxes[i]
		for _, g := range sb.Select.Globs {
			if cg, err := containers.CompileGlob(g); err == nil {
				out = append(out, containers.Target{Name: sb.Name, Glob: cg})
			}
		}
		for _, r := range sb.Select.Refs() {
			ref := r
			out = append(out, containers.Target{Name: sb.Name, Ref: &ref})
		}
		if len(sb.Select.Labels) > 0 {
			out = append(out, containers.Target{Name: sb.Name, Labels: sb.Select.Labels})
		}
	}
	return out
}
