package ledger

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"golang.org/x/mod/sumdb/note"
)

// sampleRun offers a fixed stream and returns what the ledger holds.
func sampleRun(t *testing.T, every, seed uint64) (records []*Record, offered map[string]int, alerts int) {
	dir := t.TempDir()
	l := openT(t, dir, Options{SampleEvery: every, Seed: seed, SummaryInterval: time.Hour})
	offered = map[string]int{}
	for i := 0; i < 20000; i++ {
		alert := i%13 == 0
		e := testEvent(i, alert)
		e.Sandbox.Name = fmt.Sprintf("sb%d", i%7)
		if alert {
			alerts++
		}
		offered[e.Sandbox.Name+"/"+string(e.Kind)]++
		if _, _, err := l.Append(e); err != nil {
			t.Fatal(err)
		}
		if i == 9999 {
			// A summary mid-way: counts restart after it.
			l.syncMu.Lock()
			l.mu.Lock()
			l.summaryLocked(time.Now())
			l.mu.Unlock()
			l.syncMu.Unlock()
		}
	}
	st := l.Stats()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	requireClean(t, dir)
	if st.Offered != 20000 || st.Kept+st.SampledOut != st.Offered {
		t.Fatalf("stats: %+v", st)
	}
	return readAll(t, dir), offered, alerts
}

func TestSampling(t *testing.T) {
	const every = 10
	recs, offered, alerts := sampleRun(t, every, 42)
	seen, kept := map[string]uint64{}, map[string]uint64{}
	written := map[string]uint64{}
	alertsWritten, summaries := 0, 0
	for _, r := range recs {
		e := r.Event
		switch {
		case e.Kind == audit.KindSampleSummary:
			summaries++
			for _, row := range e.Summary.Rows {
				seen[row.Sandbox+"/"+string(row.Kind)] += row.Seen
				kept[row.Sandbox+"/"+string(row.Kind)] += row.Kept
			}
		case e.Mechanism == "ledger":
		default:
			written[e.Sandbox.Name+"/"+string(e.Kind)]++
			if e.IsAlert() {
				alertsWritten++
			}
		}
	}
	if summaries != 2 {
		t.Fatalf("%d summaries, want 2", summaries)
	}
	if alertsWritten != alerts {
		t.Fatalf("%d alerts offered, %d written: an alert was sampled out", alerts, alertsWritten)
	}
	total := 0
	for k, n := range offered {
		if seen[k] != uint64(n) {
			t.Errorf("%s: offered %d, summaries say seen %d", k, n, seen[k])
		}
		if kept[k] != written[k] {
			t.Errorf("%s: summaries say kept %d, ledger holds %d", k, kept[k], written[k])
		}
		total += int(written[k])
	}
	// Roughly 1 in 10 routine plus every alert.
	routine := 20000 - alerts
	if want := routine/every + alerts; total < want-30 || total > want+30 {
		t.Fatalf("kept %d events, expected about %d", total, want)
	}
	// Deterministic given the seed; another seed keeps other events.
	same, _, _ := sampleRun(t, every, 42)
	other, _, _ := sampleRun(t, every, 43)
	msgs := func(rs []*Record) string {
		var b strings.Builder
		for _, r := range rs {
			if r.Event.Mechanism != "ledger" {
				b.WriteString(r.Event.Message + ",")
			}
		}
		return b.String()
	}
	if msgs(same) != msgs(recs) {
		t.Fatal("same seed kept different events")
	}
	if msgs(other) == msgs(recs) {
		t.Fatal("a different seed kept exactly the same events")
	}
}

