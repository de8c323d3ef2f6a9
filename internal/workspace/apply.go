package workspace

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// Result is what a commit, rollback or snapshot did.
type Result struct {
	// Changes are the paths it applied or threw away (the first
	// MaxListedChanges, sorted by path).
	Changes []Change `json:"changes"`
	// Unlisted counts the changes beyond MaxListedChanges.
	Unlisted int `json:"unlisted,omitempty"`
	// ListError says why the changes a rollback threw away could not all
	// be listed (a path beyond PATH_MAX, say); the rollback went on.
	ListError string `json:"list_error,omitempty"`
	// Hash is the tree hash (TreeHash) of the result: the real
	// directories after a commit or rollback, the saved layers of a
	// snapshot. With several workspace directories it hashes their hashes
	// in order. Empty when the operation stopped before hashing.
	Hash string `json:"hash"`
	// Bytes is the size of the upper layers it applied, threw away or
	// saved.
	Bytes int64 `json:"bytes"`
	// Applied counts the upper-layer entries a commit carried into the
	// real directories (applied, refused or withheld in part). When a
	// commit stops early, these are done and the rest are still in the
	// upper layers: what the overlay shows is unchanged, and commit can
	// be run again to finish.
	Applied int64 `json:"applied"`
	// Done is true when the operation finished, hash included.
	Done bool `json:"done"`
	// Progress is the work it did.
	Progress Progress `json:"progress"`
	// Withheld is what a commit did not carry into the real directories
	// as the sandbox left it: special files refused, setuid and setgid
	// bits and privileged extended attributes stripped, owners replaced
	// (see Note).
	Withheld []Note `json:"withheld,omitempty"`
}

// Commit merges every layer's changes into its real directory and empties
// the upper layers. It never carries privilege: special files, setuid and
// setgid bits, privileged extended attributes and owners the real
// directory would not give are withheld, and listed in Result.Withheld.
// The sandbox's processes must be stopped: the overlays are unmounted
// first (EBUSY while in use) and mounted again after.
//
// Cancelling ctx stops it between entries. Before the first entry is
// applied nothing has changed; after, Result.Applied says how many
// upper entries are in the real directories (each whole: files land by
// rename, directories that were created get their final owner and mode),
// the rest stay in the upper layers, the overlays are mounted again and
// the error says so. Commit can be run again to finish: what was applied
// is gone from the upper layer or equal to the real file.
func (w *Workspace) Commit(ctx context.Context) (res Result, err error) {
	unlock, err := w.lock()
	if err != nil {
		return Result{}, err
	}
	defer unlock()
	m := w.meter(ctx, "commit")
	defer func() { res.Progress = m.p }()
	list, err := w.listLocked(m)
	if err != nil {
		return Result{}, w.stopped(m, "commit (nothing applied)", err)
	}
	res = Result{Changes: list.changes, Unlisted: list.unlisted}
	if res.Bytes, err = w.upperSize(m); err != nil {
		return res, w.stopped(m, "commit (nothing applied)", err)
	}
	if err := w.unmountLocked(); err != nil {
		return res, err
	}
	for i := range w.Layers {
		l := &w.Layers[i]
		applied, notes, err := applyLayer(m, l)
		res.Applied += applied
		res.Withheld = append(res.Withheld, notes...)
		if err != nil {
			left := fmt.Sprintf("%d upper-layer entries applied to the real directories, the rest of %s", res.Applied, l.Lower)
			if i+1 < len(w.Layers) {
				left += fmt.Sprintf(" and %d more workspace directories", len(w.Layers)-i-1)
			}
			left += " left in the upper layer; run commit again to finish"
			if merr := w.mountLocked(); merr != nil {
				left += fmt.Sprintf("; remounting the overlay failed: %v", merr)
			}
			if m.ctx.Err() != nil && errors.Is(err, m.ctx.Err()) {
				return res, fmt.Errorf("workspace %s: commit interrupted after %s: %s: %w", w.Sandbox, m.p, left, err)
			}
			return res, fmt.Errorf("workspace %s: commit into %s: %w (%s)", w.Sandbox, l.Lower, err, left)
		}
		if err := resetUpper(l); err != nil {
			return res, fmt.Errorf("workspace %s: %w", w.Sandbox, err)
		}
	}
	if err := w.mountLocked(); err != nil {
		return res, err
	}
	if res.Hash, err = w.lowerHash(m); err != nil {
		return res, w.stopped(m, "commit finished, hashing the result", err)
	}
	res.Done = true
	return res, nil
}

