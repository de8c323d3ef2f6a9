package workspace

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"time"

	"golang.org/x/sys/unix"
)

// Snapshot describes a saved point of a sandbox's workspaces.
type Snapshot struct {
	// Name is the snapshot's name.
	Name string `json:"name"`
	// Created is when it was taken.
	Created time.Time `json:"created"`
	// Bytes is what it costs: the size of the upper layers it copied.
	Bytes int64 `json:"bytes"`
	// Changes counts the paths that differed from the real directories.
	Changes int `json:"changes"`
	// Hash is the tree hash of the saved layers.
	Hash string `json:"hash"`
}

// SnapshotLimits prune old snapshots. Zero fields mean no limit.
type SnapshotLimits struct {
	// Keep is the most snapshots kept.
	Keep int
	// MaxBytes is the most bytes all snapshots may cost together.
	MaxBytes int64
}

var snapshotName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// ErrNoSnapshot is returned for a snapshot name that does not exist.
var ErrNoSnapshot = errors.New("no such snapshot")

func (w *Workspace) snapDir(name string) string { return filepath.Join(w.Dir, "snapshots", name) }

// Snapshot saves the upper layers under name (replacing a snapshot of the
// same name) and prunes old snapshots to the limits; it returns the
// snapshot and the names pruned. The overlays stay mounted, so the
// sandbox is frozen for the copy: cgroups are its cgroup2 directories
// (FreezeSandbox), frozen within FreezeBound or no snapshot is taken,
// and thawed after. Cancelling ctx stops the copy and leaves no
// snapshot.
func (w *Workspace) Snapshot(ctx context.Context, name string, lim SnapshotLimits, cgroups []string) (Snapshot, []string, error) {
	if !snapshotName.MatchString(name) {
		return Snapshot{}, nil, fmt.Errorf("snapshot name %q: use letters, digits, '.', '_' and '-' (at most 63)", name)
	}
	unlock, err := w.lock()
	if err != nil {
		return Snapshot{}, nil, err
	}
	defer unlock()
	thaw, err := FreezeSandbox(ctx, cgroups, FreezeBound)
	if err != nil {
		return Snapshot{}, nil, fmt.Errorf("workspace %s: snapshot %s: %w", w.Sandbox, name, err)
	}
	s, err := w.snapshotLocked(w.meter(ctx, "snapshot"), name, lim)
	if terr := thaw(); terr != nil {
		err = errors.Join(err, fmt.Errorf("workspace %s: thaw after snapshot: %w", w.Sandbox, terr))
	}
	if err != nil {
		return s, nil, err
	}
	pruned, err := w.pruneLocked(lim, name)
	return s, pruned, err
}

func (w *Workspace) snapshotLocked(m *meter, name string, lim SnapshotLimits) (Snapshot, error) {
	size, err := w.upperSize(m)
	if err != nil {
		return Snapshot{}, w.stopped(m, "snapshot "+name, err)
	}
	if lim.MaxBytes > 0 && size > lim.MaxBytes {
		return Snapshot{}, fmt.Errorf("workspace %s: snapshot %s would cost %d bytes, above the limit of %d (max_snapshot_bytes)", w.Sandbox, name, size, lim.MaxBytes)
	}
	changes := 0
	if err := w.eachChangeLocked(m, func(Change) error { changes++; return nil }); err != nil {
		return Snapshot{}, w.stopped(m, "snapshot "+name, err)
	}
	final := w.snapDir(name)
	tmp := filepath.Join(w.Dir, "snapshots", ".tmp-"+name)
	os.RemoveAll(tmp)
	fail := func(err error) (Snapshot, error) {
		os.RemoveAll(tmp)
		return Snapshot{}, w.stopped(m, "snapshot "+name+" (none taken)", err)
	}
	var dirs []string
	for _, l := range w.Layers {
		dst := filepath.Join(tmp, l.ID)
		if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
			return fail(err)
		}
		if err := copyTree(m, l.Upper, dst); err != nil {
			return fail(err)
		}
		dirs = append(dirs, dst)
	}
	s := Snapshot{Name: name, Created: time.Now().UTC(), Bytes: size, Changes: changes}
	if s.Hash, err = hashDirs(m, dirs); err != nil {
		return fail(err)
	}
	meta, _ := json.MarshalIndent(s, "", "  ")
	if err := os.WriteFile(filepath.Join(tmp, "meta.json"), meta, 0o600); err != nil {
		return fail(err)
	}
	os.RemoveAll(final)
	if err := os.Rename(tmp, final); err != nil {
		return fail(err)
	}
	return s, nil
}

