package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/canary"
	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/escape"
	"github.com/watcherhq/watcher/internal/pipeline"
	"github.com/watcherhq/watcher/internal/policy"
)

// The escape watch scores each leaf of a sandbox on its own: the cgroup
// right below a sandbox root that holds the process (a `watcher exec`
// run's leaf, or a container's cgroup under a pod root), or the root
// itself for a process there (a container found by id or glob is its own
// root). One command's refusals then never freeze another command that
// shares the sandbox name; `escape.scope: sandbox` scores and freezes the
// whole sandbox instead.

// leafInfo is the leaf of a process cgroup.
type leafInfo struct {
	id   uint64
	path string // empty when the cgroup was gone before it was looked up
}

// maxLeafCache bounds the process-cgroup-to-leaf cache (cleared when full).
const maxLeafCache = 8192

// escapeLeaf is escape.Config.Leaf: the leaf cgroup an event is scored
// under, or 0 for sandbox-wide scoring. It runs only for events that carry
// an escape signal.
func (a *Agent) escapeLeaf(ev *audit.Event) uint64 {
	if sb := a.Policy().Sandbox(ev.Sandbox.Name); sb != nil && sb.Escape.Scope == policy.EscapeScopeSandbox {
		return 0
	}
	cg := ev.Process.CgroupID
	if cg == 0 {
		return 0
	}
	if v, ok := a.leaves.Load(cg); ok {
		return v.(leafInfo).id
	}
	li := a.findLeaf(ev.Sandbox.CgroupID, cg)
	if a.leafCount.Add(1) > maxLeafCache {
		a.leaves.Clear()
		a.leafCount.Store(1)
	}
	a.leaves.Store(cg, li)
	return li.id
}

// findLeaf walks the sandbox root's cgroup tree for the process cgroup cg.
// A cgroup that is already gone is its own leaf, with no path (nothing is
// left in it to freeze).
func (a *Agent) findLeaf(rootID, cg uint64) leafInfo {
	a.mu.Lock()
	var root string
	if r := a.roots[rootID]; r != nil {
		root = r.path
	}
	a.mu.Unlock()
	if root == "" {
		return leafInfo{id: cg}
	}
	if cg == rootID {
		return leafInfo{id: cg, path: root}
	}
	found := leafInfo{id: cg}
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() || p == root {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok && st.Ino == cg {
			rel, _ := filepath.Rel(root, p)
			top := filepath.Join(root, strings.SplitN(rel, string(filepath.Separator), 2)[0])
			if id, err := cgroupfs.ID(top); err == nil {
				found = leafInfo{id: id, path: top}
			}
			return filepath.SkipAll
		}
		return nil
	})
	return found
}

// frozenLeaves are the cgroups the escape watch froze, by sandbox.
type frozenLeaves struct {
	mu    sync.Mutex
	paths map[string]map[string]bool
}

func (f *frozenLeaves) add(sandbox string, paths ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.paths == nil {
		f.paths = map[string]map[string]bool{}
	}
	if f.paths[sandbox] == nil {
		f.paths[sandbox] = map[string]bool{}
	}
	for _, p := range paths {
		f.paths[sandbox][p] = true
	}
}

func (f *frozenLeaves) any(sandbox string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.paths[sandbox]) > 0
}

func (f *frozenLeaves) take(sandbox string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for p := range f.paths[sandbox] {
		out = append(out, p)
	}
	delete(f.paths, sandbox)
	return out
}

// escapeSink is the escape watch in the fan-out: it classifies each event
// (escape.Classify) and feeds the scorer; a score over the threshold comes
// back as a decision, not a call into the agent.
type escapeSink struct{ s *escape.Scorer }

