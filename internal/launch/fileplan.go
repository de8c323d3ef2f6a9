package launch

// Planning the Landlock ruleset of the file model users expect: reads and
// execs allowed everywhere except what the policy blocks, writes only where
// it allows them. Landlock can only grant, and a grant on a directory
// covers everything below it, so the planner walks the real directory tree
// from "/" and grants each access class on the largest subtrees where the
// policy decides it uniformly:
//
//   - a subtree no rule divides is granted whole (or not at all);
//   - a divided directory is descended into: its entries are judged one by
//     one (the complement of a blocked entry is every sibling along the
//     path to it), and a readable directory on the path gets READ_DIR so it
//     can still be listed.
//
// What Landlock cannot express, and what the planner does about it:
//   - Entries created after launch in a divided directory are not granted
//     (the grants name what existed). Where the run itself may create
//     entries (the directory is writable), that would refuse its own new
//     files, so such a directory is granted whole and the blocked entries
//     inside are left to the kernel hooks (BPF LSM or the kill backstop);
//     the plan's notes say which. Elsewhere (/etc, a home directory that is
//     not writable) a file someone else creates later stays unreadable for
//     the rest of the run: the refusal summary names it.
//   - Directories of pseudo file systems whose entries come and go on their
//     own (procfs, sysfs, cgroupfs: a child's /proc/PID) are granted whole;
//     their blocked entries (/proc/kcore, /proc/PID/mem) are the kernel
//     hooks' (and Landlock's own ptrace scoping keeps other processes'
//     /proc/PID/mem out of reach).
//   - READ_DIR on a directory on the path to a blocked directory lets the
//     blocked directory be listed (names, not contents); the kernel hooks
//     judge that open.
//   - Landlock judges paths: a hard link or bind mount of a blocked file
//     made elsewhere before the run is reached through its other name; the
//     kernel hooks' inode rules cover those.
//
// The plan is computed when a command starts (in the launched child, from
// the tree as it is then), so a policy reload applies to the next command;
// commands already running keep their ruleset (Landlock cannot be lifted).

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/policy"
)

// Access classes of the planner.
const (
	ClassRead  = 1 << iota // READ_FILE, READ_DIR
	ClassWrite             // write, truncate, create, remove, rename
	ClassExec              // execute
)

// Grant is one Landlock rule of a plan: the classes granted on a path and
// everything below it. ListDir adds READ_DIR alone (listing a divided
// directory whose files are not all readable).
type Grant struct {
	Path    string
	Classes int
	ListDir bool
}

// FilePlan is the planner's output.
type FilePlan struct {
	// Grants in path order; one path may appear once.
	Grants []Grant
	// Notes say where the plan grants more than the policy (left to the
	// kernel hooks) and what it cannot grant.
	Notes []string
}

// maxPlanGrants bounds a plan: past it, divided directories are granted
// whole (with a note) rather than listed.
const maxPlanGrants = 20000

// freshName stands for an entry created later: no rule names it.
const freshName = "\x00new"

// planner walks the tree for one plan.
type planner struct {
	files  []policy.FileRule
	exec   []policy.FileRule
	grants map[string]*Grant
	notes  map[string]bool
	lists  map[string][]os.DirEntry
	n      int
}

// PlanFiles derives the Landlock grants of the file model from the rules
// (see the file comment). Missing paths are skipped; symlinks are never
// granted (their targets are judged where they really are).
func PlanFiles(r *FileRules) (FilePlan, error) {
	p := &planner{grants: map[string]*Grant{}, notes: map[string]bool{}, lists: map[string][]os.DirEntry{}}
	p.files = canonicalRules(r.Files)
	p.exec = canonicalRules(r.Exec)
	if r.ExecDefault != "" && r.ExecDefault != policy.ActionAllow {
		// The default as the least specific rule (as the compiler does).
		p.exec = append(p.exec, policy.FileRule{Name: "exec-default", Path: "/", Match: policy.MatchPrefix, Action: r.ExecDefault})
	}
	for _, class := range []int{ClassRead, ClassWrite, ClassExec} {
		if err := p.walk(class, "/"); err != nil {
			return FilePlan{}, err
		}
	}
	var out FilePlan
	for _, g := range p.grants {
		out.Grants = append(out.Grants, *g)
	}
	sort.Slice(out.Grants, func(i, j int) bool { return out.Grants[i].Path < out.Grants[j].Path })
	for n := range p.notes {
		out.Notes = append(out.Notes, n)
	}
	sort.Strings(out.Notes)
	return out, nil
}