// Snapshots lists the sandbox's snapshots, oldest first.
func (w *Workspace) Snapshots() ([]Snapshot, error) {
	ents, err := os.ReadDir(filepath.Join(w.Dir, "snapshots"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("workspace %s: list snapshots: %w", w.Sandbox, err)
	}
	var out []Snapshot
	for _, e := range ents {
		if !e.IsDir() || !snapshotName.MatchString(e.Name()) {
			continue
		}
		data, err := os.ReadFile(filepath.Join(w.snapDir(e.Name()), "meta.json"))
		if err != nil {
			continue // an unfinished snapshot
		}
		var s Snapshot
		if json.Unmarshal(data, &s) == nil && s.Name == e.Name() {
			out = append(out, s)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out, nil
}

// pruneLocked removes the oldest snapshots beyond the limits, never keep.
func (w *Workspace) pruneLocked(lim SnapshotLimits, keep string) ([]string, error) {
	snaps, err := w.Snapshots()
	if err != nil {
		return nil, err
	}
	var total int64
	for _, s := range snaps {
		total += s.Bytes
	}
	var pruned []string
	for i := 0; i < len(snaps); i++ {
		n := len(snaps) - len(pruned)
		over := (lim.Keep > 0 && n > lim.Keep) || (lim.MaxBytes > 0 && total > lim.MaxBytes)
		if !over {
			break
		}
		if snaps[i].Name == keep {
			continue
		}
		if err := os.RemoveAll(w.snapDir(snaps[i].Name)); err != nil {
			return pruned, fmt.Errorf("workspace %s: prune snapshot %s: %w", w.Sandbox, snaps[i].Name, err)
		}
		total -= snaps[i].Bytes
		pruned = append(pruned, snaps[i].Name)
	}
	return pruned, nil
}

// RollbackTo restores the upper layers saved in snapshot name: the
// workspace looks as it did when the snapshot was taken. Like Rollback it
// needs the sandbox's processes stopped. Cancelling ctx before the
// layers are replaced leaves them as they were; while a layer is copied
// back, the layers not yet restored are empty (the workspace shows the
// real directory there) and the error says which.
func (w *Workspace) RollbackTo(ctx context.Context, name string) (res Result, err error) {
	unlock, err := w.lock()
	if err != nil {
		return Result{}, err
	}
	defer unlock()
	m := w.meter(ctx, "rollback")
	defer func() { res.Progress = m.p }()
	dir := w.snapDir(name)
	if !snapshotName.MatchString(name) {
		return Result{}, fmt.Errorf("workspace %s: snapshot %q: %w", w.Sandbox, name, ErrNoSnapshot)
	}
	if _, err := os.Stat(filepath.Join(dir, "meta.json")); err != nil {
		return Result{}, fmt.Errorf("workspace %s: snapshot %q: %w", w.Sandbox, name, ErrNoSnapshot)
	}
	for _, l := range w.Layers {
		if _, err := os.Stat(filepath.Join(dir, l.ID)); err != nil {
			return Result{}, fmt.Errorf("workspace %s: snapshot %q has no layer for %s (taken with other workspace directories)", w.Sandbox, name, l.Lower)
		}
	}
	before, err := w.listLocked(m)
	if err != nil {
		return Result{}, w.stopped(m, "rollback to "+name+" (nothing changed)", err)
	}
	if res.Bytes, err = w.upperSize(m); err != nil {
		return res, w.stopped(m, "rollback to "+name+" (nothing changed)", err)
	}
	if err := w.unmountLocked(); err != nil {
		return res, err
	}
	for i := range w.Layers {
		l := &w.Layers[i]
		if err := resetUpper(l); err != nil {
			return res, fmt.Errorf("workspace %s: %w", w.Sandbox, err)
		}
		if err := os.Remove(l.Upper); err != nil {
			return res, fmt.Errorf("workspace %s: %w", w.Sandbox, err)
		}
		if err := copyTree(m, filepath.Join(dir, l.ID), l.Upper); err != nil {
			// Leave an empty upper layer rather than a part of the
			// snapshot, and the later layers as they are.
			os.RemoveAll(l.Upper)
			rerr := resetUpper(l)
			if merr := w.mountLocked(); merr != nil {
				rerr = errors.Join(rerr, merr)
			}
			msg := fmt.Sprintf("layers of %d workspace directories restored, %s emptied (shows the real directory), %d left as they were", i, l.Lower, len(w.Layers)-i-1)
			return res, errors.Join(w.stopped(m, "rollback to "+name+": "+msg, err), rerr)
		}
	}
	after, err := w.listLocked(m)
	if err != nil {
		w.mountLocked()
		return res, w.stopped(m, "rollback to "+name+" finished, listing the result", err)
	}
	res.Changes = changedBetween(before.changes, after.changes)
	res.Unlisted = before.unlisted + after.unlisted
	if err := w.mountLocked(); err != nil {
		return res, err
	}
	var dirs []string
	for _, l := range w.Layers {
		dirs = append(dirs, filepath.Join(dir, l.ID))
	}
	if res.Hash, err = hashDirs(m, dirs); err != nil {
		return res, w.stopped(m, "rollback to "+name+" finished, hashing the result", err)
	}
	res.Done = true
	return res, nil
}

// changedBetween lists the paths whose change differs between two diffs
// (what restoring a snapshot touched), with their state after.
func changedBetween(before, after []Change) []Change {
	b := map[string]Change{}
	for _, c := range before {
		b[c.Path] = c
	}
	var out []Change
	seen := map[string]bool{}
	for _, c := range after {
		seen[c.Path] = true
		if o, ok := b[c.Path]; !ok || o != c {
			out = append(out, c)
		}
	}
	for _, c := range before {
		if !seen[c.Path] {
			// Back to the real directory's state.
			out = append(out, Change{Kind: Changed, Path: c.Path, Dir: c.Dir})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

// copyTree copies src to dst (which must not exist) with owners, modes,
// times, whiteouts and overlay xattrs (opaque directories); sparse files
// stay sparse. A directory gets its attributes once its subtree is copied.
func copyTree(m *meter, src, dst string) error {
	st, err := lstat(src)
	if err != nil {
		return err
	}
	if err := os.Mkdir(dst, 0o700); err != nil {
		return err
	}
	if err := copyXattrs(src, dst); err != nil {
		return err
	}
	err = walkTree(m, src, false, func(rel string, st *unix.Stat_t, _ bool) (bool, bool, error) {
		p, target := filepath.Join(src, rel), filepath.Join(dst, rel)
		if isDir(st) {
			if err := os.Mkdir(target, 0o700); err != nil {
				return false, false, err
			}
		} else if err := copyEntry(m, p, st, target); err != nil {
			return false, false, err
		}
		return true, false, copyXattrs(p, target)
	}, func(rel string) error {
		st, err := lstat(filepath.Join(src, rel))
		if err != nil {
			return err
		}
		return setAttrs(filepath.Join(dst, rel), st)
	})
	if err != nil {
		return err
	}
	return setAttrs(dst, st)
}

func copyXattrs(src, dst string) error {
	for _, name := range listXattrs(src) {
		sz, err := lgetxattr(src, name)
		if err != nil {
			continue
		}
		if err := lsetxattr(dst, name, sz); err != nil {
			return fmt.Errorf("copy xattr %s to %s: %w", name, dst, err)
		}
	}
	return nil
}