func TestRotationCompressionRetention(t *testing.T) {
	dir := t.TempDir()
	opts := Options{SegmentMaxBytes: 16 << 10, Compress: true, SyncInterval: time.Millisecond}
	var last uint64
	for round := 0; round < 3; round++ {
		l := openT(t, dir, opts)
		for i := 0; i < 400; i++ {
			seq, _, err := l.Append(testEvent(round*1000+i, i%50 == 0))
			if err != nil {
				t.Fatal(err)
			}
			if round > 0 && i == 0 && seq != last+1 {
				// last already counts the final summary.
				t.Fatalf("round %d: first seq %d, last was %d", round, seq, last)
			}
			last = seq
			if i%40 == 0 {
				time.Sleep(2 * time.Millisecond) // let the ticker rotate
			}
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		last++ // summary
	}
	zst, _ := filepath.Glob(filepath.Join(dir, "seg-*.jsonl.zst"))
	plain, _ := filepath.Glob(filepath.Join(dir, "seg-*.jsonl"))
	if len(zst) < 3 || len(plain) != 1 {
		t.Fatalf("%d compressed and %d plain segments", len(zst), len(plain))
	}
	rep := requireClean(t, dir)
	if rep.NextSeq != last+1 || rep.FirstSeq != 0 || rep.Segments != len(zst)+1 {
		t.Fatalf("report %+v, last seq %d", rep, last)
	}
	if n := len(readAll(t, dir)); uint64(n) != rep.NextSeq {
		t.Fatalf("reader saw %d records", n)
	}

	// A compressed segment that was altered is caught.
	t.Run("corrupt-compressed", func(t *testing.T) {
		d := copyDir(t, dir)
		zs, _ := filepath.Glob(filepath.Join(d, "seg-*.jsonl.zst"))
		b, _ := os.ReadFile(zs[1])
		b[len(b)/2] ^= 0x10
		os.WriteFile(zs[1], b, 0o600)
		rep := verifyT(t, d)
		if rep.OK() || rep.FirstBad == nil || rep.FirstBad.File != zs[1] {
			t.Fatalf("got %v", rep.Problems)
		}
	})
	// Deleting the oldest segments without a retention record is caught.
	t.Run("head-deleted", func(t *testing.T) {
		d := copyDir(t, dir)
		zs, _ := filepath.Glob(filepath.Join(d, "seg-*.jsonl.zst"))
		os.Remove(zs[0])
		rep := verifyT(t, d)
		if rep.OK() || rep.FirstBad == nil || rep.FirstBad.Seq != 0 {
			t.Fatalf("got %v", rep.Problems)
		}
	})

	// Retention: keep about 40 KiB; a record says what goes.
	opts.Retention = Retention{MaxBytes: 40 << 10}
	l := openT(t, dir, opts)
	for i := 0; i < 400; i++ {
		l.Append(testEvent(5000+i, false))
		if i%40 == 0 {
			time.Sleep(2 * time.Millisecond)
		}
	}
	st := l.Stats()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if st.RemovedSegments == 0 {
		t.Fatalf("retention removed nothing: %+v", st)
	}
	rep = requireClean(t, dir)
	if rep.FirstSeq == 0 || rep.RemovedBefore < rep.FirstSeq {
		t.Fatalf("after retention: first %d, removed before %d", rep.FirstSeq, rep.RemovedBefore)
	}
	// Proofs still work for retained records.
	ck, _, err := LatestCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	v, _ := note.NewVerifier(pubKeyOf(t, dir))
	// A retained record (retention may have left only a few).
	p, err := Prove(dir, rep.FirstSeq+(rep.NextSeq-rep.FirstSeq)/2, ck, v)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := CheckProof(p, v); err != nil {
		t.Fatal(err)
	}
	if _, err := Prove(dir, 0, ck, v); err == nil {
		t.Fatal("proved a removed record")
	}
}

func TestProve(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, Options{})
	for i := 0; i < 1000; i++ {
		l.Append(testEvent(i, i%7 == 0))
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	ck, _, err := LatestCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	v, _ := note.NewVerifier(pubKeyOf(t, dir))
	for _, seq := range []uint64{0, 1, 500, 1000} {
		p, err := Prove(dir, seq, ck, v)
		if err != nil {
			t.Fatal(err)
		}
		_, rec, err := CheckProof(p, v)
		if err != nil {
			t.Fatalf("seq %d: %v", seq, err)
		}
		if rec.Seq != seq {
			t.Fatal("wrong record")
		}
		// An altered record or proof fails offline.
		bad := *p
		bad.Record = strings.Replace(p.Record, `"severity":"`, `"severity":"x`, 1)
		if _, _, err := CheckProof(&bad, v); err == nil {
			t.Fatalf("seq %d: altered record accepted", seq)
		}
		if len(p.Hashes) > 0 {
			bad = *p
			bad.Hashes = append(bad.Hashes[:0:0], p.Hashes...)
			bad.Hashes[0][0] ^= 1
			if _, _, err := CheckProof(&bad, v); err == nil {
				t.Fatalf("seq %d: altered proof accepted", seq)
			}
		}
	}
	if _, err := Prove(dir, 5000, ck, v); err == nil {
		t.Fatal("proved a record beyond the checkpoint")
	}
}

func TestRedactionInLedger(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, Options{})
	args := []string{"curl", "-H", "Authorization: Bearer abc.def.ghi", "https://api.example.com/?token=s3cr3tvalue&x=1",
		"--password", "hunter2", "AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"}
	e := testEvent(1, false)
	e.Process.Args = args
	e.Message = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----"
	orig := append([]string(nil), args...)
	if _, _, err := l.Append(e); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	for i := range args {
		if args[i] != orig[i] {
			t.Fatal("redaction changed the caller's slice")
		}
	}
	seg := onlySeg(t, dir)
	raw, _ := os.ReadFile(seg)
	for _, secret := range []string{"abc.def.ghi", "s3cr3tvalue", "hunter2", "AKIAIOSFODNN7EXAMPLE", "bPxRfiCYEXAMPLEKEY", "b3BlbnNzaC1rZXktdjEAAAAA"} {
		if bytes.Contains(raw, []byte(secret)) {
			t.Errorf("secret %q reached the ledger", secret)
		}
	}
	recs := readAll(t, dir)
	got := recs[1].Event
	if len(got.Redacted) != 6 || got.Message != "***" || got.Process.Args[3] != "https://api.example.com/?token=***&x=1" {
		t.Fatalf("redacted %v, args %q, message %q", got.Redacted, got.Process.Args, got.Message)
	}
	requireClean(t, dir)
}

