package workspace

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const tib = int64(1) << 40

// writeSparse makes p a file of size bytes holding only the given
// strings at the given offsets: everything else is a hole.
func writeSparse(t *testing.T, p string, size int64, data map[int64]string) {
	t.Helper()
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o644)
	must(t, err)
	defer f.Close()
	must(t, f.Truncate(size))
	for off, s := range data {
		if _, err := f.WriteAt([]byte(s), off); err != nil {
			t.Fatal(err)
		}
	}
}

// allocated is the bytes the filesystem allocated for p.
func allocated(t *testing.T, p string) int64 {
	t.Helper()
	st := statOf(t, p)
	return st.Blocks * 512
}

// measured runs f with a meter and returns what it read.
func measured(t *testing.T, f func(m *meter) error) Progress {
	t.Helper()
	m := newMeter(context.Background(), "test", nil)
	must(t, f(m))
	return m.p
}

// TestSparseFilesBounded: terabyte-sized sparse files a sandbox leaves in
// the upper layer (added, changed in one byte, copied up unchanged) cost
// diff, commit, rollback and snapshot their data only: the bytes read
// stay in megabytes, and a committed sparse file stays sparse.
func TestSparseFilesBounded(t *testing.T) {
	layouts(t, func(t *testing.T, base, state string) {
		real := filepath.Join(base, "real")
		must(t, os.MkdirAll(real, 0o755))
		writeSparse(t, filepath.Join(real, "changed.img"), tib, map[int64]string{0: "lower"})
		writeSparse(t, filepath.Join(real, "copied.img"), tib, map[int64]string{4096: "same"})
		w := openMounted(t, state, real)
		merged := w.Layers[0].Merged
		// Through the overlay, as the sandbox would.
		writeSparse(t, filepath.Join(merged, "added.img"), 4*tib, map[int64]string{0: "head", 2 * tib: "middle", 4*tib - 4: "tail"})
		writeSparse(t, filepath.Join(merged, "changed.img"), tib, map[int64]string{tib / 2: "upper"})
		f, err := os.OpenFile(filepath.Join(merged, "copied.img"), os.O_RDWR, 0) // copy-up without a change
		must(t, err)
		f.Close()
		if _, err := os.Stat(filepath.Join(w.Layers[0].Upper, "copied.img")); err != nil {
			t.Fatalf("no copy-up to test: %v", err)
		}

		const bound = 16 << 20 // bytes read; the files' apparent size is 6 TiB
		var changes []Change
		p := measured(t, func(m *meter) error {
			return w.eachChangeLocked(m, func(c Change) error { changes = append(changes, c); return nil })
		})
		if p.Bytes > bound {
			t.Errorf("diff read %d bytes, want at most %d", p.Bytes, bound)
		}
		want := map[string]ChangeKind{"added.img": Added, "changed.img": Changed}
		if len(changes) != len(want) {
			t.Errorf("diff: %+v, want added.img added and changed.img changed (copied.img equal)", changes)
		}
		for _, c := range changes {
			if want[filepath.Base(c.Path)] != c.Kind {
				t.Errorf("diff: %+v unexpected", c)
			}
		}

		hashBefore := measured(t, func(m *meter) error { _, err := treeHash(m, w.Layers[0].Upper); return err })
		if hashBefore.Bytes > bound {
			t.Errorf("hashing the upper layer read %d bytes, want at most %d", hashBefore.Bytes, bound)
		}

		s, _, err := w.Snapshot(context.Background(), "sparse", SnapshotLimits{}, nil)
		must(t, err)
		snapCopy := filepath.Join(w.snapDir("sparse"), w.Layers[0].ID, "added.img")
		if a := allocated(t, snapCopy); a > 1<<20 {
			t.Errorf("snapshot copy of the sparse file allocates %d bytes, want it sparse", a)
		}
		if s.Bytes < 4*tib {
			t.Errorf("snapshot bytes %d, want the apparent size", s.Bytes)
		}

		res, err := w.Commit(context.Background())
		must(t, err)
		if !res.Done || res.Progress.Bytes > 2*bound {
			t.Errorf("commit: done %v, read %d bytes, want done reading at most %d", res.Done, res.Progress.Bytes, 2*bound)
		}
		got := filepath.Join(real, "added.img")
		if st := statOf(t, got); st.Size != 4*tib {
			t.Errorf("committed size %d, want %d", st.Size, 4*tib)
		}
		if a := allocated(t, got); a > 1<<20 {
			t.Errorf("committed sparse file allocates %d bytes, want it sparse", a)
		}
		for off, s := range map[int64]string{0: "head", 2 * tib: "middle", 4*tib - 4: "tail", tib: "\x00\x00\x00\x00"} {
			b := make([]byte, len(s))
			g, err := os.Open(got)
			must(t, err)
			g.ReadAt(b, off)
			g.Close()
			if string(b) != s {
				t.Errorf("committed file at %d: %q, want %q", off, b, s)
			}
		}
		if d, err := w.Diff(context.Background()); err != nil || len(d) != 0 {
			t.Errorf("diff after commit: %v %+v", err, d)
		}

		// The sandbox writes again; rollback to the snapshot and then to
		// the real directory.
		writeSparse(t, filepath.Join(merged, "again.img"), 4*tib, map[int64]string{3 * tib: "x"})
		res, err = w.RollbackTo(context.Background(), "sparse")
		must(t, err)
		if res.Progress.Bytes > 2*bound {
			t.Errorf("rollback to the snapshot read %d bytes", res.Progress.Bytes)
		}
		res, err = w.Rollback(context.Background())
		must(t, err)
		if !res.Done || res.Progress.Bytes > 2*bound {
			t.Errorf("rollback: done %v, read %d bytes", res.Done, res.Progress.Bytes)
		}
		t.Logf("bytes read: diff %d, hash %d, commit/rollback %d", p.Bytes, hashBefore.Bytes, res.Progress.Bytes)
	})
}

