package workspace

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("overlay mounts need root")
	}
}

func write(t *testing.T, p, s string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func hashOf(t *testing.T, dir string) string {
	t.Helper()
	h, err := TreeHash(dir)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// mount mounts the overlays, skipping where the kernel has no overlayfs
// (a module not loaded, as in the qemu guest's initramfs).
func mount(t *testing.T, w *Workspace) {
	t.Helper()
	if err := w.Mount(); err != nil {
		if errors.Is(err, unix.ENODEV) {
			t.Skipf("overlayfs not available in this kernel: %v", err)
		}
		t.Fatal(err)
	}
}

// fixture is a real directory with files and an opened, mounted overlay
// workspace over it.
func fixture(t *testing.T) (real string, w *Workspace) {
	needRoot(t)
	base := t.TempDir()
	real = filepath.Join(base, "real")
	write(t, filepath.Join(real, "keep.txt"), "keep\n")
	write(t, filepath.Join(real, "edit.txt"), "old\n")
	write(t, filepath.Join(real, "gone.txt"), "bye\n")
	write(t, filepath.Join(real, "sub", "a.txt"), "a\n")
	write(t, filepath.Join(real, "sub", "b.txt"), "b\n")
	write(t, filepath.Join(real, "tree", "x", "y.txt"), "y\n")
	w, err := Open(filepath.Join(base, "state"), "sb", []string{real})
	if err != nil {
		t.Fatal(err)
	}
	mount(t, w)
	t.Cleanup(func() { unix.Unmount(w.Layers[0].Merged, unix.MNT_DETACH) })
	return real, w
}

// change makes the same edits a sandboxed run would, through the overlay.
func change(t *testing.T, merged string) {
	t.Helper()
	write(t, filepath.Join(merged, "new.txt"), "hello world\n")
	write(t, filepath.Join(merged, "newdir", "n.txt"), "nn\n")
	write(t, filepath.Join(merged, "edit.txt"), "new content\n")
	if err := os.Remove(filepath.Join(merged, "gone.txt")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(merged, "tree")); err != nil {
		t.Fatal(err)
	}
	// A directory removed and made again is opaque: its old entries go.
	if err := os.RemoveAll(filepath.Join(merged, "sub")); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(merged, "sub", "a.txt"), "a\n")
	// Opened for writing without a change: copied up, not a change.
	f, err := os.OpenFile(filepath.Join(merged, "keep.txt"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
}

func wantChanges(real string) []Change {
	return []Change{
		{Kind: Changed, Path: filepath.Join(real, "edit.txt"), Size: 12},
		{Kind: Deleted, Path: filepath.Join(real, "gone.txt"), Size: 4},
		{Kind: Added, Path: filepath.Join(real, "new.txt"), Size: 12},
		{Kind: Added, Path: filepath.Join(real, "newdir"), Dir: true, Size: 3},
		{Kind: Deleted, Path: filepath.Join(real, "sub", "b.txt"), Size: 2},
		{Kind: Deleted, Path: filepath.Join(real, "tree"), Dir: true, Size: 2},
	}
}

func TestDiffListsExactlyTheChangesAndRollbackRestores(t *testing.T) {
	real, w := fixture(t)
	before := hashOf(t, real)
	merged := w.Layers[0].Merged
	change(t, merged)
	if h := hashOf(t, real); h != before {
		t.Fatal("the real directory changed before commit")
	}
	got, err := w.Diff(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if want := wantChanges(real); !reflect.DeepEqual(got, want) {
		t.Fatalf("diff:\n got %+v\nwant %+v", got, want)
	}
	res, err := w.Rollback(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Changes) != 6 || res.Hash != before {
		t.Errorf("rollback result: %d changes, hash %s (want 6, %s)", len(res.Changes), res.Hash, before)
	}
	if h := hashOf(t, real); h != before {
		t.Error("real directory changed by rollback")
	}
	if h := hashOf(t, merged); h != before {
		t.Error("after rollback the overlay does not show the real directory")
	}
	if d, _ := w.Diff(context.Background()); len(d) != 0 {
		t.Errorf("diff after rollback: %+v", d)
	}
}

func TestCommitAppliesTheChanges(t *testing.T) {
	real, w := fixture(t)
	merged := w.Layers[0].Merged
	change(t, merged)
	seen := hashOf(t, merged)
	res, err := w.Commit(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(res.Changes, wantChanges(real)) {
		t.Errorf("commit changes: %+v", res.Changes)
	}
	if h := hashOf(t, real); h != seen || res.Hash != seen {
		t.Errorf("real dir after commit %s, result %s; the overlay showed %s", h, res.Hash, seen)
	}
	for p, want := range map[string]string{"new.txt": "hello world\n", "edit.txt": "new content\n", "sub/a.txt": "a\n", "newdir/n.txt": "nn\n"} {
		if b, err := os.ReadFile(filepath.Join(real, p)); err != nil || string(b) != want {
			t.Errorf("%s: %q, %v", p, b, err)
		}
	}
	for _, p := range []string{"gone.txt", "sub/b.txt", "tree"} {
		if _, err := os.Lstat(filepath.Join(real, p)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s still there after commit: %v", p, err)
		}
	}
	// No overlay bookkeeping leaks into the real directory.
	filepath.Walk(real, func(p string, _ os.FileInfo, _ error) error {
		for _, x := range listXattrs(p) {
			if strings.HasPrefix(x, "trusted.overlay.") {
				t.Errorf("%s keeps %s", p, x)
			}
		}
		return nil
	})
	if d, _ := w.Diff(context.Background()); len(d) != 0 {
		t.Errorf("diff after commit: %+v", d)
	}
	if h := hashOf(t, merged); h != seen {
		t.Error("overlay after commit differs from the committed tree")
	}
}

func TestSnapshotAndRollbackToName(t *testing.T) {
	real, w := fixture(t)
	merged := w.Layers[0].Merged
	write(t, filepath.Join(merged, "step1.txt"), "one\n")
	os.Remove(filepath.Join(merged, "gone.txt"))
	at1 := hashOf(t, merged)
	s1, pruned, err := w.Snapshot(context.Background(), "one", SnapshotLimits{Keep: 2}, nil)
	if err != nil || len(pruned) != 0 {
		t.Fatal(err, pruned)
	}
	if s1.Bytes != 4 || s1.Changes != 2 {
		t.Errorf("snapshot costs %d bytes for %d changes; want the upper layer's 4 bytes, 2 changes", s1.Bytes, s1.Changes)
	}
	write(t, filepath.Join(merged, "step2.txt"), "two two\n")
	write(t, filepath.Join(merged, "step1.txt"), "changed\n")
	if _, _, err := w.Snapshot(context.Background(), "two", SnapshotLimits{Keep: 2}, nil); err != nil {
		t.Fatal(err)
	}
	res, err := w.RollbackTo(context.Background(), "one")
	if err != nil {
		t.Fatal(err)
	}
	if h := hashOf(t, merged); h != at1 {
		t.Error("rollback to 'one' does not show the tree as it was")
	}
	var paths []string
	for _, c := range res.Changes {
		paths = append(paths, filepath.Base(c.Path))
	}
	if !reflect.DeepEqual(paths, []string{"step1.txt", "step2.txt"}) {
		t.Errorf("rollback to 'one' touched %v", paths)
	}
	// The whiteout survived the copy: gone.txt is still gone.
	if _, err := os.Lstat(filepath.Join(merged, "gone.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Error("whiteout lost in the snapshot")
	}
	// Pruning keeps the newest two.
	if _, pruned, err := w.Snapshot(context.Background(), "three", SnapshotLimits{Keep: 2}, nil); err != nil || !reflect.DeepEqual(pruned, []string{"one"}) {
		t.Errorf("pruned %v, %v; want [one]", pruned, err)
	}
	snaps, _ := w.Snapshots()
	if len(snaps) != 2 || snaps[0].Name != "two" || snaps[1].Name != "three" {
		t.Errorf("snapshots: %+v", snaps)
	}
	if _, err := w.RollbackTo(context.Background(), "one"); !errors.Is(err, ErrNoSnapshot) {
		t.Errorf("rollback to a pruned snapshot: %v", err)
	}
	// A byte budget refuses a snapshot bigger than itself.
	if _, _, err := w.Snapshot(context.Background(), "big", SnapshotLimits{MaxBytes: 3}, nil); err == nil || !strings.Contains(err.Error(), "above the limit") {
		t.Errorf("over-budget snapshot: %v", err)
	}
	if h := hashOf(t, real); h == at1 {
		t.Error("snapshots changed the real directory")
	}
}

func TestUpperAndWorkOnDifferentFilesystems(t *testing.T) {
	needRoot(t)
	base := t.TempDir()
	real := filepath.Join(base, "real")
	write(t, filepath.Join(real, "f"), "x")
	state := filepath.Join(base, "state")
	w, err := Open(state, "sb", []string{real})
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", w.Layers[0].Work, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(w.Layers[0].Work, unix.MNT_DETACH)
	_, err = Open(state, "sb", []string{real})
	if !errors.Is(err, ErrDifferentFilesystems) || !strings.Contains(err.Error(), "one filesystem") {
		t.Fatalf("Open: %v", err)
	}
	t.Logf("error: %v", err)
	if err := w.Mount(); !errors.Is(err, ErrDifferentFilesystems) {
		t.Fatalf("Mount: %v", err)
	}
	// The benign neighbour: the same state on one filesystem works.
	unix.Unmount(w.Layers[0].Work, 0)
	mount(t, w)
	unix.Unmount(w.Layers[0].Merged, unix.MNT_DETACH)
}

func TestStateInsideWorkspaceRefused(t *testing.T) {
	needRoot(t)
	real := t.TempDir()
	if _, err := Open(filepath.Join(real, ".state"), "sb", []string{real}); err == nil || !strings.Contains(err.Error(), "overlap") {
		t.Fatalf("Open: %v", err)
	}
}

// TestCommitAcrossFilesystems: the state directory on another filesystem
// than the workspace (a tmpfs here) is fine; commit copies instead of
// renaming.
func TestCommitAcrossFilesystems(t *testing.T) {
	needRoot(t)
	base := t.TempDir()
	real := filepath.Join(base, "real")
	write(t, filepath.Join(real, "edit.txt"), "old\n")
	write(t, filepath.Join(real, "gone.txt"), "bye\n")
	state := filepath.Join(base, "state")
	os.MkdirAll(state, 0o700)
	if err := unix.Mount("tmpfs", state, "tmpfs", 0, "size=16m"); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(state, unix.MNT_DETACH)
	w, err := Open(state, "sb", []string{real})
	if err != nil {
		t.Fatal(err)
	}
	mount(t, w)
	defer unix.Unmount(w.Layers[0].Merged, unix.MNT_DETACH)
	merged := w.Layers[0].Merged
	write(t, filepath.Join(merged, "edit.txt"), "new\n")
	write(t, filepath.Join(merged, "d", "n.txt"), "n\n")
	os.Symlink("edit.txt", filepath.Join(merged, "link"))
	os.Remove(filepath.Join(merged, "gone.txt"))
	if err := os.Chmod(filepath.Join(merged, "edit.txt"), 0o600); err != nil {
		t.Fatal(err)
	}
	seen := hashOf(t, merged)
	res, err := w.Commit(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if h := hashOf(t, real); h != seen || res.Hash != seen {
		t.Errorf("after a cross-filesystem commit the real tree differs from what the overlay showed")
	}
	if fi, err := os.Lstat(filepath.Join(real, "link")); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("symlink not committed: %v", err)
	}
	if fi, _ := os.Stat(filepath.Join(real, "edit.txt")); fi == nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("mode not committed: %v", fi)
	}
	ents, _ := os.ReadDir(real)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".watcher-commit-") {
			t.Errorf("temporary %s left behind", e.Name())
		}
	}
}
