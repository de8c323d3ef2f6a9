package plan

// The files and exec sections: file rules and exec rules, written to the
// LSM path tables, the backstop and (for /proc/sys) cgroup/sysctl.

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/watcherhq/watcher/internal/enforce/rules"
	"github.com/watcherhq/watcher/internal/enforce/rules/backstoprules"
	"github.com/watcherhq/watcher/internal/enforce/rules/lsmrules"
	"github.com/watcherhq/watcher/internal/policy"
)

// changeHooks judge changes made without an open for write by the file
// write rules (bpf/lsm.c, path operations).
var changeHooks = []string{"path_truncate", "path_mknod", "path_mkdir", "path_unlink", "path_rmdir",
	"path_symlink", "path_link", "path_rename", "path_chmod", "path_chown", "inode_setxattr", "inode_removexattr",
	"inode_setattr"}

// changeHooksNote says which of the change hooks enforce a write rule here.
func (c *compiler) changeHooksNote() string {
	var missing []string
	for _, h := range changeHooks {
		if !c.hook(h) {
			missing = append(missing, h)
		}
	}
	if len(missing) == 0 {
		return "truncate, O_CREAT/mknod, link, rename, unlink, symlink, chmod, chown, xattr, utimes refused by lsm path hooks"
	}
	return "not judged here (hooks missing): " + strings.Join(missing, ", ")
}

func (c *compiler) hasBlockingFiles(sb *policy.Sandbox) bool {
	for _, r := range c.p.FileRules(sb) {
		if blocking(r.Action) {
			return true
		}
	}
	return false
}

// fileRuleLine is the Layers line of one policy file rule.
type fileRuleLine struct {
	rule     policy.FileRule
	exec     bool
	expanded []string // wildcard expansions, nil when the path has none
	special  string   // "proc_mem", "proc_wildcard"
}

func describe(r policy.FileRule, exec bool) string {
	if exec {
		return fmt.Sprintf("exec rule %s (%s %s)", r.RuleName(), r.Match, r.Path)
	}
	return fmt.Sprintf("file rule %s (%s %s %s)", r.RuleName(), r.Access, r.Match, r.Path)
}

func (c *compiler) fileRules(sb *policy.Sandbox) []policy.FileRule {
	rules := c.p.FileRules(sb)
	a := orAllow(sb.Operations.AgentFiles)
	if a == policy.ActionAllow {
		return rules
	}
	have := map[string]bool{}
	for _, r := range rules {
		have[r.Path] = true
	}
	for _, f := range c.env.AgentFiles {
		if f == "" || !filepath.IsAbs(f) {
			continue
		}
		f = filepath.Clean(f)
		if st, err := os.Stat(f); err == nil && st.IsDir() {
			if !have[f+"/"] {
				rules = append(rules, policy.FileRule{Name: "agent-files", Path: f + "/", Match: policy.MatchPrefix, Access: policy.AccessAny, Action: a})
				have[f+"/"] = true
			}
		}
		if !have[f] {
			rules = append(rules, policy.FileRule{Name: "agent-files", Path: f, Match: policy.MatchExact, Access: policy.AccessAny, Action: a})
			have[f] = true
		}
	}
	return rules
}

func (c *compiler) files(sb *policy.Sandbox, sid uint32, lr *lsmrules.Rules) error {
	fs, err := c.expandFiles(sb)
	if err != nil {
		return err
	}
	c.lsmFiles(fs, lr)
	c.procMem(fs, lr)
	// /proc/sys through cgroup/sysctl.
	var sysctlRules int
	if c.cgroupOK {
		sysctlRules = c.sysctl(sid, fs.t, fs.files)
	}
	lost := c.backstopFiles(sid, fs, sysctlRules)
	c.fileLines(sb, fs, sysctlRules, lost)
	return nil
}