// TestContentDigestIgnoresHoles: the tree hash of a file depends on its
// bytes, not on where its holes are (a dense copy hashes alike), and on
// every byte (one byte in a terabyte changes it).
func TestContentDigestIgnoresHoles(t *testing.T) {
	dir := t.TempDir()
	a, b, c := filepath.Join(dir, "a"), filepath.Join(dir, "b"), filepath.Join(dir, "c")
	writeSparse(t, a, 1<<20, map[int64]string{300000: "data"})
	dense := make([]byte, 1<<20)
	copy(dense[300000:], "data")
	must(t, os.WriteFile(b, dense, 0o644))
	writeSparse(t, c, tib, map[int64]string{tib - 1: "z"})
	digest := func(p string) []byte {
		fd, err := openRegular(p)
		must(t, err)
		defer unix.Close(fd)
		var st unix.Stat_t
		must(t, unix.Fstat(fd, &st))
		d, err := contentDigest(newMeter(context.Background(), "t", nil), fd, st.Size)
		must(t, err)
		return d
	}
	if string(digest(a)) != string(digest(b)) {
		t.Error("a sparse file and its dense copy hash differently")
	}
	zc := digest(c)
	writeSparse(t, c, tib, map[int64]string{tib - 1: "y"})
	if string(zc) == string(digest(c)) {
		t.Error("a changed last byte of a 1 TiB file did not change its digest")
	}
}

// cancelAfter is a context that reports itself cancelled once Err has
// been asked n times: a cancellation at an exact point of the work.
type cancelAfter struct {
	context.Context
	n, asked atomic.Int64
}

func newCancelAfter(n int64) *cancelAfter {
	c := &cancelAfter{Context: context.Background()}
	c.n.Store(n)
	return c
}

func (c *cancelAfter) Err() error {
	if c.asked.Add(1) > c.n.Load() {
		return context.Canceled
	}
	return nil
}