func TestLossRecord(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, Options{SampleEvery: 1000})
	if err := l.RecordLoss("ringbuf_routine", 17); err != nil {
		t.Fatal(err)
	}
	l.Close()
	rep := requireClean(t, dir)
	if rep.LossRecords != 1 || rep.Lost != 17 {
		t.Fatalf("report: %d loss records, %d lost", rep.LossRecords, rep.Lost)
	}
}

func TestBadInput(t *testing.T) {
	t.Run("foreign-file", func(t *testing.T) {
		dir := t.TempDir()
		buildSmall(t, dir, Options{})
		f := filepath.Join(dir, "notes.txt")
		os.WriteFile(f, []byte("hello"), 0o600)
		if _, err := Open(dir, Options{}); err == nil || !strings.Contains(err.Error(), f) {
			t.Fatalf("Open: %v", err)
		}
		rep := requireClean(t, dir)
		if len(rep.Warnings) != 1 || !strings.Contains(rep.Warnings[0], f) {
			t.Fatalf("warnings %v", rep.Warnings)
		}
	})
	t.Run("missing-key", func(t *testing.T) {
		dir := t.TempDir()
		buildSmall(t, dir, Options{})
		key := filepath.Join(dir, defaultKeyName)
		os.Rename(key, key+".moved")
		defer os.Rename(key+".moved", key)
		_, err := Open(dir, Options{})
		if err == nil || !strings.Contains(err.Error(), key) || !strings.Contains(err.Error(), "missing") {
			t.Fatalf("Open: %v", err)
		}
	})
	t.Run("wrong-public-key", func(t *testing.T) {
		dir := t.TempDir()
		buildSmall(t, dir, Options{})
		other := t.TempDir()
		buildSmall(t, other, Options{})
		rep, err := Verify(dir, pubKeyOf(t, other), nil)
		if err != nil {
			t.Fatal(err)
		}
		if rep.OK() {
			t.Fatal("verified with another ledger's key")
		}
		if _, err := Verify(dir, "garbage", nil); err == nil {
			t.Fatal("bad key accepted")
		}
	})
	t.Run("corrupt-header", func(t *testing.T) {
		dir := t.TempDir()
		buildSmall(t, dir, Options{})
		seg := onlySeg(t, dir)
		b, _ := os.ReadFile(seg)
		b[5] = 'X'
		os.WriteFile(seg, b, 0o600)
		if _, err := Open(dir, Options{}); err == nil || !strings.Contains(err.Error(), seg) {
			t.Fatalf("Open: %v", err)
		}
		rep := verifyT(t, dir)
		if rep.OK() || rep.FirstBad.File != seg || rep.FirstBad.Offset != 0 {
			t.Fatalf("got %v", rep.Problems)
		}
	})
	t.Run("corrupt-middle-not-cut", func(t *testing.T) {
		dir := t.TempDir()
		buildSmall(t, dir, Options{})
		seg := onlySeg(t, dir)
		hdr, recs := segLines(t, seg)
		recs[4] = []byte("garbage\n")
		writeSeg(t, seg, hdr, recs)
		before, _ := os.ReadFile(seg)
		_, err := Open(dir, Options{})
		if err == nil || !strings.Contains(err.Error(), seg) || !strings.Contains(err.Error(), "refusing") {
			t.Fatalf("Open: %v", err)
		}
		after, _ := os.ReadFile(seg)
		if !bytes.Equal(before, after) {
			t.Fatal("Open changed a corrupt segment")
		}
	})
	t.Run("not-a-ledger", func(t *testing.T) {
		if _, err := Verify(t.TempDir(), pubKeyOf(t, func() string { d := t.TempDir(); buildSmall(t, d, Options{}); return d }()), nil); err == nil {
			t.Fatal("empty directory verified")
		}
	})
	t.Run("locked", func(t *testing.T) {
		dir := t.TempDir()
		l := openT(t, dir, Options{})
		defer l.Close()
		if _, err := Open(dir, Options{}); err == nil || !strings.Contains(err.Error(), "in use") {
			t.Fatalf("second Open: %v", err)
		}
	})
	t.Run("closed", func(t *testing.T) {
		l := openT(t, t.TempDir(), Options{})
		l.Close()
		if err := l.Notify(testEvent(1, false)); !errors.Is(err, ErrClosed) {
			t.Fatalf("Notify after Close: %v", err)
		}
	})
}

func TestHugeEventIsCut(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, Options{})
	e := testEvent(1, true)
	e.Process.Args = []string{strings.Repeat("a", 3<<20)}
	e.Sandbox.Labels = map[string]string{"big": strings.Repeat("b", 2<<20)}
	if _, _, err := l.Append(e); err != nil {
		t.Fatal(err)
	}
	l.Close()
	recs := readAll(t, dir)
	if got := recs[1].Event; !strings.Contains(got.Message, "too large") || got.Verdict != audit.VerdictDenied {
		t.Fatalf("got %+v", got)
	}
	requireClean(t, dir)
}

// Events carry the time they happened, which may be long ago: segment age
// goes by the wall clock, so old event times must not rotate every tick.
func TestOldEventTimesDoNotRotate(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, Options{SyncInterval: time.Millisecond})
	for i := 0; i < 50; i++ {
		l.Append(testEvent(i, false)) // timestamps in 2023
		time.Sleep(time.Millisecond)
	}
	st := l.Stats()
	l.Close()
	if st.Segments != 1 {
		t.Fatalf("%d segments for 50 events", st.Segments)
	}
}