func (e escapeSink) Name() string { return "escape_watch" }
func (e escapeSink) Close() error { return nil }
func (e escapeSink) Consume(ev *audit.Event) (pipeline.Decision, error) {
	// The classify step, once per event: most events carry no escape
	// signal and stop here, in place; the few that do are scored with
	// their class (the scorer copies only those).
	sig, mult, ok := escape.Classify(ev)
	if !ok {
		return pipeline.Decision{}, nil
	}
	if d := e.s.ObserveClassified(ev, sig, mult); d != nil {
		return pipeline.Decision{Kind: "escape", Value: d}, nil
	}
	return pipeline.Decision{}, nil
}

// escaped acts on an escape-watch decision: freeze the leaf that earned
// the score, or the whole sandbox for scope sandbox (when the policy's
// action is freeze), and raise an alert with the evidence.
func (a *Agent) escaped(d *escape.Decision) audit.Event {
	sb := a.Policy().Sandbox(d.Sandbox)
	action := policy.EscapeFreeze
	if sb != nil && sb.Escape.Action != "" {
		action = sb.Escape.Action
	}
	msg := d.Summary()
	if action == policy.EscapeFreeze {
		var targets []string
		if d.Leaf == 0 {
			for _, r := range a.rootsOf(d.Sandbox) {
				targets = append(targets, r.path)
			}
		} else if v, ok := a.leaves.Load(d.Leaf); ok && v.(leafInfo).path != "" {
			targets = append(targets, v.(leafInfo).path)
		} else {
			// Processes of deeper cgroups map to the leaf: find its path.
			for _, p := range a.leavesOf(d.Leaf) {
				targets = append(targets, p)
				break
			}
		}
		var froze []string
		for _, p := range targets {
			if err := cgroupfs.Freeze(p, true); err == nil {
				froze = append(froze, p)
			}
		}
		if len(froze) > 0 {
			a.frozen.add(d.Sandbox, froze...)
			msg += "; frozen: " + strings.Join(froze, ", ") + " (watcher thaw " + d.Sandbox + ")"
		} else {
			msg += "; nothing left to freeze (the cgroup is gone)"
		}
	}
	return audit.Event{Kind: audit.KindEscape, Verdict: audit.VerdictRecorded, Severity: audit.SeverityAlert,
		Sandbox: audit.Sandbox{Name: d.Sandbox, CgroupID: d.CgroupID}, Mechanism: "escape_watch", Message: msg}
}

// leavesOf returns the known paths of leaf id (process cgroups map to it).
func (a *Agent) leavesOf(id uint64) map[uint64]string {
	out := map[uint64]string{}
	a.leaves.Range(func(k, v any) bool {
		if li := v.(leafInfo); li.id == id && li.path != "" {
			out[k.(uint64)] = li.path
		}
		return true
	})
	return out
}

func (a *Agent) rootsOf(sandbox string) []root {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []root
	for _, r := range a.roots {
		if r.sandbox == sandbox {
			out = append(out, *r)
		}
	}
	return out
}

func (a *Agent) escapeLimits(sandbox string) (float64, time.Duration, bool) {
	sb := a.Policy().Sandbox(sandbox)
	if sb == nil || !sb.Escape.Enabled {
		return 0, 0, false
	}
	return sb.Escape.Threshold, sb.Escape.Window.Duration, true
}

// Thaw thaws a sandbox: the leaves the escape watch froze and its roots
// (control.Handler).
func (a *Agent) Thaw(sandbox string) error {
	roots := a.rootsOf(sandbox)
	if len(roots) == 0 {
		return fmt.Errorf("no sandbox %q", sandbox)
	}
	paths := a.frozen.take(sandbox)
	for _, r := range roots {
		paths = append(paths, r.path)
	}
	for _, p := range paths {
		if err := canary.Thaw(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	a.escape.Reset(sandbox)
	a.emit(audit.Event{Kind: audit.KindAgent, Verdict: audit.VerdictRecorded, Severity: audit.SeverityAlert,
		Sandbox: audit.Sandbox{Name: sandbox}, Message: "sandbox thawed by an operator"})
	return nil
}
