package plan

// `watcher exec`: the seccomp filter and Landlock ruleset of launched
// commands.

import (
	"fmt"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/launch"
	"github.com/watcherhq/watcher/internal/policy"
)

// launch derives the seccomp filter and the Landlock ruleset of commands
// started with `watcher exec` in sb.
func (c *compiler) launch(sb *policy.Sandbox) {
	ops := &sb.Operations
	sec := launch.DefaultSeccomp()
	record := sb.Mode == policy.ModeRecord
	if !blocking(orAllow(ops.IOUring)) || record {
		sec.AllowIOUring = true
	}
	if !blocking(orAllow(ops.RawSockets)) || record {
		sec.DeniedSocketFamilies = slices.DeleteFunc(sec.DeniedSocketFamilies, func(f int) bool { return f == unix.AF_PACKET })
	}
	// Mappings below vm.mmap_min_addr ask CAP_SYS_RAWIO without the
	// capable hook: refused where the sandbox blocks that capability.
	sec.DenyLowMappings = !record && blocking(orAllow(sb.CapabilityAction(unix.CAP_SYS_RAWIO)))
	var notes []string
	res := launch.Restrictions{Seccomp: sec}
	if record {
		// Seccomp and Landlock refuse; they cannot record. Only the
		// fixed list stays (see launch.SeccompPolicy).
		res.Seccomp.AllowedNamespaces = launch.AllNamespaces
		res.Seccomp.DeniedNetlinkProtocols = nil
		notes = append(notes, "mode: record: no Landlock, seccomp reduced to its fixed list (which still refuses)")
	} else {
		files, why := c.landlock(sb)
		res.Files = files
		notes = append(notes, why)
		if files != nil {
			notes = append(notes, "chmod, chown, user xattrs, times and inotify marks outside the writable paths refused before they happen "+
				"(seccomp user notification: the launcher decides on the file the kernel resolves and makes allowed changes itself)")
		}
		var conflicts []string
		for _, op := range operations {
			if op.seccomp != "" && !blocking(orAllow(op.action(ops))) {
				conflicts = append(conflicts, op.name)
			}
		}
		if len(conflicts) > 0 {
			notes = append(notes, "seccomp refuses "+strings.Join(conflicts, ", ")+" although the policy does not block it (fixed list)")
		}
	}
	notes = append([]string{fmt.Sprintf("seccomp: fixed list, namespaces, io_uring %s, AF_PACKET %s, mappings below vm.mmap_min_addr %s",
		allowedWord(res.Seccomp.AllowIOUring), allowedWord(!slices.Contains(res.Seccomp.DeniedSocketFamilies, unix.AF_PACKET)),
		allowedWord(!res.Seccomp.DenyLowMappings))}, notes...)
	// Only the granted capabilities, and Landlock's IPC scope outside
	// record mode: what every watcher exec command is held to.
	res = launch.ExecRestrictions(res, sb)
	notes = append(notes, "capabilities: only "+strings.Join(res.Capabilities.Names(), ", ")+
		" (bounding, permitted, effective, inheritable cleared of the rest; ambient empty)",
		"own subtree: mount, PID, UTS and IPC namespaces (host processes not visible), Landlock signal and abstract-socket scope, TIOCSTI/TIOCLINUX refused")
	c.plan.Launch[sb.Name] = res
	c.add(sb, "watcher exec", policy.ActionBlock, layer{mech: MechLaunch, notes: append(notes, "only commands started by watcher exec")})
}

func allowedWord(b bool) string {
	if b {
		return "allowed"
	}
	return "refused"
}

// landlock derives the Landlock ruleset of watcher exec from the file and
// exec rules, when they confine writes (a blocking write rule on "/"): the
// file model users expect, reads and execs wherever no rule blocks them,
// writes only where the rules allow. The launched child plans the grants
// from the directory tree as it is at launch (launch.PlanFiles: Landlock
// grants the complement of the blocked paths); terminals and the usual
// character devices the policy lets be written also get ioctl.
func (c *compiler) landlock(sb *policy.Sandbox) (*launch.FileRules, string) {
	rules := c.fileRules(sb)
	var prefixes []policy.FileRule
	for _, r := range rules {
		if r.Match == policy.MatchPrefix {
			prefixes = append(prefixes, r)
		}
	}
	if r, ok := policy.DecideFile(prefixes, "/", true); !ok || !blocking(r.Action) || r.Path != "/" {
		return nil, "no Landlock: the policy does not confine writes to listed paths"
	}
	fr := &launch.FileRules{Derive: true, Files: rules, Exec: sb.ExecRules(), ExecDefault: orAllow(sb.Exec.Default),
		IgnoreMissing: true}
	allows := func(p string, write bool) bool {
		r, ok := policy.DecideFile(rules, p, write)
		return !ok || !blocking(r.Action)
	}
	for _, p := range launch.DefaultFileRules().Devices {
		if allows(p, false) && allows(p, true) {
			fr.Devices = append(fr.Devices, p)
		}
	}
	return fr, fmt.Sprintf("landlock: derived at launch from %d file and %d exec rules (reads and execs wherever no rule blocks them, writes where allowed; %d devices with ioctl)",
		len(fr.Files), len(fr.Exec), len(fr.Devices))
}