// Rollback throws every layer's changes away. Like Commit it needs the
// sandbox's processes stopped. A listing of the changes that fails (a
// tree too deep for PATH_MAX) does not stop it: Result.ListError says
// so. Cancelling ctx while the changes are listed stops it with nothing
// thrown away; the removal itself reads no file data and is not
// cancelled; hashing the result after is.
func (w *Workspace) Rollback(ctx context.Context) (res Result, err error) {
	unlock, err := w.lock()
	if err != nil {
		return Result{}, err
	}
	defer unlock()
	m := w.meter(ctx, "rollback")
	defer func() { res.Progress = m.p }()
	list, err := w.listLocked(m)
	if m.ctx.Err() != nil {
		return Result{}, w.stopped(m, "rollback (nothing thrown away)", err)
	}
	res = Result{Changes: list.changes, Unlisted: list.unlisted}
	if err != nil {
		res.ListError = err.Error()
	} else {
		res.Bytes, _ = w.upperSize(m)
	}
	if err := w.unmountLocked(); err != nil {
		return res, err
	}
	for i := range w.Layers {
		if err := resetUpper(&w.Layers[i]); err != nil {
			return res, fmt.Errorf("workspace %s: rollback: %w", w.Sandbox, err)
		}
	}
	if err := w.mountLocked(); err != nil {
		return res, err
	}
	if res.Hash, err = w.lowerHash(m); err != nil {
		return res, w.stopped(m, "rollback finished, hashing the result", err)
	}
	res.Done = true
	return res, nil
}

func (w *Workspace) lowerHash(m *meter) (string, error) {
	var dirs []string
	for _, l := range w.Layers {
		dirs = append(dirs, l.Lower)
	}
	return hashDirs(m, dirs)
}

// applyLayer moves the upper layer's changes into the real directory and
// returns how many entries it applied and what it did not carry (see
// Withheld).
func applyLayer(m *meter, l *Layer) (int64, []Note, error) {
	root, err := unix.Open(l.Lower, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, nil, fmt.Errorf("open %s: %w", l.Lower, err)
	}
	defer unix.Close(root)
	var rst unix.Stat_t
	if err := unix.Fstat(root, &rst); err != nil {
		return 0, nil, fmt.Errorf("stat %s: %w", l.Lower, err)
	}
	c := &committer{m: m, l: l, root: root, rootOwner: owner{rst.Uid, rst.Gid}, dirs: map[string]*dirFix{".": {own: owner{rst.Uid, rst.Gid}}}}
	if ust, err := lstat(l.Upper); err == nil {
		c.sameDev = ust.Dev == rst.Dev
	}
	// Directory attributes are set when the walk leaves the directory
	// (its children change its mtime), also when it stops early.
	err = walkUpper(m, l, c.entry, c.leave)
	return c.applied, c.notes, err
}