// fileSet is one sandbox's file and exec rules, wildcards expanded, with
// the layer chosen for each kind.
type fileSet struct {
	lines                 []fileRuleLine
	files, execs, procMem []policy.FileRule
	t                     *fileTable
	// The layer of file rules (file_open) and of exec rules
	// (bprm_check_security judges every binary of an execve chain, a
	// script then its interpreter; mmap_file and file_mprotect every file
	// mapped executable, ld.so /tmp/x).
	fileLayer, execLayer layer
	fileOpen, lsmExec    bool
}

// expandFiles expands the sandbox's file and exec rules (wildcards, the
// agent's own files, the exec default) and chooses their layers.
func (c *compiler) expandFiles(sb *policy.Sandbox) (*fileSet, error) {
	fileLayer := c.choose(MechKill, "file_open")
	execLayer := c.choose(MechKill, "bprm_check_security", "mmap_file")
	var lines []fileRuleLine
	var files, execs []policy.FileRule
	var procMem []policy.FileRule

	expand := func(r policy.FileRule, exec bool) ([]policy.FileRule, error) {
		line := fileRuleLine{rule: r, exec: exec}
		var out []policy.FileRule
		switch {
		case !exec && isProcMem(r.Path):
			line.special = "proc_mem"
			procMem = append(procMem, r)
		case strings.HasPrefix(r.Path, "/proc/*") || strings.HasPrefix(r.Path, "/proc/self/") || r.Path == "/proc/self":
			// PIDs come and go: a compile-time expansion would be stale at
			// once.
			line.special = "proc_wildcard"
		default:
			paths, err := expandWildcards(r.Path)
			if err != nil {
				return nil, err
			}
			if strings.Contains(r.Path, "*") {
				line.expanded = paths
				if line.expanded == nil {
					line.expanded = []string{}
				}
			}
			for _, p := range paths {
				if len(p) > maxRulePath {
					return nil, fmt.Errorf("%s: path %q is longer than %d bytes, the kernel tables' limit", describe(r, exec), p, maxRulePath)
				}
				e := r
				if e.Name == "" {
					e.Name = r.RuleName() // keep the policy's name for expansions
				}
				e.Path = p
				out = append(out, e)
			}
		}
		lines = append(lines, line)
		return out, nil
	}
	for _, r := range c.fileRules(sb) {
		out, err := expand(r, false)
		if err != nil {
			return nil, err
		}
		files = append(files, out...)
	}
	for _, r := range sb.ExecRules() {
		out, err := expand(r, true)
		if err != nil {
			return nil, err
		}
		execs = append(execs, out...)
	}
	for _, r := range sb.ExecRules() {
		if blocking(r.Action) {
			// A file with no path escapes every exec rule: refuse them.
			c.bsCategory(func(r *backstoprules.SandboxRules) *backstoprules.Rule { return &r.ExecFileless }, rules.ActionKill, c.rules.ID("exec-fileless"))
			if execLayer.mech != MechLSM {
				// mmap PROT_EXEC is judged at sys_enter, whose tracepoint
				// slows every syscall of the host: only where no LSM
				// mmap_file program judges it.
				c.bsCategory(func(r *backstoprules.SandboxRules) *backstoprules.Rule { return &r.MmapExec }, rules.ActionKill, c.rules.ID("exec-mmap"))
			}
			break
		}
	}
	if def := orAllow(sb.Exec.Default); def != policy.ActionAllow {
		// The default as the least specific rule: DecideFile prefers any
		// real rule on "/" (first on a tie).
		execs = append(execs, policy.FileRule{Name: "exec-default", Path: "/", Match: policy.MatchPrefix, Action: def})
	}
	return &fileSet{lines: lines, files: files, execs: execs, procMem: procMem, t: newFileTable(files, execs),
		fileLayer: fileLayer, execLayer: execLayer, fileOpen: fileLayer.mech == MechLSM, lsmExec: execLayer.mech == MechLSM}, nil
}

