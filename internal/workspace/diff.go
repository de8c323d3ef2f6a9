package workspace

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

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
// Directories that merely hold changed files are not changes.
func (w *Workspace) Diff() ([]Change, error) {
	unlock, err := w.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	return w.diffLocked()
}

func (w *Workspace) diffLocked() ([]Change, error) {
	var out []Change
	for i := range w.Layers {
		ch, err := diffLayer(&w.Layers[i])
		if err != nil {
			return nil, fmt.Errorf("workspace %s: diff %s: %w", w.Sandbox, w.Layers[i].Lower, err)
		}
		out = append(out, ch...)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, nil
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

// treeSize is the total size of the regular files at and below p.
func treeSize(p string) int64 {
	var n int64
	filepath.WalkDir(p, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
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
// lower counterpart; visit's filepath.SkipDir skips a directory.
func walkUpper(l *Layer, visit func(e *upperEntry) error) error {
	var opaque []string
	underOpaque := func(rel string) bool {
		for _, o := range opaque {
			if strings.HasPrefix(rel, o+"/") {
				return true
			}
		}
		return false
	}
	return filepath.WalkDir(l.Upper, func(up string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(l.Upper, up)
		if rel == "." {
			return nil
		}
		e := &upperEntry{up: up, rel: rel, real: filepath.Join(l.Lower, rel)}
		if e.ust, err = lstat(up); err != nil {
			return err
		}
		lst, lerr := lstat(e.real)
		if lerr != nil && !errors.Is(lerr, unix.ENOENT) {
			return lerr
		}
		if lerr == nil {
			e.lst = lst
		}
		if isDir(e.ust) && e.lst != nil && isDir(e.lst) && (isOpaque(up) || underOpaque(rel)) {
			e.opaque = true
			opaque = append(opaque, rel)
		}
		return visit(e)
	})
}

func diffLayer(l *Layer) ([]Change, error) {
	var out []Change
	err := walkUpper(l, func(e *upperEntry) error {
		up, real, ust, lst := e.up, e.real, e.ust, e.lst
		inLower := lst != nil
		switch {
		case isWhiteout(ust):
			if inLower {
				out = append(out, Change{Kind: Deleted, Path: real, Dir: isDir(lst), Size: treeSize(real)})
			}
		case isDir(ust):
			switch {
			case !inLower:
				out = append(out, Change{Kind: Added, Path: real, Dir: true, Size: treeSize(up)})
				return filepath.SkipDir
			case !isDir(lst):
				// A directory replaced a file.
				out = append(out, Change{Kind: Changed, Path: real, Dir: true, Size: treeSize(up)})
				return filepath.SkipDir
			case e.opaque:
				// Everything of the lower directory that the upper one
				// does not hold again is gone.
				gone, err := opaqueDeletions(real, up)
				if err != nil {
					return err
				}
				out = append(out, gone...)
			}
		default:
			switch {
			case !inLower:
				out = append(out, Change{Kind: Added, Path: real, Size: ust.Size})
			case isDir(lst):
				out = append(out, Change{Kind: Changed, Path: real, Size: ust.Size})
			default:
				same, err := sameFile(up, ust, real, lst)
				if err != nil {
					return err
				}
				if !same {
					out = append(out, Change{Kind: Changed, Path: real, Size: ust.Size})
				}
			}
		}
		return nil
	})
	return out, err
}

// opaqueDeletions lists the entries of the lower directory lowerDir that
// the opaque upper directory upDir does not hold.
func opaqueDeletions(lowerDir, upDir string) ([]Change, error) {
	ents, err := os.ReadDir(lowerDir)
	if err != nil {
		return nil, err
	}
	var out []Change
	for _, e := range ents {
		p := filepath.Join(lowerDir, e.Name())
		if _, err := lstat(filepath.Join(upDir, e.Name())); err == nil {
			continue // listed (changed or not) when the walk reaches it
		}
		out = append(out, Change{Kind: Deleted, Path: p, Dir: e.IsDir(), Size: treeSize(p)})
	}
	return out, nil
}

// sameFile reports whether a copied-up file equals the real one (a
// copy-up without a change, e.g. after open for writing without a write).
func sameFile(up string, ust *unix.Stat_t, real string, lst *unix.Stat_t) (bool, error) {
	if ust.Mode != lst.Mode || ust.Uid != lst.Uid || ust.Gid != lst.Gid || ust.Size != lst.Size {
		return false, nil
	}
	switch ust.Mode & unix.S_IFMT {
	case unix.S_IFLNK:
		a, err := os.Readlink(up)
		if err != nil {
			return false, err
		}
		b, err := os.Readlink(real)
		return err == nil && a == b, err
	case unix.S_IFREG:
		return sameContent(up, real)
	default:
		return ust.Rdev == lst.Rdev, nil
	}
}

func sameContent(a, b string) (bool, error) {
	fa, err := os.Open(a)
	if err != nil {
		return false, err
	}
	defer fa.Close()
	fb, err := os.Open(b)
	if err != nil {
		return false, err
	}
	defer fb.Close()
	ba, bb := make([]byte, 64<<10), make([]byte, 64<<10)
	for {
		na, ea := io.ReadFull(fa, ba)
		nb, eb := io.ReadFull(fb, bb)
		if na != nb || !bytes.Equal(ba[:na], bb[:nb]) {
			return false, nil
		}
		if ea != nil || eb != nil {
			if (ea == io.EOF || ea == io.ErrUnexpectedEOF) && (eb == io.EOF || eb == io.ErrUnexpectedEOF) {
				return true, nil
			}
			return false, errors.Join(ignoreEOF(ea), ignoreEOF(eb))
		}
	}
}

func ignoreEOF(err error) error {
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		return nil
	}
	return err
}

// UpperSize is the bytes the upper layers hold (what a snapshot costs).
func (w *Workspace) UpperSize() int64 {
	var n int64
	for _, l := range w.Layers {
		n += treeSize(l.Upper)
	}
	return n
}
