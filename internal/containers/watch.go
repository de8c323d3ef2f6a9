package containers

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/watcherhq/watcher/internal/cgroupfs"
)

// Target is something the watcher looks for: cgroups matching a glob, the
// cgroup of a container or pod, or containers whose runtime labels match.
// Exactly one of Glob, Ref and Labels is set.
type Target struct {
	// Name labels the target in events (e.g. the policy sandbox name).
	Name string
	// Glob selects cgroups by path.
	Glob *Glob
	// Ref selects a container or pod by id.
	Ref *Ref
	// Labels selects containers whose runtime labels include these (value
	// "*": the key with any value), read through WatcherConfig.Labels.
	Labels map[string]string
}

func (w *Watcher) matches(t Target, rel string, info Info, identified bool) bool {
	switch {
	case t.Glob != nil:
		return t.Glob.Match(rel)
	case t.Ref != nil:
		return identified && t.Ref.Matches(info)
	case t.Labels != nil:
		if !identified || info.ContainerID == "" || w.cfg.Labels == nil {
			return false
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		l, ok, err := w.cfg.Labels.Labels(ctx, info)
		if err != nil && w.cfg.OnError != nil {
			w.cfg.OnError(err)
		}
		return ok && MatchLabels(t.Labels, l)
	}
	return false
}

// Op says whether a cgroup appeared or went away.
type Op string

// Watcher event operations.
const (
	Appeared Op = "appeared"
	Gone     Op = "gone"
)

// Event reports a cgroup that started or stopped matching a target.
type Event struct {
	Op Op
	// Target is the Name of the target matched.
	Target string
	Match
}

// WatcherConfig configures a Watcher.
type WatcherConfig struct {
	// Root is the cgroup2 mount; empty means the one in /proc/self/mountinfo.
	Root string
	// Targets to look for; they can be replaced later with SetTargets.
	Targets []Target
	// MaxDepth bounds which directories are watched and scanned below Root;
	// 0 means DefaultMaxDepth.
	MaxDepth int
	// Rescan is how often the whole tree is rescanned as a safety net for
	// missed notifications (inotify queue overflow, a directory created
	// before its parent's watch was in place); 0 means 30 s.
	Rescan time.Duration
	// OnEvent receives every event, from the watcher's goroutine, in order.
	// It should return quickly.
	OnEvent func(Event)
	// Labels reads container labels for label targets (nil: they match
	// nothing).
	Labels LabelSource
	// OnError, if set, hears label lookups that failed.
	OnError func(error)
}

// Watcher reports cgroups that match its targets: every existing one when
// it starts, then new ones as they appear and old ones as they go, without
// restart. It watches each directory of the hierarchy down to MaxDepth with
// inotify (one watch per cgroup, so the cost is bounded by the number of
// cgroups, not by activity in them) and rescans periodically.
type Watcher struct {
	cfg      WatcherConfig
	resolver Resolver

	mu      sync.Mutex
	targets []Target
	kick    chan struct{}

	// known maps cgroup path -> target names it matched; owned by Run.
	known map[string]map[string]Match
}

// NewWatcher checks the configuration and returns a watcher; call Run.
func NewWatcher(cfg WatcherConfig) (*Watcher, error) {
	if cfg.Root == "" {
		root, err := cgroupfs.Mountpoint()
		if err != nil {
			return nil, fmt.Errorf("cgroup watcher: %w", err)
		}
		cfg.Root = root
	}
	if cfg.MaxDepth <= 0 {
		cfg.MaxDepth = DefaultMaxDepth
	}
	if cfg.Rescan <= 0 {
		cfg.Rescan = 30 * time.Second
	}
	if cfg.OnEvent == nil {
		return nil, errors.New("cgroup watcher: OnEvent is required")
	}
	for _, t := range cfg.Targets {
		if err := checkTarget(t); err != nil {
			return nil, err
		}
	}
	return &Watcher{
		cfg:      cfg,
		resolver: Resolver{Root: filepath.Clean(cfg.Root), MaxDepth: cfg.MaxDepth},
		targets:  append([]Target(nil), cfg.Targets...),
		kick:     make(chan struct{}, 1),
		known:    map[string]map[string]Match{},
	}, nil
}

func checkTarget(t Target) error {
	n := 0
	for _, set := range []bool{t.Glob != nil, t.Ref != nil, t.Labels != nil} {
		if set {
			n++
		}
	}
	if n != 1 {
		return fmt.Errorf("cgroup watcher: target %q needs exactly one of Glob, Ref and Labels", t.Name)
	}
	return nil
}

// SetTargets replaces the targets (e.g. after a policy reload). Run then
// rescans: cgroups matching a new target are reported as appeared, those
// that matched only removed targets as gone.
func (w *Watcher) SetTargets(ts []Target) error {
	for _, t := range ts {
		if err := checkTarget(t); err != nil {
			return err
		}
	}
	w.mu.Lock()
	w.targets = append([]Target(nil), ts...)
	w.mu.Unlock()
	select {
	case w.kick <- struct{}{}:
	default:
	}
	return nil
}

// Run reports existing matches, then watches until ctx ends. It returns
// ctx's error, or an error if inotify cannot be set up.
func (w *Watcher) Run(ctx context.Context) error {
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("cgroup watcher: %w", err)
	}
	defer fw.Close()
	root := w.resolver.Root
	if err := fw.Add(root); err != nil {
		return fmt.Errorf("cgroup watcher: watch %s: %w", root, err)
	}
	watched := map[string]bool{root: true}
	addWatch := func(abs string) {
		if watched[abs] {
			return
		}
		// A directory can vanish before the watch is added: ignore.
		if fw.Add(abs) == nil {
			watched[abs] = true
		}
	}
	// Watches first, then the scan, so nothing created in between is missed.
	w.resolver.Walk(func(_, abs string) error { addWatch(abs); return nil })
	w.rescan()

	tick := time.NewTicker(w.cfg.Rescan)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-w.kick:
			w.rescan()
		case <-tick.C:
			w.resolver.Walk(func(_, abs string) error { addWatch(abs); return nil })
			w.rescan()
		case err, ok := <-fw.Errors:
			if !ok {
				return errors.New("cgroup watcher: inotify closed")
			}
			// Overflow or a transient error: a full rescan catches up.
			_ = err
			w.resolver.Walk(func(_, abs string) error { addWatch(abs); return nil })
			w.rescan()
		case ev, ok := <-fw.Events:
			if !ok {
				return errors.New("cgroup watcher: inotify closed")
			}
			rel, inTree := w.rel(ev.Name)
			if !inTree {
				continue
			}
			switch {
			case ev.Has(fsnotify.Create):
				if strings.Count(rel, "/") > w.cfg.MaxDepth || !isDir(ev.Name) {
					continue
				}
				// Watch the new cgroup and everything already below it
				// (a runtime creates nested cgroups in quick succession).
				addWatch(ev.Name)
				sub := Resolver{Root: ev.Name, MaxDepth: w.cfg.MaxDepth - strings.Count(rel, "/")}
				w.consider(rel, ev.Name)
				sub.Walk(func(subRel, abs string) error {
					addWatch(abs)
					w.consider(rel+subRel, abs)
					return nil
				})
			case ev.Has(fsnotify.Remove):
				delete(watched, ev.Name)
				w.forgetTree(rel)
			}
		}
	}
}