// lsmFiles writes the file and exec rules into the LSM path tables.
func (c *compiler) lsmFiles(fs *fileSet, lr *lsmrules.Rules) {
	files, execs, t := fs.files, fs.execs, fs.t
	// BPF LSM file_open: every file rule, both accesses written out.
	if fs.fileOpen {
		for _, k := range keysOf(files) {
			var ds [2]lsmrules.Decision
			for acc := accRead; acc <= accWrite; acc++ {
				if r, ok := t.decide(k, acc); ok {
					ds[acc] = lsmrules.Decision{Action: kernelAction(r.Action), RuleID: c.rules.ID(r.RuleName())}
				}
			}
			if ds[accRead] == ds[accWrite] {
				lr.Paths = append(lr.Paths, lsmrules.PathRule{Path: k.path, Prefix: k.prefix, Access: lsmrules.AccessAll, Decision: ds[accRead]})
				continue
			}
			lr.Paths = append(lr.Paths,
				lsmrules.PathRule{Path: k.path, Prefix: k.prefix, Access: lsmrules.AccessRead, Decision: ds[accRead]},
				lsmrules.PathRule{Path: k.path, Prefix: k.prefix, Access: lsmrules.AccessWrite, Decision: ds[accWrite]})
		}
	}

	// Exec rules on the LSM layer.
	if fs.lsmExec {
		for _, k := range keysOf(execs) {
			if r, ok := t.decide(k, accExec); ok {
				lr.Exec = append(lr.Exec, lsmrules.ExecRule{Path: k.path, Prefix: k.prefix,
					Decision: lsmrules.Decision{Action: kernelAction(r.Action), RuleID: c.rules.ID(r.RuleName())}})
				if blocking(r.Action) {
					// A file with no name (memfd, deleted) escapes every
					// exec rule: refused wherever one blocks.
					lr.Ops[lsmrules.OpExecFileless] = lsmrules.Decision{Action: rules.ActionBlock, RuleID: c.rules.ID("exec-fileless")}
				}
			}
		}
	}
}

// procMem writes the /proc/PID/mem rules (an LSM op, or a backstop
// category of this sandbox).
func (c *compiler) procMem(fs *fileSet, lr *lsmrules.Rules) {
	procMem, fileOpen := fs.procMem, fs.fileOpen
	// /proc/PID/mem: an op, not a path. The rules decide as DecideFile
	// would for a PID's mem file (a sandbox's own rule overrides its
	// preset's); the op has one action, the stricter of read and write.
	var procMemRule policy.FileRule
	var procMemSet bool
	for _, probe := range []string{"/proc/1/mem", "/proc/1/task/1/mem"} {
		for _, write := range []bool{false, true} {
			if r, ok := policy.DecideFile(procMem, probe, write); ok && (!procMemSet || kernelAction(r.Action) > kernelAction(procMemRule.Action)) {
				procMemRule, procMemSet = r, true
			}
		}
	}
	if procMemSet && fileOpen {
		lr.Ops[lsmrules.OpProcMem] = lsmrules.Decision{Action: kernelAction(procMemRule.Action), RuleID: c.rules.ID(procMemRule.RuleName())}
	}
	if procMemSet && !fileOpen {
		c.bsCategory(func(r *backstoprules.SandboxRules) *backstoprules.Rule { return &r.ProcMem }, backstopAction(procMemRule.Action), c.rules.ID(procMemRule.RuleName()))
	}
}

