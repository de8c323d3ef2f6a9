package containers

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/watcherhq/watcher/internal/cgroupfs"
)

// ErrNotFound is returned when no cgroup carries the referenced container.
var ErrNotFound = errors.New("no cgroup for container")

// DefaultMaxDepth bounds how deep scans descend below the hierarchy root.
// Kubernetes containers sit at depth 4 (kubepods.slice/qos/pod/container);
// kubelets with their own cgroup root (kind, k3s) add two or three.
const DefaultMaxDepth = 10

// Match is a cgroup found for a reference or a glob.
type Match struct {
	// Path is relative to the hierarchy root, starting with "/".
	Path string `json:"path"`
	// Abs is the filesystem path of the cgroup directory.
	Abs string `json:"abs"`
	// ID is the cgroup v2 id (inode number).
	ID uint64 `json:"id"`
	// Info is what the path's naming says about the container or pod.
	Info Info `json:"info,omitzero"`
}

// Resolver finds container cgroups in one cgroup v2 hierarchy.
type Resolver struct {
	// Root is the cgroup2 mount point (or, in tests, a cgroup below it whose
	// subtree mimics a host's layout).
	Root string
	// MaxDepth bounds the search; 0 means DefaultMaxDepth.
	MaxDepth int
}

// NewResolver returns a resolver for the cgroup2 hierarchy discovered from
// /proc/self/mountinfo.
func NewResolver() (*Resolver, error) {
	root, err := cgroupfs.Mountpoint()
	if err != nil {
		return nil, fmt.Errorf("container resolver: %w", err)
	}
	return &Resolver{Root: root}, nil
}

// Resolve returns the cgroup of the referenced container or pod. A short
// container id must be unambiguous.
func (r *Resolver) Resolve(ref Ref) (Match, error) {
	// Fast path: a full id outside Kubernetes sits at a documented path.
	if !ref.Pod && len(ref.ID) == 64 {
		for _, rel := range ContainerPaths(ref.Runtime, ref.ID) {
			if m, ok := r.check(rel, ref); ok {
				return m, nil
			}
		}
	}
	if ref.Pod {
		for _, rel := range PodPaths(ref.ID) {
			if m, ok := r.check(rel, ref); ok {
				return m, nil
			}
		}
	}
	var found []Match
	err := r.Walk(func(rel, abs string) error {
		if info, ok := Identify(rel); ok && ref.Matches(info) {
			id, err := cgroupfs.ID(abs)
			if err != nil {
				return nil // removed while scanning
			}
			found = append(found, Match{Path: rel, Abs: abs, ID: id, Info: info})
		}
		return nil
	})
	if err != nil {
		return Match{}, fmt.Errorf("resolve %s: %w", ref, err)
	}
	switch {
	case len(found) == 0:
		return Match{}, fmt.Errorf("resolve %s: %w", ref, ErrNotFound)
	case len(found) > 1:
		ids := make([]string, len(found))
		for i, m := range found {
			ids[i] = m.Path
		}
		sort.Strings(ids)
		// The same full id twice is one container seen through two names
		// (should not happen); different ids mean the prefix is too short.
		if !ref.Pod && !sameContainer(found) {
			return Match{}, fmt.Errorf("resolve %s: ambiguous id prefix, matches %s", ref, strings.Join(ids, ", "))
		}
		return Match{}, fmt.Errorf("resolve %s: found in several cgroups: %s", ref, strings.Join(ids, ", "))
	}
	return found[0], nil
}

func sameContainer(ms []Match) bool {
	for _, m := range ms[1:] {
		if m.Info.ContainerID != ms[0].Info.ContainerID {
			return false
		}
	}
	return true
}

func (r *Resolver) check(rel string, ref Ref) (Match, bool) {
	info, ok := Identify(rel)
	if !ok || !ref.Matches(info) {
		return Match{}, false
	}
	abs := filepath.Join(r.Root, rel)
	id, err := cgroupfs.ID(abs)
	if err != nil {
		return Match{}, false
	}
	return Match{Path: rel, Abs: abs, ID: id, Info: info}, true
}

// Glob returns every cgroup whose path matches g, sorted by path.
func (r *Resolver) Glob(g *Glob) ([]Match, error) {
	var out []Match
	err := r.Walk(func(rel, abs string) error {
		if !g.Match(rel) {
			return nil
		}
		id, err := cgroupfs.ID(abs)
		if err != nil {
			return nil
		}
		info, _ := Identify(rel)
		out = append(out, Match{Path: rel, Abs: abs, ID: id, Info: info})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("glob %s: %w", g, err)
	}
	return out, nil
}

// Walk calls fn for every cgroup directory below Root (not Root itself), in
// lexical order, down to MaxDepth. Directories that vanish during the walk
// are skipped: cgroups come and go all the time.
func (r *Resolver) Walk(fn func(rel, abs string) error) error {
	max := r.MaxDepth
	if max <= 0 {
		max = DefaultMaxDepth
	}
	root := filepath.Clean(r.Root)
	return filepath.WalkDir(root, func(abs string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return fs.SkipDir
			}
			if abs == root {
				return err
			}
			return fs.SkipDir
		}
		if !d.IsDir() || abs == root {
			return nil
		}
		rel := strings.TrimPrefix(abs, root)
		if strings.Count(rel, "/") > max {
			return fs.SkipDir
		}
		return fn(rel, abs)
	})
}
