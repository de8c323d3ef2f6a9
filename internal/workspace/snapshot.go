package workspace

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"time"
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
// snapshot and the names pruned. The overlays stay mounted: freeze the
// sandbox around it so the copy is consistent.
func (w *Workspace) Snapshot(name string, lim SnapshotLimits) (Snapshot, []string, error) {
	if !snapshotName.MatchString(name) {
		return Snapshot{}, nil, fmt.Errorf("snapshot name %q: use letters, digits, '.', '_' and '-' (at most 63)", name)
	}
	unlock, err := w.lock()
	if err != nil {
		return Snapshot{}, nil, err
	}
	defer unlock()
	size := w.UpperSize()
	if lim.MaxBytes > 0 && size > lim.MaxBytes {
		return Snapshot{}, nil, fmt.Errorf("workspace %s: snapshot %s would cost %d bytes, above the limit of %d (max_snapshot_bytes)", w.Sandbox, name, size, lim.MaxBytes)
	}
	changes, err := w.diffLocked()
	if err != nil {
		return Snapshot{}, nil, err
	}
	final := w.snapDir(name)
	tmp := filepath.Join(w.Dir, "snapshots", ".tmp-"+name)
	os.RemoveAll(tmp)
	var dirs []string
	for _, l := range w.Layers {
		dst := filepath.Join(tmp, l.ID)
		if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
			return Snapshot{}, nil, fmt.Errorf("workspace %s: snapshot: %w", w.Sandbox, err)
		}
		if err := copyTree(l.Upper, dst); err != nil {
			os.RemoveAll(tmp)
			return Snapshot{}, nil, fmt.Errorf("workspace %s: snapshot %s: %w", w.Sandbox, name, err)
		}
		dirs = append(dirs, dst)
	}
	s := Snapshot{Name: name, Created: time.Now().UTC(), Bytes: size, Changes: len(changes)}
	if s.Hash, err = hashDirs(dirs); err != nil {
		os.RemoveAll(tmp)
		return Snapshot{}, nil, err
	}
	meta, _ := json.MarshalIndent(s, "", "  ")
	if err := os.WriteFile(filepath.Join(tmp, "meta.json"), meta, 0o600); err != nil {
		os.RemoveAll(tmp)
		return Snapshot{}, nil, fmt.Errorf("workspace %s: snapshot: %w", w.Sandbox, err)
	}
	os.RemoveAll(final)
	if err := os.Rename(tmp, final); err != nil {
		os.RemoveAll(tmp)
		return Snapshot{}, nil, fmt.Errorf("workspace %s: snapshot: %w", w.Sandbox, err)
	}
	pruned, err := w.pruneLocked(lim, name)
	return s, pruned, err
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
// needs the sandbox's processes stopped.
func (w *Workspace) RollbackTo(name string) (Result, error) {
	unlock, err := w.lock()
	if err != nil {
		return Result{}, err
	}
	defer unlock()
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
	before, err := w.diffLocked()
	if err != nil {
		return Result{}, err
	}
	res := Result{Bytes: w.UpperSize()}
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
		if err := copyTree(filepath.Join(dir, l.ID), l.Upper); err != nil {
			return res, fmt.Errorf("workspace %s: restore snapshot %s: %w", w.Sandbox, name, err)
		}
	}
	after, err := w.diffLocked()
	if err != nil {
		return res, err
	}
	res.Changes = changedBetween(before, after)
	var dirs []string
	for _, l := range w.Layers {
		dirs = append(dirs, filepath.Join(dir, l.ID))
	}
	if res.Hash, err = hashDirs(dirs); err != nil {
		return res, err
	}
	return res, w.mountLocked()
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
// times, whiteouts and overlay xattrs (opaque directories).
func copyTree(src, dst string) error {
	type dirAttr struct {
		path string
		src  string
	}
	var dirs []dirAttr
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		target := filepath.Join(dst, rel)
		st, err := lstat(p)
		if err != nil {
			return err
		}
		if isDir(st) {
			if err := os.Mkdir(target, 0o700); err != nil {
				return err
			}
			dirs = append(dirs, dirAttr{target, p})
		} else if err := copyEntry(p, st, target); err != nil {
			return err
		}
		return copyXattrs(p, target)
	})
	if err != nil {
		return err
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		st, err := lstat(dirs[i].src)
		if err != nil {
			return err
		}
		if err := setAttrs(dirs[i].path, st); err != nil {
			return err
		}
	}
	return nil
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