// canonicalRules resolves symlinks in the existing part of each rule's
// literal prefix, so rules name the real tree Landlock judges ("/bin/" is
// "/usr/bin/" on merged-/usr systems). The kernel hooks judge resolved
// paths too.
func canonicalRules(rules []policy.FileRule) []policy.FileRule {
	out := make([]policy.FileRule, 0, len(rules))
	for _, r := range rules {
		if !strings.Contains(r.Path, "*") {
			r.Path = canonicalPath(r.Path)
		}
		out = append(out, r)
	}
	return out
}

func canonicalPath(p string) string {
	trailing := len(p) > 1 && strings.HasSuffix(p, "/")
	clean := filepath.Clean(p)
	// Resolve the longest existing ancestor, keep the rest as written.
	rest := ""
	cur := clean
	for {
		if real, err := filepath.EvalSymlinks(cur); err == nil {
			out := filepath.Join(real, rest)
			if trailing && out != "/" {
				out += "/"
			}
			return out
		}
		if cur == "/" {
			return p
		}
		rest = filepath.Join(filepath.Base(cur), rest)
		cur = filepath.Dir(cur)
	}
}

func (p *planner) rules(class int) ([]policy.FileRule, bool) {
	if class == ClassExec {
		return p.exec, false
	}
	return p.files, class == ClassWrite
}

// allowed reports whether the policy lets class happen at path.
func (p *planner) allowed(class int, path string) bool {
	rules, write := p.rules(class)
	r, ok := policy.DecideFile(rules, path, write)
	return !ok || (r.Action != policy.ActionBlock && r.Action != policy.ActionKill)
}

// divided returns the rules (of class) that decide some path strictly below
// dir differently from a fresh entry of dir, and whether any exists.
func (p *planner) divided(class int, dir string, fresh bool) []policy.FileRule {
	rules, write := p.rules(class)
	var out []policy.FileRule
	for _, r := range rules {
		if !coversAccess(r, write) || !mayMatchBelow(r, dir) {
			continue
		}
		blocks := r.Action == policy.ActionBlock || r.Action == policy.ActionKill
		if blocks == fresh {
			out = append(out, r)
		}
	}
	return out
}

func coversAccess(r policy.FileRule, write bool) bool {
	switch r.Access {
	case policy.AccessRead:
		return !write
	case policy.AccessWrite:
		return write
	}
	return true
}

// mayMatchBelow reports whether r can match a path strictly below dir
// without covering dir's whole subtree.
func mayMatchBelow(r policy.FileRule, dir string) bool {
	if r.Match == policy.MatchPrefix && r.Matches(dir) {
		return false // covers dir and all of its subtree
	}
	child := dir + "/"
	if dir == "/" {
		child = "/"
	}
	if !strings.Contains(r.Path, "*") {
		return strings.HasPrefix(r.Path, child) && r.Path != child
	}
	rc := strings.Split(strings.TrimSuffix(r.Path, "/"), "/")
	dc := []string{""}
	if dir != "/" {
		dc = strings.Split(dir, "/")
	}
	if len(rc) <= len(dc) {
		return false
	}
	for i := range dc {
		if rc[i] != "*" && rc[i] != dc[i] {
			return false
		}
	}
	return true
}

func (p *planner) grant(path string, class int, dirOnly bool) {
	g := p.grants[path]
	if g == nil {
		g = &Grant{Path: path}
		p.grants[path] = g
		p.n++
	}
	if dirOnly {
		g.ListDir = true
		return
	}
	g.Classes |= class
}

func className(class int) string {
	switch class {
	case ClassRead:
		return "reads"
	case ClassWrite:
		return "writes"
	}
	return "execs"
}

