package ledger

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

// buildCheckpointed writes n records with a checkpoint every `every`.
func buildCheckpointed(t *testing.T, dir string, n, every int) []*Checkpoint {
	t.Helper()
	l := openT(t, dir, Options{SyncInterval: time.Millisecond, CheckpointInterval: time.Hour, SummaryInterval: time.Hour})
	var cs []*Checkpoint
	for i := 0; i < n; i++ {
		if _, _, err := l.Append(testEvent(i, i%97 == 0)); err != nil {
			t.Fatal(err)
		}
		if (i+1)%every == 0 {
			c, err := l.Checkpoint()
			if err != nil {
				t.Fatal(err)
			}
			cs = append(cs, c)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return cs
}

// The tree hash files hold the same tree the checkpoints sign: tiles give
// every checkpoint's root, inclusion proofs equal those of a scan of the
// segments, and consistency proofs between checkpoints check.
func TestTilesMatchTree(t *testing.T) {
	dir := t.TempDir()
	cs := buildCheckpointed(t, dir, 1000, 300)
	v, _ := note.NewVerifier(pubKeyOf(t, dir))
	tiles := OpenTiles(dir)
	last, _, err := LatestCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	final, err := ParseCosigned(last, v)
	if err != nil {
		t.Fatal(err)
	}
	if tiles.Size() != final.Size {
		t.Fatalf("tiles cover %d records, ledger has %d", tiles.Size(), final.Size)
	}
	for _, c := range append(cs, final) {
		root, err := tlog.TreeHash(int64(c.Size), hashReader(c.Size, c.Root, tiles))
		if err != nil || root != c.Root {
			t.Fatalf("size %d: root from tiles %v, %v; signed %v", c.Size, root, err, c.Root)
		}
	}
	for _, seq := range []uint64{0, 1, 255, 256, 511, 700, final.Size - 1} {
		p, err := Prove(dir, seq, last, v)
		if err != nil {
			t.Fatal(err)
		}
		fromTiles, err := tlog.ProveRecord(int64(final.Size), int64(seq), hashReader(final.Size, final.Root, tiles))
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Hashes) != len(fromTiles) {
			t.Fatalf("record %d: proof lengths %d and %d", seq, len(p.Hashes), len(fromTiles))
		}
		for i := range fromTiles {
			if fromTiles[i] != p.Hashes[i] {
				t.Fatalf("record %d: proofs differ at %d", seq, i)
			}
		}
	}
	l := openT(t, dir, Options{})
	defer l.Close()
	for _, old := range cs {
		p, err := l.ProveConsistency(old.Size, final)
		if err != nil {
			t.Fatal(err)
		}
		if err := tlog.CheckTree(p, int64(final.Size), final.Root, int64(old.Size), old.Root); err != nil {
			t.Fatalf("consistency %d -> %d: %v", old.Size, final.Size, err)
		}
	}
	// A proof from a root the ledger never had fails the check.
	p, _ := l.ProveConsistency(cs[0].Size, final)
	wrong := cs[0].Root
	wrong[0] ^= 1
	if tlog.CheckTree(p, int64(final.Size), final.Root, int64(cs[0].Size), wrong) == nil {
		t.Fatal("consistency proof checked against a wrong old root")
	}
}

// The tree hash files are derived data: missing, damaged or short, Open
// rebuilds them from the segments, byte for byte.
func TestTilesRebuilt(t *testing.T) {
	dir := t.TempDir()
	buildCheckpointed(t, dir, 600, 200)
	want, err := os.ReadFile(filepath.Join(dir, treeName(0)))
	if err != nil {
		t.Fatal(err)
	}
	want1, _ := os.ReadFile(filepath.Join(dir, treeName(1)))
	if len(want1) != 2*tlog.HashSize {
		t.Fatalf("level 1 holds %d bytes", len(want1))
	}
	for name, damage := range map[string]func(){
		"removed": func() { os.Remove(filepath.Join(dir, treeName(0))); os.Remove(filepath.Join(dir, treeName(1))) },
		"flipped-at-the-edge": func() {
			b, _ := os.ReadFile(filepath.Join(dir, treeName(0)))
			b[len(b)-40] ^= 4
			os.WriteFile(filepath.Join(dir, treeName(0)), b, 0o644)
		},
		"short":            func() { os.Truncate(filepath.Join(dir, treeName(0)), 300*tlog.HashSize+7) },
		"upper-level-lost": func() { os.Remove(filepath.Join(dir, treeName(1))) },
	} {
		damage()
		l := openT(t, dir, Options{})
		n := l.Stats().Records
		l.Close()
		got, _ := os.ReadFile(filepath.Join(dir, treeName(0)))
		got1, _ := os.ReadFile(filepath.Join(dir, treeName(1)))
		if uint64(len(got)) != n*tlog.HashSize || !bytes.Equal(got[:len(want)], want) || !bytes.Equal(got1, want1) {
			t.Fatalf("%s: tree files not rebuilt (%d bytes for %d records)", name, len(got), n)
		}
		want = got
	}
}

// Damage inside the tree files that Open's check of the latest root does
// not read is caught by the proof that reads it: an error, never a wrong
// proof.
func TestTilesDamageFailsProofs(t *testing.T) {
	dir := t.TempDir()
	buildCheckpointed(t, dir, 600, 200)
	b, _ := os.ReadFile(filepath.Join(dir, treeName(0)))
	b[3*tlog.HashSize] ^= 4 // record 3, under a full tile
	os.WriteFile(filepath.Join(dir, treeName(0)), b, 0o644)
	l := openT(t, dir, Options{})
	defer l.Close()
	c := l.LastCheckpoint()
	if _, err := l.ProveInclusion(3, c); err == nil {
		t.Fatal("proof from a damaged tile")
	}
	if _, err := l.ProveInclusion(300, c); err != nil {
		t.Fatalf("proof from an intact tile: %v", err)
	}
}

// A ledger written with one ckpt-<size>.note per checkpoint still
// verifies, and Open moves those files into the history.
func TestLegacyCheckpointsMigrate(t *testing.T) {
	dir := t.TempDir()
	cs := buildCheckpointed(t, dir, 400, 40)
	// Make it look like the old layout.
	for _, c := range cs {
		os.WriteFile(filepath.Join(dir, ckptName(c.Size)), c.Note, 0o644)
	}
	latest, _, _ := LatestCheckpoint(dir)
	v, _ := note.NewVerifier(pubKeyOf(t, dir))
	lc, _ := ParseCosigned(latest, v)
	os.WriteFile(filepath.Join(dir, ckptName(lc.Size)), lc.Note, 0o644)
	for _, n := range []string{latestName, historyName, treeName(0), treeName(1)} {
		os.Remove(filepath.Join(dir, n))
	}
	before := requireClean(t, dir)
	if before.Checkpoints != len(cs)+1 {
		t.Fatalf("old layout: %d checkpoints matched, want %d", before.Checkpoints, len(cs)+1)
	}
	l := openT(t, dir, Options{})
	l.Close()
	if m, _ := filepath.Glob(filepath.Join(dir, "ckpt-*")); len(m) != 0 {
		t.Fatalf("legacy files left: %v", m)
	}
	after := requireClean(t, dir)
	if after.Checkpoints != before.Checkpoints || after.Covered != before.Covered {
		t.Fatalf("after migration %d checkpoints covering %d, before %d covering %d", after.Checkpoints, after.Covered, before.Checkpoints, before.Covered)
	}
	entries, _ := os.ReadDir(dir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	// seg, checkpoint, checkpoints, tree-0, tree-1, ledger.pub, ledger.key, LOCK
	if len(names) != 8 {
		t.Fatalf("files after migration: %v", names)
	}
}

// The number of files does not grow with checkpoints: 50 checkpoints
// leave the same files as one.
func TestCheckpointFilesBounded(t *testing.T) {
	dir := t.TempDir()
	buildCheckpointed(t, dir, 500, 10)
	entries, _ := os.ReadDir(dir)
	if len(entries) != 8 {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Fatalf("%d files: %v", len(entries), names)
	}
	rep := requireClean(t, dir)
	if rep.Checkpoints < 50 {
		t.Fatalf("%d checkpoints matched", rep.Checkpoints)
	}
}

// A torn append to the history (a prefix of DIR/checkpoint) is cut at
// Open; any other damage at its end is refused.
func TestHistoryTornTail(t *testing.T) {
	dir := t.TempDir()
	buildCheckpointed(t, dir, 50, 10)
	latest, _ := os.ReadFile(filepath.Join(dir, latestName))
	hist := filepath.Join(dir, historyName)
	good, _ := os.ReadFile(hist)
	os.WriteFile(hist, append(append([]byte(nil), good...), latest[:len(latest)/2]...), 0o644)
	rep := verifyT(t, dir)
	if !rep.OK() || len(rep.Warnings) == 0 {
		t.Fatalf("torn history: %v %v", rep.Problems, rep.Warnings)
	}
	l := openT(t, dir, Options{})
	l.Close()
	if got, _ := os.ReadFile(hist); !bytes.HasPrefix(got, good) || len(got) != len(good) {
		t.Fatalf("torn tail not cut: %d bytes, had %d", len(got), len(good))
	}
	os.WriteFile(hist, append(append([]byte(nil), good...), []byte("watcher-ledger/forged\n12\n")...), 0o644)
	if rep := verifyT(t, dir); rep.OK() {
		t.Fatal("damaged history tail passed verify")
	}
	if _, err := Open(dir, Options{}); err == nil {
		t.Fatal("Open cut a damaged history tail")
	}
}