// backstopFiles writes the file rules the backstop enforces (exec rules
// without the LSM exec hooks, every file rule without file_open); it
// returns, by rule name, what its one action per path cannot apply.
func (c *compiler) backstopFiles(sid uint32, fs *fileSet, sysctlRules int) map[string][]string {
	files, execs, t, fileOpen, lsmExec := fs.files, fs.execs, fs.t, fs.fileOpen, fs.lsmExec
	// The backstop: file rules when file_open has no LSM program, exec
	// rules always (no LSM hook judges exec here).
	var accs []access
	var keyRules [][]policy.FileRule
	if !lsmExec {
		accs, keyRules = []access{accExec}, [][]policy.FileRule{execs}
	}
	if !fileOpen {
		accs = []access{accRead, accWrite, accExec}
		keyRules = append(keyRules, files)
	}
	lost := map[string][]string{} // rule name -> what the backstop cannot apply
	keys := keysOf(keyRules...)
	if !fileOpen && c.cgroupOK && sysctlRules > 0 && !slices.Contains(keys, pathKey{"/proc/sys/", true}) {
		keys = append(keys, pathKey{"/proc/sys/", true})
	}
	for _, k := range keys {
		var acts [numAccess]uint32
		var ids [numAccess]uint32
		var names [numAccess]string
		for _, acc := range accs {
			if acc != accExec && c.cgroupOK && sysctlRules > 0 && (strings.HasPrefix(k.path, "/proc/sys/") || k.path == "/proc/sys") {
				// cgroup/sysctl refuses these reads and writes with EPERM;
				// a kill at open would only pre-empt it.
				continue
			}
			if r, ok := t.decide(k, acc); ok {
				acts[acc] = backstopAction(r.Action)
				names[acc] = r.RuleName()
				ids[acc] = c.rules.ID(names[acc])
			}
		}
		var top uint32
		for _, acc := range accs {
			top = max(top, acts[acc])
		}
		var ops backstoprules.Op
		var id uint32
		for _, acc := range accs {
			if acts[acc] != top {
				if acts[acc] != rules.ActionAllow {
					// One action per key: the lesser one is not applied.
					lost[names[acc]] = append(lost[names[acc]], fmt.Sprintf("%s of %s", accName(acc), k.path))
				}
				continue
			}
			ops |= accOp(acc)
			if id == 0 {
				id = ids[acc]
			}
		}
		if ops == 0 {
			continue
		}
		c.plan.Backstop.Paths = append(c.plan.Backstop.Paths, backstoprules.PathRule{
			Path: k.path, Prefix: k.prefix, Ops: ops, SandboxID: sid, Rule: backstoprules.Rule{Action: top, ID: id}})
	}
	if !fileOpen {
		// Changes made without a write-open, judged by inode (see
		// backstoprules.DirRule): writable places, places whose reads are
		// refused, the write default on "/".
		for _, k := range keysOf(files) {
			if w, ok := t.decide(k, accWrite); ok {
				switch {
				case k.path == "/" && k.prefix:
					c.plan.Backstop.Dirs = append(c.plan.Backstop.Dirs, backstoprules.DirRule{Kind: backstoprules.DirDefault, SandboxID: sid,
						Rule: backstoprules.Rule{Action: backstopAction(w.Action), ID: c.rules.ID(w.RuleName())}})
				case w.Action == policy.ActionAllow:
					c.plan.Backstop.Dirs = append(c.plan.Backstop.Dirs, backstoprules.DirRule{Path: k.path, Kind: backstoprules.DirWritable, SandboxID: sid})
				}
			}
			if r, ok := t.decide(k, accRead); ok && blocking(r.Action) && k.path != "/" {
				c.plan.Backstop.Dirs = append(c.plan.Backstop.Dirs, backstoprules.DirRule{Path: k.path, Kind: backstoprules.DirProtected, SandboxID: sid,
					Rule: backstoprules.Rule{Action: backstopAction(r.Action), ID: c.rules.ID(r.RuleName())}})
			}
		}
		for _, r := range files {
			if blocking(r.Action) {
				// A partner sharing the file table could use a descriptor
				// the killed opener got.
				c.bsCategory(func(r *backstoprules.SandboxRules) *backstoprules.Rule { return &r.CloneFiles }, rules.ActionKill, c.rules.ID("clone-files"))
				break
			}
		}
	}
	return lost
}

