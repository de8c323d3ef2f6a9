package ledger

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/mod/sumdb/tlog"
)

const tamperRecords = 14

// buildSmall writes a small ledger: genesis, tamperRecords events with a
// checkpoint every 4, a final summary and checkpoint at Close.
func buildSmall(t *testing.T, dir string, opts Options) {
	t.Helper()
	l := openT(t, dir, opts)
	for i := 0; i < tamperRecords; i++ {
		if _, _, err := l.Append(testEvent(i, i%5 == 2)); err != nil {
			t.Fatal(err)
		}
		if i%4 == 3 {
			if _, err := l.Checkpoint(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}

func copyDir(t *testing.T, src string) string {
	t.Helper()
	dst := t.TempDir()
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

// segLines splits a segment into its header and record lines.
func segLines(t *testing.T, path string) (hdr []byte, recs [][]byte) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.SplitAfter(b, []byte("\n"))
	if len(lines[len(lines)-1]) == 0 {
		lines = lines[:len(lines)-1]
	}
	return lines[0], lines[1:]
}

func writeSeg(t *testing.T, path string, hdr []byte, recs [][]byte) {
	t.Helper()
	b := append([]byte(nil), hdr...)
	for _, r := range recs {
		b = append(b, r...)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// recordOffsets returns each record's start offset.
func recordOffsets(hdr []byte, recs [][]byte) []int64 {
	off := int64(len(hdr))
	var out []int64
	for _, r := range recs {
		out = append(out, off)
		off += int64(len(r))
	}
	return out
}

// rechain rewrites prev and hash of recs[from:] so the chain is internally
// consistent again: what an attacker with the files (but not the key) can
// do after editing a record.
func rechain(t *testing.T, recs [][]byte, from int) {
	t.Helper()
	lh := newLeafHasher()
	var prev tlog.Hash
	if from > 0 {
		f, err := parseFrame(recs[from-1])
		if err != nil {
			t.Fatal(err)
		}
		prev = lh.hash(f.body)
	}
	for i := from; i < len(recs); i++ {
		r := recs[i]
		j := bytes.Index(r, []byte(prevPrefix)) + len(prevPrefix)
		copy(r[j:j+hexHashLen], appendHex(nil, prev))
		body := r[:len(r)-suffixLen]
		h := lh.hash(body)
		recs[i] = append(append(append([]byte(nil), body...), hashPrefix...), appendHex(nil, h)...)
		recs[i] = append(recs[i], '"', '}', '\n')
		prev = h
	}
}

func onlySeg(t *testing.T, dir string) string {
	t.Helper()
	segs := segFiles(t, dir)
	if len(segs) != 1 {
		t.Fatalf("want 1 segment, have %v", segs)
	}
	return segs[0]
}

// expectBad verifies dir and requires the first bad record to be seq at
// offset off of file.
func expectBad(t *testing.T, dir, file string, seq uint64, off int64) *Report {
	t.Helper()
	rep := verifyT(t, dir)
	if rep.OK() {
		t.Fatalf("tampering not detected")
	}
	p := rep.FirstBad
	if p == nil {
		t.Fatalf("no record located; problems: %v", rep.Problems)
	}
	if p.File != file || p.Seq != seq || p.Offset != off {
		t.Fatalf("located %s, want record %d in %s at offset %d", p, seq, file, off)
	}
	return rep
}

func TestVerifyClean(t *testing.T) {
	dir := t.TempDir()
	buildSmall(t, dir, Options{})
	rep := requireClean(t, dir)
	// genesis + events + final summary
	if want := uint64(tamperRecords + 2); rep.Records != want || rep.NextSeq != want {
		t.Fatalf("records %d next %d, want %d", rep.Records, rep.NextSeq, want)
	}
	if rep.Covered != rep.NextSeq || rep.Checkpoints != 4 {
		t.Fatalf("covered %d checkpoints %d", rep.Covered, rep.Checkpoints)
	}
	recs := readAll(t, dir)
	if len(recs) != tamperRecords+2 || recs[3].Event.Message != "event 2" || recs[3].Seq != 3 {
		t.Fatalf("reader: %d records", len(recs))
	}
}

func TestTamperBitFlips(t *testing.T) {
	pristine := t.TempDir()
	buildSmall(t, pristine, Options{})
	dir := copyDir(t, pristine)
	seg := onlySeg(t, dir)
	hdr, recs := segLines(t, seg)
	offs := recordOffsets(hdr, recs)
	data, _ := os.ReadFile(seg)
	flips := 0
	for p := range data {
		for _, bit := range []byte{1 << (p % 8)} {
			data[p] ^= bit
			if err := os.WriteFile(seg, data, 0o600); err != nil {
				t.Fatal(err)
			}
			wantSeq, wantOff := uint64(0), int64(0)
			for i, o := range offs {
				if int64(p) >= o {
					wantSeq, wantOff = uint64(i), o
				}
			}
			rep := verifyT(t, dir)
			if rep.OK() || rep.FirstBad == nil {
				t.Fatalf("flip of bit %#x at byte %d not detected", bit, p)
			}
			if got := rep.FirstBad; got.Seq != wantSeq || got.Offset != wantOff || got.File != seg {
				t.Fatalf("flip at byte %d (in record %d at %d) located as %s", p, wantSeq, wantOff, got)
			}
			data[p] ^= bit
			flips++
		}
	}
	os.WriteFile(seg, data, 0o600)
	requireClean(t, dir)
	// Checkpoint files: every flip breaks the signature or the form.
	ckpts := checkpointFiles(t, dir)
	for _, c := range ckpts {
		cd, _ := os.ReadFile(c)
		for p := range cd {
			bit := byte(1 << (p % 8))
			cd[p] ^= bit
			os.WriteFile(c, cd, 0o600)
			rep := verifyT(t, dir)
			found := false
			for _, pr := range rep.Problems {
				found = found || pr.File == c
			}
			if !found {
				t.Fatalf("flip at byte %d of %s not reported against it: %v", p, c, rep.Problems)
			}
			cd[p] ^= bit
			flips++
		}
		os.WriteFile(c, cd, 0o600)
	}
	requireClean(t, dir)
	t.Logf("%d single-bit flips over %d segment bytes and %d checkpoints, all detected and located", flips, len(data), len(ckpts))
}

func TestTamperRecordEdits(t *testing.T) {
	pristine := t.TempDir()
	buildSmall(t, pristine, Options{})
	seg0 := filepath.Base(onlySeg(t, pristine))
	hdr, recs := segLines(t, filepath.Join(pristine, seg0))
	offs := recordOffsets(hdr, recs)
	n := len(recs)
	edit := func(t *testing.T, f func(recs [][]byte) [][]byte) (string, string) {
		dir := copyDir(t, pristine)
		seg := filepath.Join(dir, seg0)
		cp := make([][]byte, len(recs))
		for i := range recs {
			cp[i] = append([]byte(nil), recs[i]...)
		}
		writeSeg(t, seg, hdr, f(cp))
		return dir, seg
	}
	for _, k := range []int{0, 1, 5, n - 2, n - 1} {
		t.Run(fmt.Sprintf("delete-%d", k), func(t *testing.T) {
			dir, seg := edit(t, func(r [][]byte) [][]byte { return append(r[:k:k], r[k+1:]...) })
			if k == n-1 {
				// The last record is gone: the final checkpoint says so.
				rep := verifyT(t, dir)
				if rep.OK() || rep.FirstBad.Seq != uint64(k) || rep.FirstBad.Offset != offs[k] {
					t.Fatalf("got %v", rep.Problems)
				}
				return
			}
			expectBad(t, dir, seg, uint64(k), offs[k])
		})
	}
	for _, k := range []int{0, 3, n - 1} {
		t.Run(fmt.Sprintf("duplicate-%d", k), func(t *testing.T) {
			dir, seg := edit(t, func(r [][]byte) [][]byte {
				return append(r[:k+1:k+1], append([][]byte{r[k]}, r[k+1:]...)...)
			})
			next := int64(len(hdr))
			for _, r := range recs[:k+1] {
				next += int64(len(r))
			}
			expectBad(t, dir, seg, uint64(k+1), next)
		})
	}
	for _, k := range []int{0, 4, n - 2} {
		t.Run(fmt.Sprintf("swap-%d", k), func(t *testing.T) {
			dir, seg := edit(t, func(r [][]byte) [][]byte { r[k], r[k+1] = r[k+1], r[k]; return r })
			expectBad(t, dir, seg, uint64(k), offs[k])
		})
	}
	t.Run("truncate-whole-records", func(t *testing.T) {
		dir, seg := edit(t, func(r [][]byte) [][]byte { return r[:n-3] })
		rep := expectBad(t, dir, seg, uint64(n-3), offs[n-3])
		if !strings.Contains(rep.FirstBad.Reason, "truncated") {
			t.Fatalf("reason %q", rep.FirstBad.Reason)
		}
	})
	t.Run("truncate-mid-record", func(t *testing.T) {
		dir, seg := edit(t, func(r [][]byte) [][]byte { r[n-2] = r[n-2][:40]; return r[:n-1] })
		expectBad(t, dir, seg, uint64(n-2), offs[n-2])
	})
	t.Run("edit-without-rehash", func(t *testing.T) {
		dir, seg := edit(t, func(r [][]byte) [][]byte {
			r[6] = bytes.Replace(r[6], []byte(`"event 5"`), []byte(`"event X"`), 1)
			return r
		})
		expectBad(t, dir, seg, 6, offs[6])
	})
	t.Run("edit-and-recompute-all-hashes", func(t *testing.T) {
		const k = 8 // the denied open of event 7
		dir, seg := edit(t, func(r [][]byte) [][]byte {
			edited := bytes.Replace(r[k], []byte(`"/root/.ssh/id_ed25519"`), []byte(`"/tmp/harmless.txt!!!"`), 1)
			if bytes.Equal(edited, r[k]) {
				t.Fatalf("record %d is not the alert: %s", k, r[k])
			}
			r[k] = edited
			rechain(t, r, k)
			return r
		})
		rep := verifyT(t, dir)
		p := rep.FirstBad
		if rep.OK() || p == nil {
			t.Fatal("rewritten history not detected")
		}
		// Located to the checkpoint interval that contains the edit.
		if p.Seq > k || p.SeqEnd <= k || p.SeqEnd-p.Seq > 4 || p.File != seg {
			t.Fatalf("located %s, want a range of at most 4 records holding %d", p, k)
		}
		if !strings.Contains(p.Reason, "rewritten") {
			t.Fatalf("reason %q", p.Reason)
		}
		// Deleting the checkpoints hides it from the directory alone, but
		// not from a checkpoint kept elsewhere.
		pristineCkpt, name, err := LatestCheckpoint(pristine)
		if err != nil {
			t.Fatal(err)
		}
		ck := checkpointFiles(t, dir)
		for _, c := range ck {
			os.Remove(c)
		}
		if rep := verifyT(t, dir); !rep.OK() {
			t.Fatalf("without checkpoints the chain alone is consistent, got %v", rep.Problems)
		}
		rep, err = VerifyDir(dir, VerifyOptions{PubKey: pubKeyOf(t, dir), Checkpoints: map[string][]byte{name: pristineCkpt}})
		if err != nil {
			t.Fatal(err)
		}
		if rep.OK() || rep.FirstBad == nil || rep.FirstBad.SeqEnd <= k {
			t.Fatalf("external checkpoint did not catch the rewrite: %v", rep.Problems)
		}
	})
	t.Run("splice-two-ledgers", func(t *testing.T) {
		other := t.TempDir()
		buildSmall(t, other, Options{})
		_, orecs := segLines(t, onlySeg(t, other))
		const k = 7
		dir, seg := edit(t, func(r [][]byte) [][]byte { return append(r[:k:k], orecs[k:]...) })
		expectBad(t, dir, seg, k, offs[k])
	})
	t.Run("checkpoint-from-another-ledger", func(t *testing.T) {
		for _, sameKey := range []bool{false, true} {
			other := t.TempDir()
			opts := Options{}
			if sameKey {
				opts.KeyFile = filepath.Join(pristine, defaultKeyName)
			}
			l := openT(t, other, opts)
			for i := 0; i < 100; i++ {
				l.Append(testEvent(i, false))
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			data, name, err := LatestCheckpoint(other)
			if err != nil {
				t.Fatal(err)
			}
			dir := copyDir(t, pristine)
			planted := filepath.Join(dir, filepath.Base(name))
			os.WriteFile(planted, data, 0o644)
			rep := verifyT(t, dir)
			if rep.OK() || rep.Problems[0].File != planted {
				t.Fatalf("sameKey=%v: planted checkpoint not reported: %v", sameKey, rep.Problems)
			}
			t.Logf("sameKey=%v: %s", sameKey, rep.Problems[0])
			if _, err := Open(dir, Options{KeyFile: filepath.Join(pristine, defaultKeyName)}); err == nil || !strings.Contains(err.Error(), planted) {
				t.Fatalf("Open with planted checkpoint: %v", err)
			}
		}
	})
}