// TestCancelMidFile: a big dense file being compared stops being read as
// soon as the context is cancelled (the 4 TiB rollback that ignored
// SIGTERM), and the error says how far it got.
func TestCancelMidFile(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	big := make([]byte, 64<<20)
	for i := range big {
		big[i] = byte(i)
	}
	must(t, os.WriteFile(a, big, 0o644))
	must(t, os.WriteFile(b, big, 0o644))
	ctx := newCancelAfter(10)
	m := newMeter(ctx, "diff", nil)
	_, err := sameContent(m, a, b, int64(len(big)))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("compare: %v, want context.Canceled", err)
	}
	if m.p.Bytes > 12*2*copyChunk {
		t.Errorf("read %d bytes after cancellation at the 10th check (chunks of %d)", m.p.Bytes, copyChunk)
	}
	// The neighbour: uncancelled, the same comparison finishes and finds
	// them equal.
	m = newMeter(context.Background(), "diff", nil)
	same, err := sameContent(m, a, b, int64(len(big)))
	if err != nil || !same || m.p.Bytes != 2*int64(len(big)) {
		t.Errorf("compare: %v %v after %d bytes, want equal after %d", same, err, m.p.Bytes, 2*len(big))
	}
}

// fill makes n files in upper/dir (the layer, not through the overlay:
// faster, and what the sandbox's writes would leave).
func fill(t *testing.T, dir string, n int) {
	t.Helper()
	must(t, os.MkdirAll(dir, 0o755))
	for i := 0; i < n; i++ {
		fd, err := unix.Open(filepath.Join(dir, fmt.Sprintf("f%07d", i)), unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
		must(t, err)
		unix.Write(fd, []byte("x"))
		unix.Close(fd)
	}
}

// TestCommitCancelledMidway: a commit cancelled after some entries
// returns context.Canceled at once, reports how many entries it applied,
// leaves exactly those in the real directory (whole, directories with
// their final mode) and the rest in the upper layer; run again it
// finishes.
func TestCommitCancelledMidway(t *testing.T) {
	layouts(t, func(t *testing.T, base, state string) {
		real := filepath.Join(base, "real")
		must(t, os.MkdirAll(filepath.Join(real, "old"), 0o755))
		w := openMounted(t, state, real)
		must(t, w.Unmount())
		up := w.Layers[0].Upper
		must(t, os.Mkdir(filepath.Join(up, "old"), 0o755))
		fill(t, filepath.Join(up, "old"), 500)
		must(t, os.Mkdir(filepath.Join(up, "newdir"), 0o750))
		fill(t, filepath.Join(up, "newdir"), 500)
		must(t, os.Chmod(filepath.Join(up, "newdir"), 0o750))

		var applied atomic.Int64
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		commitHook = func(string) {
			if applied.Add(1) == 300 {
				cancel()
			}
		}
		defer func() { commitHook = nil }()
		res, err := w.Commit(ctx)
		commitHook = nil
		if !errors.Is(err, context.Canceled) || res.Done {
			t.Fatalf("commit: done %v, %v; want it interrupted with context.Canceled", res.Done, err)
		}
		if !strings.Contains(err.Error(), "applied") || !strings.Contains(err.Error(), "run commit again") {
			t.Errorf("error does not say what was done: %v", err)
		}
		// Entry 300 saw the cancellation: 299 were applied.
		if res.Applied != 299 {
			t.Errorf("applied %d entries, want 299 (cancelled at the 300th)", res.Applied)
		}
		inReal := 0
		for _, d := range []string{"old", "newdir"} {
			ents, _ := os.ReadDir(filepath.Join(real, d))
			inReal += len(ents)
		}
		dirs := 0
		if _, err := os.Stat(filepath.Join(real, "newdir")); err == nil {
			dirs = 1
			if st := statOf(t, filepath.Join(real, "newdir")); st.Mode&0o7777 != 0o750 {
				t.Errorf("newdir left with mode %o, want its final 0750", st.Mode&0o7777)
			}
		}
		// Applied counts directories (old: existing, newdir: maybe made).
		if int64(inReal)+1+int64(dirs) != res.Applied {
			t.Errorf("the real directory holds %d new files (+%d dirs), the report says %d entries applied", inReal, 1+dirs, res.Applied)
		}
		if ok, _ := w.Mounted(); !ok {
			t.Error("an interrupted commit left the overlay unmounted")
		}
		res, err = w.Commit(context.Background())
		if err != nil || !res.Done {
			t.Fatalf("commit again: %v", err)
		}
		for _, d := range []string{"old", "newdir"} {
			if ents, _ := os.ReadDir(filepath.Join(real, d)); len(ents) != 500 {
				t.Errorf("%s holds %d files after the second commit, want 500", d, len(ents))
			}
		}
	})
}

// TestRollbackCancelledWhileListing: a rollback cancelled while it lists
// throws nothing away and says so.
func TestRollbackCancelledWhileListing(t *testing.T) {
	needRoot(t)
	base := t.TempDir()
	real := filepath.Join(base, "real")
	must(t, os.MkdirAll(real, 0o755))
	w := openMounted(t, filepath.Join(base, "state"), real)
	fill(t, filepath.Join(w.Layers[0].Merged, "d"), 2000)
	res, err := w.Rollback(newCancelAfter(100))
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "nothing thrown away") {
		t.Fatalf("rollback: %v, want context.Canceled, nothing thrown away", err)
	}
	if res.Progress.Entries > 101 {
		t.Errorf("listed %d entries after the cancellation at the 100th check", res.Progress.Entries)
	}
	if ents, _ := os.ReadDir(filepath.Join(w.Layers[0].Merged, "d")); len(ents) != 2000 {
		t.Errorf("the workspace shows %d files after an interrupted rollback, want all 2000", len(ents))
	}
	res, err = w.Rollback(context.Background())
	if err != nil || !res.Done {
		t.Fatalf("rollback: %v", err)
	}
}

