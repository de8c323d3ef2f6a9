package witness_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/ledger"
	"github.com/watcherhq/watcher/internal/witness"
	"github.com/watcherhq/watcher/internal/witness/witnesstest"
)

func event(i int, tag string) audit.Event {
	return audit.Event{Time: time.Unix(1_700_000_000, int64(i)).UTC(), Kind: audit.KindFileOpen, Verdict: audit.VerdictAllowed,
		Severity: audit.SeverityRoutine, Mechanism: "tracepoint", Sandbox: audit.Sandbox{Name: "sb"},
		File: &audit.FileDetail{Path: fmt.Sprintf("/work/%s-%d", tag, i)}, Message: tag}
}

func openLedger(t *testing.T, dir string) *ledger.Ledger {
	t.Helper()
	l, err := ledger.Open(dir, ledger.Options{SyncInterval: 5 * time.Millisecond, CheckpointInterval: time.Hour, SummaryInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func appendN(t *testing.T, l *ledger.Ledger, from, n int, tag string) *ledger.Checkpoint {
	t.Helper()
	for i := from; i < from+n; i++ {
		if _, _, err := l.Append(event(i, tag)); err != nil {
			t.Fatal(err)
		}
	}
	c, err := l.Checkpoint()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

type alerts chan audit.Event

func (a alerts) notify(e audit.Event) { a <- e }

func startCosigner(t *testing.T, l *ledger.Ledger, w *witnesstest.Witness, al alerts) *witness.Cosigner {
	t.Helper()
	wit, err := witness.New(w.URL, w.VKey)
	if err != nil {
		t.Fatal(err)
	}
	c := witness.Start(l, witness.Options{Witnesses: []*witness.Witness{wit}, Notify: al.notify,
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 200 * time.Millisecond})
	t.Cleanup(c.Stop)
	return c
}

func waitCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func verify(t *testing.T, dir string, witnesses ...string) *ledger.Report {
	t.Helper()
	pub, err := os.ReadFile(filepath.Join(dir, "ledger.pub"))
	if err != nil {
		t.Fatal(err)
	}
	rep, err := ledger.VerifyDir(dir, ledger.VerifyOptions{PubKey: string(pub), Witnesses: witnesses})
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func noAlert(t *testing.T, al alerts) {
	t.Helper()
	select {
	case e := <-al:
		t.Fatalf("unexpected alert: %s", e.Message)
	default:
	}
}

// Checkpoints get cosigned by the real witness, first from size 0 and
// then with a consistency proof from the size it cosigned; verify with
// the witness key accepts the ledger, with another key or an altered
// cosignature it does not.
func TestCosignedByRealWitness(t *testing.T) {
	w := witnesstest.Start(t)
	dir := t.TempDir()
	l := openLedger(t, dir)
	w.AddLog("watcher-ledger/"+l.ID(), l.PublicKey())
	al := make(alerts, 16)
	cs := startCosigner(t, l, w, al)
	ctx := waitCtx(t)

	c1 := appendN(t, l, 0, 25, "a")
	if err := cs.Wait(ctx, c1.Size, 1); err != nil {
		t.Fatalf("%v\nwitness log:\n%s", err, w.Log())
	}
	c2 := appendN(t, l, 25, 300, "b") // crosses a full tile
	if err := cs.Wait(ctx, c2.Size, 1); err != nil {
		t.Fatalf("%v\nwitness log:\n%s", err, w.Log())
	}
	if got := w.Size("watcher-ledger/" + l.ID()); got != int64(c2.Size) {
		t.Fatalf("witness holds size %d, want %d", got, c2.Size)
	}
	last := l.LastCheckpoint()
	if last.Size != c2.Size || !bytes.Contains(last.Cosigs, []byte("— "+w.Name+" ")) {
		t.Fatalf("latest checkpoint %d lacks the cosignature: %q", last.Size, last.Cosigs)
	}
	stored, err := os.ReadFile(filepath.Join(dir, "checkpoint"))
	if err != nil || !bytes.Equal(stored, last.Cosigned()) {
		t.Fatalf("DIR/checkpoint %q, %v; want the cosigned note", stored, err)
	}
	cs.Stop()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	noAlert(t, al)

	rep := verify(t, dir, w.VKey)
	if !rep.OK() || rep.Witnessed != c2.Size || len(rep.WitnessedBy) != 1 || rep.WitnessedBy[0] != w.Name {
		t.Fatalf("verify --witness: ok=%v witnessed=%d by %v, problems %v", rep.OK(), rep.Witnessed, rep.WitnessedBy, rep.Problems)
	}
	// Another witness's key: not witnessed.
	other := witnesstest.Start(t)
	if rep := verify(t, dir, other.VKey); rep.OK() || !strings.Contains(rep.Problems[0].Reason, "not witnessed") {
		t.Fatalf("verify with an unrelated witness key passed: %v", rep.Problems)
	}
	// An altered cosignature (in the key hash, the timestamp or the
	// signature proper) is caught, and reported against its file.
	for _, at := range []int{3, 14, 40} {
		i := bytes.LastIndex(stored, []byte(" ")) + 1 + at
		bad := append([]byte(nil), stored...)
		bad[i] ^= 0x01
		if err := os.WriteFile(filepath.Join(dir, "checkpoint"), bad, 0o644); err != nil {
			t.Fatal(err)
		}
		if rep := verify(t, dir, w.VKey); rep.OK() || rep.Problems[0].File != filepath.Join(dir, "checkpoint") || !strings.Contains(rep.Problems[0].Reason, "cosignature") {
			t.Fatalf("altered cosignature at %d: %v", at, rep.Problems)
		}
	}
}

// A fork: the host's root cuts the ledger back and writes other records
// in their place, re-signed with the ledger key. The witness refuses the
// new checkpoint (the agent reports an alert) and verify with the witness
// key fails, while the ledger key alone is satisfied.
func TestForkRefusedByWitness(t *testing.T) {
	for _, tc := range []struct {
		name   string
		extra  int // records written after the cut
		reason string
	}{
		{"rewritten-and-extended", 60, "rewritten"},
		{"truncated", 5, "removed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := witnesstest.Start(t)
			dir := t.TempDir()
			l := openLedger(t, dir)
			origin := "watcher-ledger/" + l.ID()
			w.AddLog(origin, l.PublicKey())
			al := make(alerts, 16)
			cs := startCosigner(t, l, w, al)
			ctx := waitCtx(t)
			c := appendN(t, l, 0, 40, "honest")
			if err := cs.Wait(ctx, c.Size, 1); err != nil {
				t.Fatal(err)
			}
			cs.Stop()
			l.Close()
			cosigned := w.Size(origin)

			// The rewrite: cut after record 20, drop the evidence,
			// append other records with the real ledger code and key.
			const keep = 20
			cutAfter(t, dir, keep)
			l = openLedger(t, dir)
			forked := appendN(t, l, keep, tc.extra, "forged")
			cs = startCosigner(t, l, w, al)
			select {
			case e := <-al:
				if e.Severity != audit.SeverityAlert || e.Mechanism != "witness" || !strings.Contains(e.Message, tc.reason) {
					t.Fatalf("alert %+v", e)
				}
				t.Logf("alert: %s", e.Message)
			case <-ctx.Done():
				t.Fatalf("no alert; status %+v\nwitness log:\n%s", cs.Status(), w.Log())
			}
			if st := cs.Status()[0]; !st.Refused || st.Cosigned >= forked.Size && forked.Size > uint64(cosigned) {
				t.Fatalf("status %+v", st)
			}
			cs.Stop()
			l.Close()
			if got := w.Size(origin); got != cosigned {
				t.Fatalf("witness moved from %d to %d", cosigned, got)
			}
			if rep := verify(t, dir); !rep.OK() {
				t.Fatalf("the ledger key alone should accept the re-signed fork: %v", rep.Problems)
			}
			rep := verify(t, dir, w.VKey)
			if rep.OK() {
				t.Fatal("verify --witness accepted the fork")
			}
			t.Logf("verify --witness: %s", rep.Problems[0])
		})
	}
}

// cutAfter truncates the ledger's only segment after record n and
// removes the checkpoints, as an attacker covering a rewrite would.
func cutAfter(t *testing.T, dir string, n int) {
	t.Helper()
	segs, _ := filepath.Glob(filepath.Join(dir, "seg-*.jsonl"))
	if len(segs) != 1 {
		t.Fatalf("segments %v", segs)
	}
	data, err := os.ReadFile(segs[0])
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.SplitAfter(data, []byte("\n"))
	var out []byte
	for _, ln := range lines[:1+n] { // header + n records
		out = append(out, ln...)
	}
	if err := os.WriteFile(segs[0], out, 0o600); err != nil {
		t.Fatal(err)
	}
	cks, _ := filepath.Glob(filepath.Join(dir, "ckpt-*"))
	for _, c := range append(cks, filepath.Join(dir, "checkpoint"), filepath.Join(dir, "checkpoints")) {
		os.Remove(c)
	}
}

// A witness that is down delays cosigning but loses nothing: the
// checkpoints signed meanwhile are covered by the one it cosigns when it
// is back (with a consistency proof from size 0).
func TestWitnessDownThenUp(t *testing.T) {
	w := witnesstest.Start(t)
	dir := t.TempDir()
	l := openLedger(t, dir)
	t.Cleanup(func() { l.Close() }) // after the cosigner stops
	origin := "watcher-ledger/" + l.ID()
	w.AddLog(origin, l.PublicKey())
	w.Stop()
	al := make(alerts, 16)
	cs := startCosigner(t, l, w, al)
	ctx := waitCtx(t)
	c1 := appendN(t, l, 0, 10, "while-down")
	// Wait for three failed attempts (backoff retries; the third is
	// reported).
	for cs.Status()[0].Failures < 3 {
		if ctx.Err() != nil {
			t.Fatal("no failed attempts recorded")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if st := cs.Status()[0]; st.Cosigned != 0 || st.LastError == "" {
		t.Fatalf("status while down: %+v", st)
	}
	c2 := appendN(t, l, 10, 10, "still-down")
	if c2.Size <= c1.Size {
		t.Fatal("no new checkpoint")
	}
	w.Restart()
	if err := cs.Wait(ctx, c2.Size, 1); err != nil {
		t.Fatalf("%v; status %+v", err, cs.Status())
	}
	if got := w.Size(origin); got != int64(c2.Size) {
		t.Fatalf("witness at %d, want %d", got, c2.Size)
	}
	// The outage was reported once, as a notice, and its end too; no alert.
	var notices []string
	for len(al) > 0 {
		e := <-al
		if e.Severity == audit.SeverityAlert {
			t.Fatalf("alert for an outage: %s", e.Message)
		}
		notices = append(notices, e.Message)
	}
	if len(notices) != 2 || !strings.Contains(notices[0], "unreachable") || !strings.Contains(notices[1], "reachable again") {
		t.Fatalf("notices %q", notices)
	}
	// Later checkpoints continue from the witnessed size.
	c3 := appendN(t, l, 20, 10, "up")
	if err := cs.Wait(ctx, c3.Size, 1); err != nil {
		t.Fatal(err)
	}
	if st := cs.Status()[0]; st.Failures != 0 || st.Cosigned != c3.Size {
		t.Fatalf("status after recovery: %+v", st)
	}
}

// A run proof (the tlog-proof bundle of some records) checks offline with
// only the witness key, and fails after any changed byte: of a record, a
// proof hash, the checkpoint, a signature, or the framing.
func TestRunProof(t *testing.T) {
	w := witnesstest.Start(t)
	dir := t.TempDir()
	l := openLedger(t, dir)
	w.AddLog("watcher-ledger/"+l.ID(), l.PublicKey())
	cs := startCosigner(t, l, w, make(alerts, 16))
	appendN(t, l, 0, 100, "before")
	appendN(t, l, 100, 5, "run")
	c := appendN(t, l, 105, 200, "after")
	if err := cs.Wait(waitCtx(t), c.Size, 1); err != nil {
		t.Fatal(err)
	}
	cs.Stop()
	c = l.LastCheckpoint()
	recs, _, err := ledger.RunRecords(dir, 0, func(r *ledger.Record) bool { return r.Event.Message == "run" })
	if err != nil || len(recs) != 5 {
		t.Fatalf("run records: %d, %v", len(recs), err)
	}
	bundle, err := ledger.BuildRunProof(dir, c, l.PublicKey(), recs)
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	opts := ledger.RunProofOptions{Witnesses: []string{w.VKey}}
	res, err := ledger.CheckRunProof(bundle, opts)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Records) != 5 || res.Records[0].Seq != recs[0].Seq || res.Records[0].Event.File.Path != "/work/run-100" || len(res.WitnessedBy) != 1 {
		t.Fatalf("checked %d records from %d, by %v", len(res.Records), res.Records[0].Seq, res.WitnessedBy)
	}
	// Not trusted: another witness's key, or a pinned ledger key that is
	// not the one used.
	other := witnesstest.Start(t)
	if _, err := ledger.CheckRunProof(bundle, ledger.RunProofOptions{Witnesses: []string{other.VKey}}); err == nil {
		t.Fatal("checked with an unrelated witness key")
	}
	otherDir := t.TempDir()
	ol := openLedger(t, otherDir)
	ol.Close()
	if _, err := ledger.CheckRunProof(bundle, ledger.RunProofOptions{Witnesses: []string{w.VKey}, PubKey: ol.PublicKey()}); err == nil {
		t.Fatal("checked with another ledger's key pinned")
	}
	// Every byte.
	flips := 0
	for p := range bundle {
		bit := byte(1 << (p % 8))
		bundle[p] ^= bit
		if _, err := ledger.CheckRunProof(bundle, opts); err == nil {
			t.Fatalf("flip of bit %#x at byte %d (%q) not detected", bit, p, bundle[max(0, p-20):min(len(bundle), p+20)])
		}
		bundle[p] ^= bit
		flips++
	}
	// Cut or extended.
	for _, b := range [][]byte{bundle[:len(bundle)-1], append(append([]byte(nil), bundle...), '\n'), bundle[:len(bundle)/2]} {
		if _, err := ledger.CheckRunProof(b, opts); err == nil {
			t.Fatalf("bundle of %d bytes (of %d) accepted", len(b), len(bundle))
		}
	}
	if _, err := ledger.CheckRunProof(bundle, opts); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d single-bit flips over a %d-byte bundle of %d records, all refused", flips, len(bundle), len(recs))
}