// What commit carries into the real directory, and what it withholds:
//
//   - Regular files, directories and symlinks are carried. Device nodes,
//     FIFOs and sockets are refused: a device node is access to hardware
//     or kernel memory, a FIFO in a project hangs whatever reads the tree,
//     and a socket file is a dead end once the sandbox stopped. The real
//     directory keeps what it had at that path.
//   - Files lose setuid and setgid (setgid without group execute, the old
//     mandatory-locking mark, too). The sticky bit, which Linux ignores on
//     files, stays. Directories keep their mode: Linux ignores setuid on a
//     directory, setgid only makes new entries inherit the directory's
//     group (which commit chose, below), sticky restricts deletion.
//   - Extended attributes: user.* and POSIX ACLs (system.posix_acl_*,
//     long-form permission bits) are carried; every other one is dropped:
//     security.capability (file capabilities), other security.* (LSM
//     labels, which decide the domain an executable runs in; integrity
//     signatures) and trusted.* (overlayfs' own, trusted.overlay.*, go
//     silently: bookkeeping, not the sandbox's).
//   - Owners: an entry keeps the owner the sandbox left only when it is
//     one the real tree already gives there: the owner of the entry it
//     replaces, of the directory it lands in, or of the workspace root
//     (and likewise for the group). Otherwise it gets the replaced
//     entry's owner, or for a new entry the landing directory's. A
//     sandbox running as root, or chowning to another user, gets its
//     files owned by the workspace's user; an edit of a file keeps its
//     owner, as editing does.
//
// Every refusal, stripped bit or attribute and replaced owner is a Note.

// NoteAction says what commit did with something it would not carry.
type NoteAction string

// Note actions.
const (
	// Refused: the entry was not created; the real directory keeps what
	// it had at the path.
	Refused NoteAction = "refused"
	// Stripped: a mode bit or extended attribute was removed.
	Stripped NoteAction = "stripped"
	// Reowned: the owner or group the sandbox set was replaced.
	Reowned NoteAction = "owner"
)

// Note is one thing a commit did not carry into the real directory as
// the sandbox left it.
type Note struct {
	Action NoteAction `json:"action"`
	// Path is the absolute path in the real directory.
	Path string `json:"path"`
	// What says what and why: "setuid bit", "xattr security.capability",
	// "character device 1:3", "owner 0:0, given 1000:1000". It can hold
	// an attribute name the sandbox chose.
	What string `json:"what"`
}

type owner struct{ uid, gid uint32 }

func (o owner) String() string { return fmt.Sprintf("%d:%d", o.uid, o.gid) }

// dirFix is a directory whose attributes commit sets when the walk
// leaves it.
type dirFix struct {
	rel, up string
	ust     *unix.Stat_t
	own     owner
	isNew   bool
}

// committer applies one layer.
type committer struct {
	m         *meter
	l         *Layer
	root      int // the real directory
	rootOwner owner
	sameDev   bool
	// dirs are the directories the walk has entered and not left, by
	// relative path, with the owner their real directory has (or will
	// have once fixDir ran).
	dirs    map[string]*dirFix
	applied int64
	notes   []Note
}

// leave sets the directory's final attributes once its subtree is done.
func (c *committer) leave(rel string) error {
	d := c.dirs[rel]
	delete(c.dirs, rel)
	if d == nil {
		return nil
	}
	return c.fixDir(d)
}

// commitHook, when set (tests), runs before each upper entry is applied.
var commitHook func(rel string)

func (c *committer) note(a NoteAction, rel, what string) {
	c.notes = append(c.notes, Note{Action: a, Path: filepath.Join(c.l.Lower, rel), What: what})
}

// openParent opens the real directory that holds rel.
func (c *committer) openParent(rel string) (int, error) {
	return openBeneath(c.root, filepath.Dir(rel))
}