// liveHeap is the heap in use after a collection.
func liveHeap() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// TestManyEntriesBoundedMemory: listing 200k changed entries, in one
// directory and spread over directories, holds none of them: the live
// heap grows by a few megabytes, where keeping the entries (as the
// listing did before) takes tens.
func TestManyEntriesBoundedMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("makes 200k files")
	}
	needRoot(t)
	// On a tmpfs: the test is about memory, not about the disk's speed
	// at unlinking 200k files.
	base := t.TempDir()
	must(t, unix.Mount("tmpfs", base, "tmpfs", 0, "size=1g"))
	t.Cleanup(func() { unix.Unmount(base, unix.MNT_DETACH) })
	real := filepath.Join(base, "real")
	must(t, os.MkdirAll(filepath.Join(real, "flat"), 0o755))
	for i := 0; i < 100; i++ {
		must(t, os.MkdirAll(filepath.Join(real, "tree", fmt.Sprint(i)), 0o755))
	}
	w, err := Open(filepath.Join(base, "state"), "sb", []string{real})
	must(t, err)
	t.Cleanup(func() { unix.Unmount(w.Layers[0].Merged, unix.MNT_DETACH) })
	t0 := time.Now()
	phase := func(what string) { t.Logf("%s: %v", what, time.Since(t0)); t0 = time.Now() }
	up := w.Layers[0].Upper
	// 200,000 one-byte files take a page each of this tmpfs: a machine
	// without ~1.2 GiB of memory to spare (the qemu guest has 1 GiB in
	// all) cannot hold them.
	if avail := memAvailable(); avail > 0 && avail < 1200<<20 {
		t.Skipf("%d MiB of memory available; 200,000 files on tmpfs need about 800 MiB besides the test", avail>>20)
	}
	fill(t, filepath.Join(up, "flat"), 100_000)
	for i := 0; i < 100; i++ {
		fill(t, filepath.Join(up, "tree", fmt.Sprint(i)), 1000)
	}
	phase("made")
	before := liveHeap()
	var peak uint64
	n := 0
	err = w.EachChange(context.Background(), func(Change) error {
		if n++; n%20_000 == 0 {
			peak = max(peak, liveHeap())
		}
		return nil
	})
	must(t, err)
	if n != 200_000 {
		t.Fatalf("listed %d changes, want 200000", n)
	}
	grew := int64(peak) - int64(before)
	t.Logf("live heap: %d before, peak %d (+%d bytes) over 200k entries", before, peak, grew)
	if grew > 8<<20 {
		t.Errorf("listing 200k entries grew the live heap by %d bytes, want under 8 MiB", grew)
	}
	phase("listed")
	res, err := w.Rollback(context.Background())
	must(t, err)
	phase("rolled back")
	if len(res.Changes) != MaxListedChanges || res.Unlisted != 200_000-MaxListedChanges {
		t.Errorf("rollback lists %d changes and %d unlisted, want %d and %d", len(res.Changes), res.Unlisted, MaxListedChanges, 200_000-MaxListedChanges)
	}
}

