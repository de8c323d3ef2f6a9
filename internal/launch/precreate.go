package launch

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/watcherhq/watcher/internal/policy"
)

// PrecreateWritable creates the missing directories of the write-allowed
// prefix rules below home (a tool cache such as ~/.config/go/telemetry/ on
// a machine where the tool never ran), owned like home. Landlock can only
// grant rights on existing files: without this, the first mkdir of a
// directory the policy lets the run write, in a parent it may not write,
// is refused. Rules with wildcards, paths outside home and paths below a
// write-refusing rule are left alone; errors are ignored (the run then
// sees the refusal it would have seen anyway). It returns what it created.
func PrecreateWritable(rules []policy.FileRule, home string) []string {
	home = filepath.Clean(home)
	st, err := os.Stat(home)
	if home == "/" || err != nil || !st.IsDir() {
		return nil
	}
	var uid, gid int = -1, -1
	if s, ok := st.Sys().(*syscall.Stat_t); ok {
		uid, gid = int(s.Uid), int(s.Gid)
	}
	var made []string
	for _, r := range rules {
		dir, ok := belowHome(strings.TrimSuffix(r.Path, "/"), home)
		if !ok || r.Match != policy.MatchPrefix || r.Action != policy.ActionAllow || !coversAccess(r, true) ||
			refusedBelow(rules, home, dir) {
			continue
		}
		if _, err := os.Lstat(dir); err == nil {
			continue
		}
		// Create component by component, never through a symlink.
		cur := home
		for _, c := range strings.Split(strings.TrimPrefix(dir, home+"/"), "/") {
			cur = filepath.Join(cur, c)
			fi, err := os.Lstat(cur)
			if err == nil {
				if !fi.IsDir() {
					break
				}
				continue
			}
			if os.Mkdir(cur, 0o755) != nil {
				break
			}
			if uid >= 0 {
				os.Lchown(cur, uid, gid)
			}
			made = append(made, cur)
		}
	}
	return made
}

// refusedBelow reports whether a rule that does not allow writing covers
// some directory between home and dir.
func refusedBelow(rules []policy.FileRule, home, dir string) bool {
	for _, r := range rules {
		if r.Action == policy.ActionAllow || !coversAccess(r, true) {
			continue
		}
		p, ok := belowHome(strings.TrimSuffix(r.Path, "/"), home)
		if ok && (dir == p || strings.HasPrefix(dir, p+"/")) {
			return true
		}
	}
	return false
}

// belowHome returns the directory path names below home: path itself, or
// with its leading components matched against home's as patterns
// (/home/*/.cache for /home/alice); the part below home must be literal.
func belowHome(path, home string) (string, bool) {
	hc := strings.Split(strings.TrimPrefix(home, "/"), "/")
	pc := strings.Split(strings.TrimPrefix(path, "/"), "/")
	if len(pc) <= len(hc) {
		return "", false
	}
	for i, c := range hc {
		if ok, err := filepath.Match(pc[i], c); err != nil || !ok {
			return "", false
		}
	}
	rest := pc[len(hc):]
	for _, c := range rest {
		if c == "" || c == "." || c == ".." || strings.ContainsAny(c, "*?[\\") {
			return "", false
		}
	}
	return filepath.Join(append([]string{home}, rest...)...), true
}