func (c *committer) entry(e *upperEntry) error {
	if commitHook != nil {
		commitHook(e.rel)
	}
	if err := c.m.ctx.Err(); err != nil {
		return err
	}
	c.applied++
	ust, lst := e.ust, e.lst
	inLower := lst != nil
	name := filepath.Base(e.rel)
	switch {
	case isWhiteout(ust):
		pfd, err := c.openParent(e.rel)
		if errors.Is(err, unix.ENOENT) {
			return nil // its directory is gone already
		}
		if err != nil {
			return err
		}
		defer unix.Close(pfd)
		return removeAllAt(pfd, name)
	case isDir(ust):
		pfd, err := c.openParent(e.rel)
		if err != nil {
			return err
		}
		defer unix.Close(pfd)
		if inLower && !isDir(lst) {
			if err := unix.Unlinkat(pfd, name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("remove %s: %w", e.real, err)
			}
		}
		if e.opaque {
			if err := c.clearOpaque(pfd, name, e); err != nil {
				return err
			}
		}
		isNew := !inLower || !isDir(lst)
		if isNew {
			// Root's and private until fixDir: nobody else gets into it
			// while it fills.
			if err := unix.Mkdirat(pfd, name, 0o700); err != nil {
				return fmt.Errorf("mkdir %s: %w", e.real, err)
			}
		}
		c.dirs[e.rel] = &dirFix{rel: e.rel, up: e.up, ust: ust, own: c.owner(e), isNew: isNew}
		return nil
	}
	switch ust.Mode & unix.S_IFMT {
	case unix.S_IFREG, unix.S_IFLNK:
	default:
		c.note(Refused, e.rel, specialName(ust))
		return nil
	}
	if inLower && !isDir(lst) {
		same, err := c.unchanged(e)
		if err != nil {
			return err
		}
		if same {
			// A copy-up without a change (opened for writing, say): the
			// real file is left as it is, bits and capabilities included.
			return nil
		}
	}
	pfd, err := c.openParent(e.rel)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	if inLower && isDir(lst) {
		if err := removeAllAt(pfd, name); err != nil {
			return fmt.Errorf("replace %s: %w", e.real, err)
		}
	}
	return c.install(e, pfd, name, c.owner(e))
}

// clearOpaque removes the entries of the real directory name (in pfd)
// that the opaque upper directory of e does not hold again.
func (c *committer) clearOpaque(pfd int, name string, e *upperEntry) error {
	dfd, err := unix.Openat(pfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w: %w", e.real, errMoved, err)
	}
	defer unix.Close(dfd)
	names, err := readNames(dfd)
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := c.m.entry(); err != nil {
			return err
		}
		if _, err := lstat(filepath.Join(e.up, n)); err != nil {
			if err := removeAllAt(dfd, n); err != nil {
				return err
			}
		}
	}
	return nil
}

// owner decides the owner of an entry (see "What commit carries") and
// says when it is not the one the sandbox left.
func (c *committer) owner(e *upperEntry) owner {
	landing := c.rootOwner
	if d := c.dirs[filepath.Dir(e.rel)]; d != nil {
		landing = d.own
	}
	uids := []uint32{landing.uid, c.rootOwner.uid}
	gids := []uint32{landing.gid, c.rootOwner.gid}
	give := landing
	if e.lst != nil {
		uids = append(uids, e.lst.Uid)
		gids = append(gids, e.lst.Gid)
		give = owner{e.lst.Uid, e.lst.Gid}
	}
	left := owner{e.ust.Uid, e.ust.Gid}
	got := left
	if !slices.Contains(uids, left.uid) {
		got.uid = give.uid
	}
	if !slices.Contains(gids, left.gid) {
		got.gid = give.gid
	}
	if got != left {
		c.note(Reowned, e.rel, fmt.Sprintf("owner %s, given %s", left, got))
	}
	return got
}

// unchanged reports an upper file that equals the real one, carried
// extended attributes included.
func (c *committer) unchanged(e *upperEntry) (bool, error) {
	same, err := sameFile(c.m, e.up, e.ust, e.real, e.lst)
	if err != nil || !same {
		return false, err
	}
	a, b := carriedXattrs(e.up), carriedXattrs(e.real)
	if len(a) != len(b) {
		return false, nil
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || !bytes.Equal(v, w) {
			return false, nil
		}
	}
	return true, nil
}

