package enforce

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// MaxTreeInodes bounds how many files below prefix rules one SetRules
// call gives inode entries (each layer's inode table is 65536 entries):
// files past it are judged by path only.
const MaxTreeInodes = 8192

// TreeInodes lists what lies below a prefix rule's directory, dir itself
// included, for inode entries: another name for a file below a protected
// prefix (a hard link made outside the sandbox, an earlier link to a file
// later moved in, a bind mount of the file) is then judged like its path.
// Symlinks are skipped (opening one opens its target, judged on its own)
// and never followed. It stops once budget entries were listed (budget is
// decremented) and reports whether it did. A missing dir lists nothing.
// Each file comes with its generation (IdentifyFile), so an entry made
// from it never matches a later file that reuses the inode number.
func TreeInodes(dir string, budget *int, fn func(path string, id *FileID)) (capped bool, err error) {
	return treeWalk(dir, budget, true, fn)
}

// treeWalk is TreeInodes; without generations when gen is false (the
// files' FileID then holds only their lstat, with GenerationAny).
func treeWalk(dir string, budget *int, gen bool, fn func(path string, id *FileID)) (capped bool, err error) {
	dir = filepath.Clean(dir)
	var ident identifier
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, werr error) error {
		if werr != nil {
			if p == dir && errors.Is(werr, fs.ErrNotExist) {
				return fs.SkipAll
			}
			return nil // unreadable below: judged by path only
		}
		if d.Type()&fs.ModeSymlink != 0 {
			return nil
		}
		if *budget <= 0 {
			capped = true
			return fs.SkipAll
		}
		var id FileID
		var ierr error
		if gen {
			id, ierr = ident.identify(p, false)
		} else {
			id.Generation = GenerationAny
			ierr = unix.Lstat(p, &id.Stat_t)
		}
		if ierr != nil || id.Mode&unix.S_IFMT == unix.S_IFLNK {
			return nil // gone meanwhile, or replaced by a symlink
		}
		*budget--
		fn(p, &id)
		return nil
	})
	if errors.Is(err, fs.SkipAll) {
		err = nil
	}
	return capped, err
}

// WatchDirs lists the directories whose changes can give a path rule
// another inode: the parent of every exact rule (a file replaced by
// rename, as passwd does) and every directory below a prefix rule that
// TreeInodes walks (a file created, moved in or replaced there). At most
// max directories; sorted.
func WatchDirs(exact, prefixes []string, max int) []string {
	set := map[string]bool{}
	for _, p := range exact {
		if d := filepath.Dir(p); d != p {
			set[d] = true
		}
	}
	budget := MaxTreeInodes
	for _, p := range prefixes {
		treeWalk(strings.TrimSuffix(p, "/"), &budget, false, func(path string, id *FileID) {
			if id.Mode&unix.S_IFMT == unix.S_IFDIR {
				set[path] = true
			}
		})
		if !strings.HasSuffix(p, "/") {
			// "/etc/sudoers" also covers siblings named after it.
			set[filepath.Dir(p)] = true
		}
	}
	out := make([]string, 0, len(set))
	for d := range set {
		if st, err := os.Stat(d); err == nil && st.IsDir() {
			out = append(out, d)
		}
	}
	sort.Strings(out)
	if len(out) > max {
		out = out[:max]
	}
	return out
}
