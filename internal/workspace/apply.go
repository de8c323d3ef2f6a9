package workspace

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Result is what a commit, rollback or snapshot did.
type Result struct {
	// Changes are the paths it applied or threw away.
	Changes []Change `json:"changes"`
	// Hash is the tree hash (TreeHash) of the result: the real
	// directories after a commit or rollback, the saved layers of a
	// snapshot. With several workspace directories it hashes their hashes
	// in order.
	Hash string `json:"hash"`
	// Bytes is the size of the upper layers it applied, threw away or
	// saved.
	Bytes int64 `json:"bytes"`
}

// Commit merges every layer's changes into its real directory and empties
// the upper layers. The sandbox's processes must be stopped: the overlays
// are unmounted first (EBUSY while in use) and mounted again after. An
// interrupted commit can be run again: what was applied is gone from the
// upper layer.
func (w *Workspace) Commit() (Result, error) {
	unlock, err := w.lock()
	if err != nil {
		return Result{}, err
	}
	defer unlock()
	changes, err := w.diffLocked()
	if err != nil {
		return Result{}, err
	}
	res := Result{Changes: changes, Bytes: w.UpperSize()}
	if err := w.unmountLocked(); err != nil {
		return res, err
	}
	for i := range w.Layers {
		l := &w.Layers[i]
		if err := applyLayer(l); err != nil {
			return res, fmt.Errorf("workspace %s: commit into %s: %w (run commit again to finish)", w.Sandbox, l.Lower, err)
		}
		if err := resetUpper(l); err != nil {
			return res, fmt.Errorf("workspace %s: %w", w.Sandbox, err)
		}
	}
	if res.Hash, err = w.lowerHash(); err != nil {
		return res, err
	}
	return res, w.mountLocked()
}

// Rollback throws every layer's changes away. Like Commit it needs the
// sandbox's processes stopped.
func (w *Workspace) Rollback() (Result, error) {
	unlock, err := w.lock()
	if err != nil {
		return Result{}, err
	}
	defer unlock()
	changes, err := w.diffLocked()
	if err != nil {
		return Result{}, err
	}
	res := Result{Changes: changes, Bytes: w.UpperSize()}
	if err := w.unmountLocked(); err != nil {
		return res, err
	}
	for i := range w.Layers {
		if err := resetUpper(&w.Layers[i]); err != nil {
			return res, fmt.Errorf("workspace %s: rollback: %w", w.Sandbox, err)
		}
	}
	if res.Hash, err = w.lowerHash(); err != nil {
		return res, err
	}
	return res, w.mountLocked()
}

func (w *Workspace) lowerHash() (string, error) {
	var dirs []string
	for _, l := range w.Layers {
		dirs = append(dirs, l.Lower)
	}
	return hashDirs(dirs)
}

// applyLayer moves the upper layer's changes into the real directory.
func applyLayer(l *Layer) error {
	sameDev := false
	if a, err := lstat(l.Upper); err == nil {
		if b, err := lstat(l.Lower); err == nil {
			sameDev = a.Dev == b.Dev
		}
	}
	type dirAttr struct {
		path string
		st   *unix.Stat_t
	}
	var dirs []dirAttr
	err := walkUpper(l, func(e *upperEntry) error {
		up, real, ust, lst := e.up, e.real, e.ust, e.lst
		inLower := lst != nil
		switch {
		case isWhiteout(ust):
			return os.RemoveAll(real)
		case isDir(ust):
			if inLower && !isDir(lst) {
				if err := os.Remove(real); err != nil {
					return err
				}
				inLower = false
			}
			if e.opaque {
				ents, err := os.ReadDir(real)
				if err != nil {
					return err
				}
				for _, e := range ents {
					if _, err := lstat(filepath.Join(up, e.Name())); err != nil {
						if err := os.RemoveAll(filepath.Join(real, e.Name())); err != nil {
							return err
						}
					}
				}
			}
			if !inLower {
				if err := unix.Mkdir(real, 0o700); err != nil {
					return fmt.Errorf("mkdir %s: %w", real, err)
				}
			}
			dirs = append(dirs, dirAttr{real, ust})
			return nil
		default:
			if inLower && isDir(lst) {
				if err := os.RemoveAll(real); err != nil {
					return err
				}
			}
			return install(up, ust, real, sameDev)
		}
	})
	if err != nil {
		return err
	}
	// Directory attributes last (children change their mtimes), deepest
	// first.
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := setAttrs(dirs[i].path, dirs[i].st); err != nil {
			return err
		}
	}
	return nil
}

