package main

import (
	"context"
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

// witnessedLedger writes a ledger whose checkpoint the real witness w
// cosigned.
func witnessedLedger(t *testing.T, w *witnesstest.Witness) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "ledger")
	l, err := ledger.Open(dir, ledger.Options{SyncInterval: 5 * time.Millisecond, SummaryInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	w.AddLog("watcher-ledger/"+l.ID(), l.PublicKey())
	wit, err := witness.New(w.URL, w.VKey)
	if err != nil {
		t.Fatal(err)
	}
	cs := witness.Start(l, witness.Options{Witnesses: []*witness.Witness{wit}, MinBackoff: 10 * time.Millisecond})
	defer cs.Stop()
	for i := 0; i < 30; i++ {
		l.Append(audit.Event{Kind: audit.KindExec, Verdict: audit.VerdictAllowed, Process: audit.Process{PID: uint32(i), Comm: "sh"}})
	}
	c, err := l.Checkpoint()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := cs.Wait(ctx, c.Size, 1); err != nil {
		t.Fatalf("%v\n%s", err, w.Log())
	}
	return dir
}

func TestVerifyWitnessCLI(t *testing.T) {
	w := witnesstest.Start(t)
	other := witnesstest.Start(t)
	dir := witnessedLedger(t, w)
	keyFile := filepath.Join(t.TempDir(), "witness.vkey")
	os.WriteFile(keyFile, []byte(w.VKey+"\n"), 0o644)

	out, errOut, code := ledgerCLI(t, "verify", "--witness", w.VKey, dir)
	if code != 0 || !strings.Contains(out, "witnessed records 0..") || !strings.Contains(out, w.Name) {
		t.Fatalf("verify --witness: %d\n%s\n%s", code, out, errOut)
	}
	if _, errOut, code := ledgerCLI(t, "verify", "--witness", keyFile, "--witness", other.VKey, "--quorum", "1", dir); code != 0 {
		t.Fatalf("quorum 1 of 2 from a key file: %d %s", code, errOut)
	}
	if out, _, code := ledgerCLI(t, "verify", "--witness", keyFile, "--witness", other.VKey, dir); code != 1 || !strings.Contains(out, "not witnessed") {
		t.Fatalf("quorum 2 of 2 with one cosignature: %d\n%s", code, out)
	}
	if _, errOut, code := ledgerCLI(t, "verify", "--witness", "not-a-key", dir); code != 2 || !strings.Contains(errOut, "not-a-key") {
		t.Fatalf("bad key: %d %s", code, errOut)
	}
	if _, _, code := ledgerCLI(t, "verify", "--witness", w.VKey, "--quorum", "2", dir); code != 2 {
		t.Fatalf("quorum above the keys given: %d", code)
	}
}
