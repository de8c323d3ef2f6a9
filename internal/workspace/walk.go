package workspace

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"
)

// A sandbox decides the shape of its upper layer: millions of entries in
// one directory, trees thousands deep. walkTree holds neither the whole
// tree nor a whole directory: it lists a directory in batches, visits
// each entry as it comes, and keeps only the directories still to enter
// (a relative path each) on an explicit stack, so memory grows with the
// directories pending, not with the entries, and depth costs no
// recursion. A path longer than the kernel's PATH_MAX (4096) fails with
// ENAMETOOLONG, named in the error.

// walkBatch is how many names walkTree reads from a directory at once.
const walkBatch = 1024

// walkItem is a directory still to list, or (leave) one whose subtree is
// done.
type walkItem struct {
	rel   string
	flag  bool // inherited mark chosen by visit (walkUpper: below an opaque directory)
	leave bool
}

// walkVisit sees one entry below the root: its path relative to the root,
// its lstat, and the mark its directory was given. For a directory it
// says whether to enter it and with which mark.
type walkVisit func(rel string, st *unix.Stat_t, flag bool) (enter, childFlag bool, err error)

// walkTree visits every entry below root (not root itself), each
// directory before what it holds, and calls leave (when not nil) for
// every directory entered once its subtree is done, also when the walk
// stops early on an error or cancellation (then with the walk's error
// joined to leave's). sorted lists each directory whole, in lexical
// order (for hashing); otherwise entries come in directory order.
func walkTree(m *meter, root string, sorted bool, visit walkVisit, leave func(rel string) error) (err error) {
	stack := []walkItem{{rel: "."}}
	defer func() {
		if err == nil || leave == nil {
			return
		}
		// Stopped early: directories entered still get their leave call
		// (commit sets their final attributes there).
		for i := len(stack) - 1; i >= 0; i-- {
			if stack[i].leave {
				err = errors.Join(err, leave(stack[i].rel))
			}
		}
	}()
	for len(stack) > 0 {
		it := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if it.leave {
			if err := leave(it.rel); err != nil {
				return err
			}
			continue
		}
		var enter []walkItem
		err := listDir(filepath.Join(root, it.rel), sorted, func(name string) error {
			if err := m.entry(); err != nil {
				return err
			}
			rel := name
			if it.rel != "." {
				rel = it.rel + "/" + name
			}
			var st unix.Stat_t
			if err := unix.Lstat(filepath.Join(root, rel), &st); err != nil {
				if errors.Is(err, unix.ENOENT) {
					return nil // gone since listed (moved by commit)
				}
				return fmt.Errorf("lstat %s: %w", filepath.Join(root, rel), err)
			}
			in, flag, err := visit(rel, &st, it.flag)
			if err != nil {
				return err
			}
			if in && isDir(&st) {
				enter = append(enter, walkItem{rel: rel, flag: flag})
			}
			return nil
		})
		if err != nil {
			return err
		}
		// Entered in listing order: push in reverse, each with its leave
		// marker beneath it.
		for i := len(enter) - 1; i >= 0; i-- {
			if leave != nil {
				stack = append(stack, walkItem{rel: enter[i].rel, leave: true})
			}
			stack = append(stack, enter[i])
		}
	}
	return nil
}

// listDir calls fn for each name in dir, in batches (or all, sorted).
func listDir(dir string, sorted bool, fn func(name string) error) error {
	f, err := os.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", dir, err)
	}
	defer f.Close()
	n := walkBatch
	if sorted {
		n = -1
	}
	for {
		names, err := f.Readdirnames(n)
		if sorted {
			slices.Sort(names)
		}
		for _, name := range names {
			if ferr := fn(name); ferr != nil {
				return ferr
			}
		}
		if err == io.EOF || (sorted && err == nil) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("list %s: %w", dir, err)
		}
	}
}