func ruleList(rules []policy.FileRule) string {
	var names []string
	seen := map[string]bool{}
	for _, r := range rules {
		s := fmt.Sprintf("%s (%s)", r.RuleName(), r.Path)
		if !seen[s] {
			seen[s] = true
			names = append(names, s)
		}
	}
	if len(names) > 4 {
		names = append(names[:4], fmt.Sprintf("%d more", len(names)-4))
	}
	return strings.Join(names, ", ")
}

// walk plans class for the subtree at path (which exists or is "/").
func (p *planner) walk(class int, path string) error {
	st, err := os.Lstat(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("plan landlock: %w", err)
	}
	if st.Mode()&os.ModeSymlink != 0 {
		return nil // judged where it points
	}
	self := p.allowed(class, path)
	if !st.IsDir() {
		if self {
			p.grant(path, class, false)
		}
		return nil
	}
	freshPath := filepath.Join(path, freshName)
	fresh := p.allowed(class, freshPath)
	differ := p.divided(class, path, fresh)
	if len(differ) == 0 && self == fresh {
		if fresh {
			p.grant(path, class, false)
		}
		return nil
	}
	if fresh {
		// Entries created later should be allowed: Landlock can only
		// say so by granting the directory whole.
		why := ""
		switch {
		case dynamicDir(path):
			why = "its entries come and go on their own"
		case class == ClassWrite || p.allowed(ClassWrite, freshPath):
			why = "the run creates entries there"
		case p.n >= maxPlanGrants:
			why = fmt.Sprintf("the plan reached %d grants", maxPlanGrants)
		}
		if why != "" {
			p.grant(path, class, false)
			if len(differ) > 0 {
				p.notes[fmt.Sprintf("%s of %s granted whole (%s): %s left to the kernel hooks", className(class), path, why, ruleList(differ))] = true
			}
			return nil
		}
		if len(differ) > 0 {
			p.notes[fmt.Sprintf("%s of entries created in %s after launch are refused (Landlock grants what exists; blocked there: %s)", className(class), path, ruleList(differ))] = true
		}
	}
	if !fresh && class != ClassWrite && p.allowed(ClassWrite, freshPath) {
		// The run may create entries here that a rule allows by name
		// ("/tmp/go-build" for go test's binaries): only a grant of the
		// whole directory lets them be used.
		if later := notYetThere(differ, path); len(later) > 0 {
			p.grant(path, class, false)
			p.notes[fmt.Sprintf("%s of %s granted whole (the run may create entries there that %s allow): the rest of it is left to the kernel hooks", className(class), path, ruleList(later))] = true
			return nil
		}
	}
	if class == ClassRead && self {
		p.grant(path, class, true)
	}
	entries, err := p.list(path)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := p.walk(class, filepath.Join(path, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// notYetThere returns the rules whose path's next component below dir
// does not exist (yet).
func notYetThere(rules []policy.FileRule, dir string) []policy.FileRule {
	var out []policy.FileRule
	for _, r := range rules {
		rest := strings.TrimPrefix(r.Path, strings.TrimSuffix(dir, "/")+"/")
		if rest == r.Path || strings.Contains(r.Path, "*") {
			continue
		}
		next, _, _ := strings.Cut(rest, "/")
		if _, err := os.Lstat(filepath.Join(dir, next)); errors.Is(err, os.ErrNotExist) {
			out = append(out, r)
		}
	}
	return out
}

func (p *planner) list(dir string) ([]os.DirEntry, error) {
	if l, ok := p.lists[dir]; ok {
		return l, nil
	}
	l, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, os.ErrPermission) {
		return nil, fmt.Errorf("plan landlock: %w", err)
	}
	p.lists[dir] = l
	return l, nil
}

// dynamicDir reports whether dir is on a pseudo file system whose entries
// appear without anyone creating them (procfs, sysfs, cgroupfs).
func dynamicDir(dir string) bool {
	var s unix.Statfs_t
	if unix.Statfs(dir, &s) != nil {
		return false
	}
	switch s.Type {
	case unix.PROC_SUPER_MAGIC, unix.SYSFS_MAGIC, unix.CGROUP_SUPER_MAGIC, unix.CGROUP2_SUPER_MAGIC:
		return true
	}
	return false
}
