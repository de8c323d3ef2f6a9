package ledger

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// zstdChecksum reports whether the first zstd frame of a file carries a
// content checksum (Frame_Header_Descriptor bit 2, RFC 8878 3.1.1.1.1).
func zstdChecksum(t *testing.T, path string) bool {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < 5 || !bytes.Equal(b[:4], []byte{0x28, 0xb5, 0x2f, 0xfd}) {
		t.Fatalf("%s: not a zstd frame", path)
	}
	return b[4]&0x04 != 0
}

// TestEarlierLedger reads, verifies and continues a ledger written by the
// code before the encoder's head cache and the checksum-less zstd segments
// (testdata/ledger-v1, made by that code: 8 compressed segments with zstd
// checksums, one plain, two checkpoints): it verifies, every record
// re-encodes to the bytes stored, and after appending with the current code
// (new compressed segments without checksums) the whole ledger verifies.
func TestEarlierLedger(t *testing.T) {
	dir := copyDir(t, filepath.Join("testdata", "ledger-v1"))
	old, _ := filepath.Glob(filepath.Join(dir, "seg-*.jsonl.zst"))
	if len(old) < 2 {
		t.Fatalf("testdata has %d compressed segments", len(old))
	}
	for _, p := range old {
		if !zstdChecksum(t, p) {
			t.Fatalf("%s: the earlier code wrote frames with a checksum; this one has none", p)
		}
	}
	rep := requireClean(t, dir)
	recs := readAll(t, dir)
	if uint64(len(recs)) != rep.NextSeq || rep.NextSeq < 200 {
		t.Fatalf("read %d records, report says %d", len(recs), rep.NextSeq)
	}
	lh := newLeafHasher()
	for _, r := range recs {
		again, h := appendRecord(nil, lh, r.Seq, r.Prev, &r.Event)
		if !bytes.Equal(again, r.Raw) || h != r.Hash {
			t.Fatalf("record %d re-encodes differently:\n got %s\nwant %s", r.Seq, again, r.Raw)
		}
	}

	opts := Options{SegmentMaxBytes: 6 << 10, Compress: true, SyncInterval: time.Millisecond, Seed: 7}
	l := openT(t, dir, opts)
	for i := 0; i < 200; i++ {
		if _, _, err := l.Append(testEvent(5000+i, i%25 == 0)); err != nil {
			t.Fatal(err)
		}
		if i%20 == 0 {
			time.Sleep(5 * time.Millisecond) // let the ticker rotate
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	// Compression runs after rotation; Close waits for it.
	all, _ := filepath.Glob(filepath.Join(dir, "seg-*.jsonl.zst"))
	var fresh []string
	for _, p := range all {
		if !strings.Contains(strings.Join(old, " "), filepath.Base(p)) {
			fresh = append(fresh, p)
		}
	}
	if len(fresh) == 0 {
		t.Fatal("no segment was compressed by the current code")
	}
	for _, p := range fresh {
		if zstdChecksum(t, p) {
			t.Fatalf("%s: expected a frame without checksum", p)
		}
	}
	rep2 := requireClean(t, dir)
	recs2 := readAll(t, dir)
	if uint64(len(recs2)) != rep2.NextSeq || rep2.NextSeq <= rep.NextSeq+200 {
		t.Fatalf("after appending: read %d records, report %d, before %d", len(recs2), rep2.NextSeq, rep.NextSeq)
	}
	for i, r := range recs {
		if !bytes.Equal(recs2[i].Raw, r.Raw) {
			t.Fatalf("record %d changed after appending", r.Seq)
		}
	}
}