// install puts the upper entry at real, atomically (a temporary name in
// the same directory, then rename).
func install(up string, st *unix.Stat_t, real string, sameDev bool) error {
	if st.Mode&unix.S_IFMT == unix.S_IFREG && sameDev {
		if err := os.Rename(up, real); err != nil {
			return err
		}
		return stripOverlayXattrs(real)
	}
	tmp := filepath.Join(filepath.Dir(real), ".watcher-commit-"+filepath.Base(real))
	os.Remove(tmp)
	if err := copyEntry(up, st, tmp); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, real); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// copyEntry copies one non-directory entry with its attributes
// (whiteouts stay whiteouts).
func copyEntry(src string, st *unix.Stat_t, dst string) error {
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		if err := copyFile(src, dst); err != nil {
			return err
		}
	case unix.S_IFLNK:
		target, err := os.Readlink(src)
		if err != nil {
			return err
		}
		if err := os.Symlink(target, dst); err != nil {
			return err
		}
	default:
		if err := unix.Mknod(dst, st.Mode, int(st.Rdev)); err != nil {
			return fmt.Errorf("mknod %s: %w", dst, err)
		}
	}
	return setAttrs(dst, st)
}

// copyFile copies contents, sharing extents (FICLONE) where the filesystem
// can.
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if unix.IoctlFileClone(int(out.Fd()), int(in.Fd())) != nil {
		if _, err := io.Copy(out, in); err != nil {
			out.Close()
			return fmt.Errorf("copy %s: %w", src, err)
		}
	}
	return out.Close()
}

// setAttrs gives p the owner, mode and times of st (symlinks: owner and
// times only).
func setAttrs(p string, st *unix.Stat_t) error {
	if err := unix.Lchown(p, int(st.Uid), int(st.Gid)); err != nil {
		return fmt.Errorf("chown %s: %w", p, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFLNK {
		if err := unix.Chmod(p, st.Mode&0o7777); err != nil {
			return fmt.Errorf("chmod %s: %w", p, err)
		}
	}
	ts := []unix.Timespec{st.Atim, st.Mtim}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("set times of %s: %w", p, err)
	}
	return nil
}

// stripOverlayXattrs removes overlayfs's bookkeeping (origin, ...) from a
// file moved out of the upper layer.
func stripOverlayXattrs(p string) error {
	for _, name := range listXattrs(p) {
		if strings.HasPrefix(name, "trusted.overlay.") {
			if err := unix.Lremovexattr(p, name); err != nil && !errors.Is(err, unix.ENODATA) {
				return fmt.Errorf("remove %s from %s: %w", name, p, err)
			}
		}
	}
	return nil
}

func listXattrs(p string) []string {
	sz, err := unix.Llistxattr(p, nil)
	if err != nil || sz <= 0 {
		return nil
	}
	buf := make([]byte, sz)
	sz, err = unix.Llistxattr(p, buf)
	if err != nil {
		return nil
	}
	var out []string
	for _, n := range strings.Split(string(buf[:sz]), "\x00") {
		if n != "" {
			out = append(out, n)
		}
	}
	return out
}

func lgetxattr(p, name string) ([]byte, error) {
	sz, err := unix.Lgetxattr(p, name, nil)
	if err != nil {
		return nil, err
	}
	buf := make([]byte, sz)
	sz, err = unix.Lgetxattr(p, name, buf)
	if err != nil {
		return nil, err
	}
	return buf[:sz], nil
}

func lsetxattr(p, name string, v []byte) error { return unix.Lsetxattr(p, name, v, 0) }