// specialName describes an entry commit refuses.
func specialName(st *unix.Stat_t) string {
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFCHR:
		return fmt.Sprintf("character device %d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))
	case unix.S_IFBLK:
		return fmt.Sprintf("block device %d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))
	case unix.S_IFIFO:
		return "fifo"
	case unix.S_IFSOCK:
		return "socket"
	}
	return fmt.Sprintf("file of type %#o", st.Mode&unix.S_IFMT)
}

// isCarriedXattr: user.* and POSIX ACLs.
func isCarriedXattr(name string) bool {
	return strings.HasPrefix(name, "user.") || name == "system.posix_acl_access" || name == "system.posix_acl_default"
}

// isBookkeepingXattr: overlayfs' own, dropped without a note.
func isBookkeepingXattr(name string) bool { return strings.HasPrefix(name, "trusted.overlay.") }

func carriedXattrs(p string) map[string][]byte {
	out := map[string][]byte{}
	for _, n := range listXattrs(p) {
		if isCarriedXattr(n) {
			if v, err := lgetxattr(p, n); err == nil {
				out[n] = v
			}
		}
	}
	return out
}

// sortXattrs splits the extended attributes of the upper entry up into
// those carried and those dropped, noting the dropped ones.
func (c *committer) sortXattrs(rel, up string) (keep, drop []string) {
	for _, n := range listXattrs(up) {
		switch {
		case isCarriedXattr(n):
			keep = append(keep, n)
		case isBookkeepingXattr(n):
			drop = append(drop, n)
		default:
			drop = append(drop, n)
			c.note(Stripped, rel, "xattr "+n)
		}
	}
	return keep, drop
}

// fileMode is the mode a committed regular file gets, noting the bits
// stripped.
func (c *committer) fileMode(rel string, st *unix.Stat_t) uint32 {
	mode := st.Mode & 0o7777
	if mode&unix.S_ISUID != 0 {
		c.note(Stripped, rel, "setuid bit")
	}
	if mode&unix.S_ISGID != 0 {
		c.note(Stripped, rel, "setgid bit")
	}
	return mode &^ (unix.S_ISUID | unix.S_ISGID)
}

// install puts the upper entry (a regular file or symlink) at name in the
// real directory pfd, atomically, with what commit carries of its
// attributes. Nothing of what it withholds is ever visible in the real
// directory: a file moved from the upper layer is made safe there first,
// a copy is made under a temporary name, made safe, then renamed.
func (c *committer) install(e *upperEntry, pfd int, name string, own owner) error {
	keep, drop := c.sortXattrs(e.rel, e.up)
	if e.ust.Mode&unix.S_IFMT == unix.S_IFLNK {
		return c.installSymlink(e, pfd, name, own)
	}
	mode := c.fileMode(e.rel, e.ust)
	if c.sameDev {
		// The upper layer is root's (the state directory): fix the file
		// there, then move it.
		for _, n := range drop {
			if err := unix.Lremovexattr(e.up, n); err != nil && !errors.Is(err, unix.ENODATA) {
				return fmt.Errorf("remove %s from %s: %w", n, e.up, err)
			}
		}
		// chown before chmod: chown clears setuid and setgid itself.
		if err := unix.Lchown(e.up, int(own.uid), int(own.gid)); err != nil {
			return fmt.Errorf("chown %s: %w", e.up, err)
		}
		if err := unix.Fchmodat(unix.AT_FDCWD, e.up, mode, 0); err != nil {
			return fmt.Errorf("chmod %s: %w", e.up, err)
		}
		if err := unix.Renameat(unix.AT_FDCWD, e.up, pfd, name); err != nil {
			return fmt.Errorf("move %s to %s: %w", e.up, e.real, err)
		}
		return nil
	}
	in, err := openRegular(e.up)
	if err != nil {
		return err
	}
	defer unix.Close(in)
	tmp, fd, err := createTemp(pfd)
	if err != nil {
		return fmt.Errorf("create in %s: %w", filepath.Dir(e.real), err)
	}
	out := os.NewFile(uintptr(fd), filepath.Join(filepath.Dir(e.real), tmp))
	err = func() error {
		if unix.IoctlFileClone(fd, in) != nil {
			if err := copyData(c.m, in, fd, e.ust.Size); err != nil {
				return fmt.Errorf("copy %s: %w", e.up, err)
			}
		}
		for _, n := range keep {
			v, err := lgetxattr(e.up, n)
			if err != nil {
				continue
			}
			if err := unix.Fsetxattr(fd, n, v, 0); err != nil {
				return fmt.Errorf("set %s on %s: %w", n, e.real, err)
			}
		}
		if err := unix.Fchown(fd, int(own.uid), int(own.gid)); err != nil {
			return fmt.Errorf("chown %s: %w", e.real, err)
		}
		if err := unix.Fchmod(fd, mode); err != nil {
			return fmt.Errorf("chmod %s: %w", e.real, err)
		}
		if err := setTimesFd(fd, e.ust); err != nil {
			return fmt.Errorf("set times of %s: %w", e.real, err)
		}
		return nil
	}()
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		if err = unix.Renameat(pfd, tmp, pfd, name); err != nil {
			err = fmt.Errorf("rename into %s: %w", e.real, err)
		}
	}
	if err != nil {
		unix.Unlinkat(pfd, tmp, 0)
	}
	return err
}