// backstopChangeNote says what the backstop does about changes made
// without a write-open (inode_changed in bpf/include/backstop_inode.h).
const backstopChangeNote = "truncate, chmod, chown, rename, link, unlink, symlink, mknod, xattr, utimes: killed after the fact " +
	"(ctime tracepoints, Linux >= 6.13), not on overlay filesystems (a container's root, a workspace overlay), where only opens are judged"

// inodeNote says how other names of a protected file are judged.
const inodeNote = "other names (hard links, bind mounts) by inode: the exact file and every file below a prefix, followed when replaced, created or moved in"

// fileLines adds the Layers line of every file and exec rule.
func (c *compiler) fileLines(sb *policy.Sandbox, fs *fileSet, sysctlRules int, lost map[string][]string) {
	lines, fileLayer, execLayer, fileOpen, lsmExec := fs.lines, fs.fileLayer, fs.execLayer, fs.fileOpen, fs.lsmExec
	// Layers, one line per policy rule.
	for _, line := range lines {
		r := line.rule
		var l layer
		under := func(prefix string) bool { return strings.HasPrefix(r.Path, prefix) }
		switch {
		case line.special == "proc_mem":
			l = fileLayer
			if fileOpen {
				l.notes = []string{"lsm file_open: proc_mem op, every PID (self included), by inode"}
			} else {
				l.notes = []string{"backstop: opens of another process's /proc/PID/mem (its own stays open)"}
			}
		case line.special == "proc_wildcard":
			l = layer{mech: MechNone, notes: []string{"per-PID /proc paths cannot be listed ahead of time; only /proc/*/mem has a dedicated check"}}
		case line.exec:
			l = execLayer
			if lsmExec {
				l.notes = []string{"lsm bprm_check_security on the binary, a script and its interpreter",
					"mmap_file/file_mprotect on files mapped executable (the dynamic loader, libraries)",
					"a file with no name (memfd, deleted) refused at exec and PROT_EXEC mapping"}
				if !c.hook("file_mprotect") {
					l.notes = append(l.notes, "mprotect(PROT_EXEC) not judged (file_mprotect missing)")
				}
			} else {
				l.notes = []string{"backstop at exec (sched_prepare_exec); no LSM hook judges exec here"}
			}
		case c.cgroupOK && sysctlRules > 0 && (under("/proc/sys/") || r.Path == "/proc/sys"):
			// cgroup/sysctl refuses these whatever LSM offers.
			l = c.choose(MechCgroupBPF, "file_open")
			if l.mech == MechLSM {
				l.notes = []string{"lsm file_open", "also cgroup/sysctl at read/write"}
			} else {
				l.notes = []string{"cgroup/sysctl refuses the read or write"}
			}
		default:
			l = fileLayer
			if fileOpen {
				l.notes = []string{"lsm file_open on the resolved path", inodeNote}
				if r.Access != policy.AccessRead {
					l.notes = append(l.notes, c.changeHooksNote())
				}
			} else {
				l.notes = []string{"backstop at open, on the resolved path", inodeNote}
				if r.Access != policy.AccessRead {
					l.notes = append(l.notes, backstopChangeNote)
				}
			}
		}
		if line.expanded != nil {
			if len(line.expanded) == 0 {
				l.notes = append(l.notes, "'*' matched nothing when compiled (reload to pick up new matches)")
			} else {
				l.notes = append(l.notes, fmt.Sprintf("'*' expanded when compiled to %s (reload to pick up new matches)", strings.Join(line.expanded, ", ")))
			}
		}
		if lostWhat, ok := lost[r.RuleName()]; ok && l.mech == MechKill {
			l.notes = append(l.notes, "backstop holds one action per path, so not applied: "+strings.Join(dedupe(lostWhat), ", "))
		}
		c.add(sb, describe(r, line.exec), r.Action, l)
	}
}

func accName(a access) string {
	return [...]string{"reads", "writes", "execs"}[a]
}

func accOp(a access) backstoprules.Op {
	return [...]backstoprules.Op{backstoprules.OpRead, backstoprules.OpWrite, backstoprules.OpExec}[a]
}