func (w *Watcher) rel(abs string) (string, bool) {
	root := w.resolver.Root
	if !strings.HasPrefix(abs, root+"/") {
		return "", false
	}
	return abs[len(root):], true
}

func isDir(abs string) bool {
	st, err := os.Lstat(abs)
	return err == nil && st.IsDir()
}

func (w *Watcher) snapshotTargets() []Target {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.targets
}

// consider evaluates one cgroup against the targets and reports new matches.
func (w *Watcher) consider(rel, abs string) {
	targets := w.snapshotTargets()
	info, identified := Identify(rel)
	for _, t := range targets {
		if !w.matches(t, rel, info, identified) {
			continue
		}
		if _, seen := w.known[rel][t.Name]; seen {
			continue
		}
		id, err := cgroupfs.ID(abs)
		if err != nil {
			continue
		}
		m := Match{Path: rel, Abs: abs, ID: id, Info: info}
		if w.known[rel] == nil {
			w.known[rel] = map[string]Match{}
		}
		w.known[rel][t.Name] = m
		w.cfg.OnEvent(Event{Op: Appeared, Target: t.Name, Match: m})
	}
}

// forgetTree reports every known match at or below rel as gone.
func (w *Watcher) forgetTree(rel string) {
	var gone []string
	for p := range w.known {
		if p == rel || strings.HasPrefix(p, rel+"/") {
			gone = append(gone, p)
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(gone)))
	for _, p := range gone {
		w.reportGone(p, nil)
	}
}

func (w *Watcher) reportGone(rel string, keep map[string]bool) {
	names := make([]string, 0, len(w.known[rel]))
	for name := range w.known[rel] {
		if !keep[name] {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	for _, name := range names {
		m := w.known[rel][name]
		delete(w.known[rel], name)
		w.cfg.OnEvent(Event{Op: Gone, Target: name, Match: m})
	}
	if len(w.known[rel]) == 0 {
		delete(w.known, rel)
	}
}

// rescan walks the whole tree: reports new matches, and reports as gone the
// matches whose cgroup vanished or whose target no longer selects them.
func (w *Watcher) rescan() {
	targets := w.snapshotTargets()
	present := map[string]map[string]bool{}
	w.resolver.Walk(func(rel, abs string) error {
		info, identified := Identify(rel)
		for _, t := range targets {
			if w.matches(t, rel, info, identified) {
				if present[rel] == nil {
					present[rel] = map[string]bool{}
				}
				present[rel][t.Name] = true
			}
		}
		if present[rel] != nil {
			w.consider(rel, abs)
		}
		return nil
	})
	var paths []string
	for p := range w.known {
		paths = append(paths, p)
	}
	sort.Sort(sort.Reverse(sort.StringSlice(paths)))
	for _, p := range paths {
		w.reportGone(p, present[p])
	}
}