// TestDeepTree: a tree 5000 directories deep (paths past PATH_MAX) is
// refused cleanly by diff and commit, nothing applied, and rollback still
// throws it away.
func TestDeepTree(t *testing.T) {
	needRoot(t)
	base := t.TempDir()
	real := filepath.Join(base, "real")
	must(t, os.MkdirAll(real, 0o755))
	write(t, filepath.Join(real, "keep.txt"), "keep\n")
	w, err := Open(filepath.Join(base, "state"), "sb", []string{real})
	must(t, err)
	t.Cleanup(func() { unix.Unmount(w.Layers[0].Merged, unix.MNT_DETACH) })
	before := hashOf(t, real)
	t0 := time.Now()
	defer func() { t.Logf("%v", time.Since(t0)) }()
	fd, err := unix.Open(w.Layers[0].Upper, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	must(t, err)
	for i := 0; i < 5000; i++ {
		must(t, unix.Mkdirat(fd, "d", 0o755))
		next, err := unix.Openat(fd, "d", unix.O_RDONLY|unix.O_DIRECTORY, 0)
		must(t, err)
		unix.Close(fd)
		fd = next
	}
	unix.Close(fd)
	t.Logf("made: %v", time.Since(t0))
	if _, err := w.Diff(context.Background()); !errors.Is(err, unix.ENAMETOOLONG) {
		t.Errorf("diff of a 5000-deep tree: %v, want ENAMETOOLONG", err)
	}
	res, err := w.Commit(context.Background())
	if !errors.Is(err, unix.ENAMETOOLONG) || res.Applied != 0 || !strings.Contains(err.Error(), "nothing applied") {
		t.Errorf("commit of a 5000-deep tree: applied %d, %v; want ENAMETOOLONG with nothing applied", res.Applied, err)
	}
	if hashOf(t, real) != before {
		t.Error("a refused commit changed the real directory")
	}
	t.Logf("diff, commit: %v", time.Since(t0))
	// Emptying the upper layer holds a bounded number of descriptors:
	// with RLIMIT_NOFILE far below the depth, rollback still removes it.
	var nofile unix.Rlimit
	must(t, unix.Getrlimit(unix.RLIMIT_NOFILE, &nofile))
	low := nofile
	low.Cur = 256
	must(t, unix.Setrlimit(unix.RLIMIT_NOFILE, &low))
	res, err = w.Rollback(context.Background())
	must(t, unix.Setrlimit(unix.RLIMIT_NOFILE, &nofile))
	if err != nil || !res.Done || !strings.Contains(res.ListError, "file name too long") {
		t.Fatalf("rollback: %v, list error %q; want it done, saying the listing failed", err, res.ListError)
	}
	if ents, _ := os.ReadDir(w.Layers[0].Upper); len(ents) != 0 {
		t.Errorf("upper layer holds %d entries after rollback", len(ents))
	}
}

// memAvailable is /proc/meminfo's MemAvailable in bytes (0: unknown).
func memAvailable() uint64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "MemAvailable:"); ok {
			var kb uint64
			fmt.Sscan(strings.TrimSuffix(strings.TrimSpace(v), " kB"), &kb)
			return kb << 10
		}
	}
	return 0
}
