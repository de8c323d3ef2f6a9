package containers

import (
	"fmt"
	"path"
	"strings"
)

// Glob matches cgroup paths relative to the hierarchy root. Components are
// separated by "/"; a component "**" matches any number of components
// (including none); any other component is a path.Match pattern (*, ?,
// [a-z]) that stays within one component.
//
//	/kubepods.slice/**/cri-containerd-*.scope   every containerd container
//	/watcher/exec/*                             each watcher exec leaf
type Glob struct {
	pattern string
	parts   []string
}

// CompileGlob checks and compiles a pattern. It must be absolute (start
// with "/") and each component must be a valid path.Match pattern.
func CompileGlob(pattern string) (*Glob, error) {
	if !strings.HasPrefix(pattern, "/") {
		return nil, fmt.Errorf("cgroup glob %q: must start with /", pattern)
	}
	parts := splitPath(pattern)
	for _, p := range parts {
		if p == ".." {
			return nil, fmt.Errorf("cgroup glob %q: \"..\" is not allowed", pattern)
		}
		if p == "**" {
			continue
		}
		if strings.Contains(p, "**") {
			return nil, fmt.Errorf("cgroup glob %q: ** must be a whole component", pattern)
		}
		if _, err := path.Match(p, ""); err != nil {
			return nil, fmt.Errorf("cgroup glob %q: component %q: %w", pattern, p, err)
		}
	}
	return &Glob{pattern: pattern, parts: parts}, nil
}

// String returns the pattern.
func (g *Glob) String() string { return g.pattern }

// Match reports whether the cgroup path (relative to the hierarchy root)
// matches.
func (g *Glob) Match(rel string) bool {
	return matchParts(g.parts, splitPath(rel))
}

// MaxDepth returns how many components a matching path can have at most, or
// -1 when the pattern contains "**".
func (g *Glob) MaxDepth() int {
	for _, p := range g.parts {
		if p == "**" {
			return -1
		}
	}
	return len(g.parts)
}

func matchParts(pat, parts []string) bool {
	for len(pat) > 0 {
		if pat[0] == "**" {
			// Collapse runs of ** and try every split point.
			for len(pat) > 0 && pat[0] == "**" {
				pat = pat[1:]
			}
			if len(pat) == 0 {
				return true
			}
			for i := 0; i <= len(parts); i++ {
				if matchParts(pat, parts[i:]) {
					return true
				}
			}
			return false
		}
		if len(parts) == 0 {
			return false
		}
		if ok, _ := path.Match(pat[0], parts[0]); !ok {
			return false
		}
		pat, parts = pat[1:], parts[1:]
	}
	return len(parts) == 0
}
