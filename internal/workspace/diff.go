package workspace

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sort"

	"golang.org/x/sys/unix"
)

// ChangeKind says what happened to a path.
type ChangeKind string

// Change kinds.
const (
	Added   ChangeKind = "added"
	Changed ChangeKind = "changed"
	Deleted ChangeKind = "deleted"
)

// Change is one path that differs between the overlay and the real
// directory.
type Change struct {
	// Kind is added, changed or deleted.
	Kind ChangeKind `json:"kind"`
	// Path is the absolute path in the real directory.
	Path string `json:"path"`
	// Dir is set for directories.
	Dir bool `json:"dir,omitempty"`
	// Size is the new size (added, changed) or the size that goes
	// (deleted; for a directory, everything below it).
	Size int64 `json:"size"`
}

// Diff lists the changes of every layer, sorted by path. A directory that
// is added or deleted is one change (its contents are not listed).
// Directories that merely hold changed files are not changes. The list
// is whole: its memory grows with the changes; EachChange streams them.
func (w *Workspace) Diff(ctx context.Context) ([]Change, error) {
	var out []Change
	if err := w.EachChange(ctx, func(c Change) error { out = append(out, c); return nil }); err != nil {
		return nil, err
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, nil
}

// EachChange calls fn for each change of every layer, in walk order (not
// sorted), holding none of them.
func (w *Workspace) EachChange(ctx context.Context, fn func(Change) error) error {
	unlock, err := w.lock()
	if err != nil {
		return err
	}
	defer unlock()
	m := w.meter(ctx, "diff")
	if err := w.eachChangeLocked(m, fn); err != nil {
		return w.stopped(m, "diff", err)
	}
	return nil
}

func (w *Workspace) eachChangeLocked(m *meter, fn func(Change) error) error {
	for i := range w.Layers {
		if err := diffLayer(m, &w.Layers[i], fn); err != nil {
			return fmt.Errorf("diff %s: %w", w.Layers[i].Lower, err)
		}
	}
	return nil
}

// MaxListedChanges is the most changes a Result lists (about 200 bytes
// each); Result.Unlisted counts the rest.
const MaxListedChanges = 100_000

// changeList collects the changes of a Result, the first
// MaxListedChanges of them.
type changeList struct {
	changes  []Change
	unlisted int
}

func (c *changeList) add(ch Change) error {
	if len(c.changes) < MaxListedChanges {
		c.changes = append(c.changes, ch)
	} else {
		c.unlisted++
	}
	return nil
}

func (c *changeList) sorted() []Change {
	sort.Slice(c.changes, func(i, j int) bool { return c.changes[i].Path < c.changes[j].Path })
	return c.changes
}

// listLocked lists the changes for a Result.
func (w *Workspace) listLocked(m *meter) (changeList, error) {
	var c changeList
	err := w.eachChangeLocked(m, c.add)
	c.sorted()
	return c, err
}

// isWhiteout reports an overlayfs whiteout: a character device 0:0.
func isWhiteout(st *unix.Stat_t) bool {
	return st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0
}

// isOpaque reports an opaque directory (its lower contents are hidden).
func isOpaque(path string) bool {
	buf := make([]byte, 4)
	n, err := unix.Lgetxattr(path, "trusted.overlay.opaque", buf)
	return err == nil && n == 1 && buf[0] == 'y'
}

func lstat(p string) (*unix.Stat_t, error) {
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

func isDir(st *unix.Stat_t) bool { return st.Mode&unix.S_IFMT == unix.S_IFDIR }

// treeSize is the total size of the regular files at and below p
// (apparent sizes: a sparse file counts its length). A walk that cannot
// go on (a path beyond PATH_MAX) is an error: a diff that hides part of a
// tree would let a commit stop halfway.
func treeSize(m *meter, p string) (int64, error) {
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil || !isDir(&st) {
		if err == nil && st.Mode&unix.S_IFMT == unix.S_IFREG {
			return st.Size, nil
		}
		return 0, nil
	}
	var n int64
	err := walkTree(m, p, false, func(_ string, st *unix.Stat_t, _ bool) (bool, bool, error) {
		if st.Mode&unix.S_IFMT == unix.S_IFREG {
			n += st.Size
		}
		return true, false, nil
	}, nil)
	return n, err
}

// upperEntry is one entry of an upper layer beside the lower entry of the
// same name.
type upperEntry struct {
	up, rel, real string
	ust           *unix.Stat_t
	lst           *unix.Stat_t // nil when the lower layer has no such entry
	// opaque: a directory over a lower directory that shows nothing of it
	// (opaque itself, or below an opaque directory: no lower entry shows
	// through, whatever the directories in between say).
	opaque bool
}

// walkUpper visits every entry of the upper layer, parents first, with its
// lower counterpart; visit's filepath.SkipDir skips a directory. leave
// (when not nil) is called for each directory entered once its subtree
// is done (see walkTree).
func walkUpper(m *meter, l *Layer, visit func(e *upperEntry) error, leave func(rel string) error) error {
	return walkTree(m, l.Upper, false, func(rel string, st *unix.Stat_t, underOpaque bool) (bool, bool, error) {
		e := &upperEntry{up: filepath.Join(l.Upper, rel), rel: rel, real: filepath.Join(l.Lower, rel), ust: st}
		lst, lerr := lstat(e.real)
		if lerr != nil && !errors.Is(lerr, unix.ENOENT) {
			return false, false, lerr
		}
		if lerr == nil {
			e.lst = lst
		}
		if isDir(e.ust) && e.lst != nil && isDir(e.lst) && (underOpaque || isOpaque(e.up)) {
			e.opaque = true
		}
		err := visit(e)
		if err == filepath.SkipDir {
			return false, false, nil
		}
		return err == nil, underOpaque || e.opaque, err
	}, leave)
}

func diffLayer(m *meter, l *Layer, emit func(Change) error) error {
	return walkUpper(m, l, func(e *upperEntry) error {
		up, real, ust, lst := e.up, e.real, e.ust, e.lst
		inLower := lst != nil
		switch {
		case isWhiteout(ust):
			if inLower {
				size, err := treeSize(m, real)
				if err != nil {
					return err
				}
				return emit(Change{Kind: Deleted, Path: real, Dir: isDir(lst), Size: size})
			}
		case isDir(ust):
			switch {
			case !inLower, !isDir(lst):
				// Added, or a directory replaced a file.
				size, err := treeSize(m, up)
				if err != nil {
					return err
				}
				kind := Added
				if inLower {
					kind = Changed
				}
				if err := emit(Change{Kind: kind, Path: real, Dir: true, Size: size}); err != nil {
					return err
				}
				return filepath.SkipDir
			case e.opaque:
				// Everything of the lower directory that the upper one
				// does not hold again is gone.
				return opaqueDeletions(m, real, up, emit)
			}
		default:
			switch {
			case !inLower:
				return emit(Change{Kind: Added, Path: real, Size: ust.Size})
			case isDir(lst):
				return emit(Change{Kind: Changed, Path: real, Size: ust.Size})
			default:
				same, err := sameFile(m, up, ust, real, lst)
				if err != nil {
					return err
				}
				if !same {
					return emit(Change{Kind: Changed, Path: real, Size: ust.Size})
				}
			}
		}
		return nil
	}, nil)
}

// opaqueDeletions emits the entries of the lower directory lowerDir that
// the opaque upper directory upDir does not hold.
func opaqueDeletions(m *meter, lowerDir, upDir string, emit func(Change) error) error {
	return listDir(lowerDir, false, func(name string) error {
		if err := m.entry(); err != nil {
			return err
		}
		if _, err := lstat(filepath.Join(upDir, name)); err == nil {
			return nil // listed (changed or not) when the walk reaches it
		}
		p := filepath.Join(lowerDir, name)
		st, err := lstat(p)
		if err != nil {
			return nil // gone meanwhile
		}
		size, err := treeSize(m, p)
		if err != nil {
			return err
		}
		return emit(Change{Kind: Deleted, Path: p, Dir: isDir(st), Size: size})
	})
}

// sameFile reports whether a copied-up file equals the real one (a
// copy-up without a change, e.g. after open for writing without a write).
func sameFile(m *meter, up string, ust *unix.Stat_t, real string, lst *unix.Stat_t) (bool, error) {
	if ust.Mode != lst.Mode || ust.Uid != lst.Uid || ust.Gid != lst.Gid || ust.Size != lst.Size {
		return false, nil
	}
	switch ust.Mode & unix.S_IFMT {
	case unix.S_IFLNK:
		a, err := readlink(up)
		if err != nil {
			return false, err
		}
		b, err := readlink(real)
		return err == nil && a == b, err
	case unix.S_IFREG:
		return sameContent(m, up, real, ust.Size)
	default:
		return ust.Rdev == lst.Rdev, nil
	}
}

// sameContent compares two regular files of equal size by their data
// extents (sameData), never opening anything else.
func sameContent(m *meter, a, b string, size int64) (bool, error) {
	fa, err := openRegular(a)
	if err != nil {
		return false, err
	}
	defer unix.Close(fa)
	fb, err := openRegular(b)
	if err != nil {
		return false, err
	}
	defer unix.Close(fb)
	return sameData(m, fa, fb, size)
}

// openRegular opens p for reading if it is a regular file, following no
// symlink and never blocking on a FIFO swapped in since it was listed.
func openRegular(p string) (int, error) {
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open %s: %w", p, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return -1, fmt.Errorf("open %s: not a regular file: %w", p, errMoved)
	}
	return fd, nil
}

// upperSize is the bytes the upper layers hold (apparent sizes).
func (w *Workspace) upperSize(m *meter) (int64, error) {
	var n int64
	for _, l := range w.Layers {
		k, err := treeSize(m, l.Upper)
		if err != nil {
			return n, err
		}
		n += k
	}
	return n, nil
}
