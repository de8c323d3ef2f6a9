package plan

import (
	"io/fs"
	"path/filepath"
	"sort"
	"strings"

	"github.com/watcherhq/watcher/internal/enforce/rules/cgrouprules"
	"github.com/watcherhq/watcher/internal/policy"
)

// maxSysctlWalk bounds the /proc/sys entries listed for one prefix rule.
const maxSysctlWalk = 8192

// sysctl writes the sandbox's rules on /proc/sys as cgroup/sysctl rules:
// the decision for /proc/sys/ as a whole (the "every name" entry), and
// every name whose decision differs from it: exact rules, and the entries
// now below a deeper prefix rule (listed from this host's /proc/sys; the
// names are the same in other network namespaces except per-interface
// ones). It returns how many rules it wrote.
func (c *compiler) sysctl(sid uint32, t *fileTable, files []policy.FileRule) int {
	const root = "/proc/sys/"
	touches := false
	for _, r := range files {
		if strings.HasPrefix(r.Path, root) || r.Match == policy.MatchPrefix && strings.HasPrefix(root, r.Path) {
			touches = true
			break
		}
	}
	if !touches {
		return 0
	}
	n := 0
	var base [2]policy.Action
	for acc := accRead; acc <= accWrite; acc++ {
		if r, ok := t.decide(pathKey{root, true}, acc); ok {
			base[acc] = r.Action
			if r.Action != policy.ActionAllow {
				c.plan.Sysctl = append(c.plan.Sysctl, cgrouprules.SysctlRule{Sandbox: sid, Write: acc == accWrite,
					Action: kernelAction(r.Action), RuleID: c.rules.ID(r.RuleName())})
				n++
			}
		}
	}
	names := map[string]bool{}
	for _, r := range files {
		if !strings.HasPrefix(r.Path, root) || r.Path == root {
			continue
		}
		if r.Match == policy.MatchExact {
			names[strings.TrimPrefix(r.Path, root)] = true
			continue
		}
		// A deeper prefix: list the entries below it now.
		dir := strings.TrimSuffix(r.Path, "/")
		count := 0
		filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil || count >= maxSysctlWalk {
				return filepath.SkipDir
			}
			if !d.IsDir() && strings.HasPrefix(p, r.Path) {
				names[strings.TrimPrefix(p, root)] = true
				count++
			}
			return nil
		})
	}
	sorted := make([]string, 0, len(names))
	for name := range names {
		sorted = append(sorted, name)
	}
	sort.Strings(sorted)
	for _, name := range sorted {
		if len(name) >= 96 { // the kernel map's name buffer
			continue
		}
		for acc := accRead; acc <= accWrite; acc++ {
			r, ok := policy.DecideFile(files, root+name, acc == accWrite)
			a := policy.ActionAllow
			if ok {
				a = r.Action
			}
			if a == orAllow(base[acc]) {
				continue
			}
			c.plan.Sysctl = append(c.plan.Sysctl, cgrouprules.SysctlRule{Sandbox: sid, Name: name, Write: acc == accWrite,
				Action: kernelAction(a), RuleID: c.rules.ID(r.RuleName())})
			n++
		}
	}
	return n
}