func (c *committer) installSymlink(e *upperEntry, pfd int, name string, own owner) error {
	target, err := readlink(e.up)
	if err != nil {
		return err
	}
	var tmp string
	for {
		tmp = tempName()
		err = unix.Symlinkat(target, pfd, tmp)
		if !errors.Is(err, unix.EEXIST) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("symlink %s: %w", e.real, err)
	}
	err = unix.Fchownat(pfd, tmp, int(own.uid), int(own.gid), unix.AT_SYMLINK_NOFOLLOW)
	if err == nil {
		err = unix.UtimesNanoAt(pfd, tmp, []unix.Timespec{e.ust.Atim, e.ust.Mtim}, unix.AT_SYMLINK_NOFOLLOW)
	}
	if err == nil {
		err = unix.Renameat(pfd, tmp, pfd, name)
	}
	if err != nil {
		unix.Unlinkat(pfd, tmp, 0)
		return fmt.Errorf("symlink %s: %w", e.real, err)
	}
	return nil
}

// createTemp creates a new empty file under a temporary name in pfd.
func createTemp(pfd int) (string, int, error) {
	for {
		name := tempName()
		fd, err := unix.Openat(pfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if errors.Is(err, unix.EEXIST) {
			continue
		}
		return name, fd, err
	}
}

// fixDir gives a real directory its owner, mode and times (and, when
// commit made it, the carried extended attributes of the upper one).
func (c *committer) fixDir(d *dirFix) error {
	real := filepath.Join(c.l.Lower, d.rel)
	fd, err := openBeneath(c.root, d.rel)
	if err != nil {
		return fmt.Errorf("open %s: %w", real, err)
	}
	defer unix.Close(fd)
	if d.isNew {
		keep, _ := c.sortXattrs(d.rel, d.up)
		for _, n := range keep {
			v, err := lgetxattr(d.up, n)
			if err != nil {
				continue
			}
			if err := unix.Fsetxattr(fd, n, v, 0); err != nil {
				return fmt.Errorf("set %s on %s: %w", n, real, err)
			}
		}
	}
	if err := unix.Fchown(fd, int(d.own.uid), int(d.own.gid)); err != nil {
		return fmt.Errorf("chown %s: %w", real, err)
	}
	if err := unix.Fchmod(fd, d.ust.Mode&0o7777); err != nil {
		return fmt.Errorf("chmod %s: %w", real, err)
	}
	if err := setTimesFd(fd, d.ust); err != nil {
		return fmt.Errorf("set times of %s: %w", real, err)
	}
	return nil
}

// copyEntry copies one non-directory entry with its attributes
// (whiteouts stay whiteouts).
func copyEntry(m *meter, src string, st *unix.Stat_t, dst string) error {
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		if err := copyFile(m, src, dst); err != nil {
			return err
		}
	case unix.S_IFLNK:
		target, err := readlink(src)
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
// can, else copying the data extents and recreating the holes.
func copyFile(m *meter, src, dst string) error {
	in, err := openRegular(src)
	if err != nil {
		return err
	}
	defer unix.Close(in)
	var st unix.Stat_t
	if err := unix.Fstat(in, &st); err != nil {
		return err
	}
	out, err := unix.Open(dst, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("create %s: %w", dst, err)
	}
	if unix.IoctlFileClone(out, in) != nil {
		if err := copyData(m, in, out, st.Size); err != nil {
			unix.Close(out)
			return fmt.Errorf("copy %s: %w", src, err)
		}
	}
	return unix.Close(out)
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
