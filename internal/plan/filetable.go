package plan

// Path keys and their decisions: how policy file rules become entries of
// the kernel's longest-prefix path tables.

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/watcherhq/watcher/internal/policy"
)

// access indexes the accesses a path key decides.
type access int

const (
	accRead access = iota
	accWrite
	accExec
	numAccess
)

// pathKey is one entry of an LPM path table: a prefix or an exact path.
type pathKey struct {
	path   string
	prefix bool
}

// maxRulePath is the longest path the LSM and backstop tables hold.
const maxRulePath = 251

// fileTable decides accesses for path keys the way policy.DecideFile does
// for paths: for a prefix key, the most specific prefix rule enclosing it;
// for an exact key, every rule matching the path. Since a longest-prefix
// lookup of any path finds the key of the most specific rule matching it,
// writing each key with these decisions makes the kernel's lookup agree
// with the policy (including inheritance: a key written for one access
// carries the enclosing rules' decision for the others).
type fileTable struct {
	files, filePrefix []policy.FileRule
	exec, execPrefix  []policy.FileRule
}

func newFileTable(files, exec []policy.FileRule) *fileTable {
	t := &fileTable{files: files, exec: exec}
	for _, r := range files {
		if r.Match == policy.MatchPrefix {
			t.filePrefix = append(t.filePrefix, r)
		}
	}
	for _, r := range exec {
		if r.Match == policy.MatchPrefix {
			t.execPrefix = append(t.execPrefix, r)
		}
	}
	return t
}

func (t *fileTable) decide(k pathKey, acc access) (policy.FileRule, bool) {
	switch {
	case acc == accExec && k.prefix:
		return policy.DecideFile(t.execPrefix, k.path, false)
	case acc == accExec:
		return policy.DecideFile(t.exec, k.path, false)
	case k.prefix:
		return policy.DecideFile(t.filePrefix, k.path, acc == accWrite)
	}
	return policy.DecideFile(t.files, k.path, acc == accWrite)
}

// keysOf returns the table keys of rules: a prefix key per prefix rule (and
// an exact key for the directory itself when the path ends in "/"), an
// exact key per exact rule. Sorted, no duplicates.
func keysOf(rules ...[]policy.FileRule) []pathKey {
	seen := map[pathKey]bool{}
	for _, list := range rules {
		for _, r := range list {
			if r.Match == policy.MatchPrefix {
				seen[pathKey{r.Path, true}] = true
				if len(r.Path) > 1 && strings.HasSuffix(r.Path, "/") {
					seen[pathKey{strings.TrimSuffix(r.Path, "/"), false}] = true
				}
			} else {
				seen[pathKey{r.Path, false}] = true
			}
		}
	}
	out := make([]pathKey, 0, len(seen))
	for k := range seen {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].path != out[j].path {
			return out[i].path < out[j].path
		}
		return !out[i].prefix && out[j].prefix
	})
	return out
}

// isProcMem reports whether a rule path names /proc/PID/mem (or a task's):
// the LSM's proc_mem op and the backstop's ProcMem category judge those by
// inode, for every PID, where a path table could only list today's PIDs.
func isProcMem(p string) bool {
	return strings.HasPrefix(p, "/proc/*/") && strings.HasSuffix(p, "/mem")
}

// expandWildcards replaces each "*" component by the names that exist now
// (filepath.Glob), keeping the literal components after the last "*", so
// "/home/*/.ssh/" covers the .ssh directory of every existing home even
// before it is created. Sorted.
func expandWildcards(p string) ([]string, error) {
	trailing := strings.HasSuffix(p, "/") && len(p) > 1
	comps := strings.Split(strings.TrimSuffix(p, "/"), "/")
	last := -1
	for i, comp := range comps {
		if comp == "*" {
			last = i
		}
	}
	if last < 0 {
		return []string{p}, nil
	}
	pattern := make([]string, last+1)
	for i, comp := range comps[:last+1] {
		if comp == "*" {
			pattern[i] = comp
		} else {
			pattern[i] = globEscape(comp)
		}
	}
	rest := strings.Join(comps[last+1:], "/")
	matches, err := filepath.Glob(strings.Join(pattern, "/"))
	if err != nil {
		return nil, fmt.Errorf("expand %q: %w", p, err)
	}
	var out []string
	for _, m := range matches {
		e := m
		if rest != "" {
			if st, err := os.Stat(m); err != nil || !st.IsDir() {
				continue
			}
			e += "/" + rest
		}
		if trailing {
			e += "/"
		}
		out = append(out, e)
	}
	sort.Strings(out)
	return out, nil
}

func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}
