package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/ledger"
)

func ledgerCLI(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var o, e bytes.Buffer
	err := run(context.Background(), args, &o, &e)
	code = 0
	if err != nil && !errors.Is(err, errHelpShown) {
		code = 1
		var ee *exitError
		if errors.As(err, &ee) {
			code = ee.Code
		}
		e.WriteString(err.Error())
	}
	return o.String(), e.String(), code
}

// makeLedger writes a small ledger with a mix of events.
func makeTestLedger(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "ledger")
	l, err := ledger.Open(dir, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	base := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	for i := 0; i < 50; i++ {
		e := audit.Event{Time: base.Add(time.Duration(i) * time.Minute), Kind: audit.KindFileOpen,
			Verdict: audit.VerdictAllowed, Severity: audit.SeverityRoutine,
			Sandbox: audit.Sandbox{Name: []string{"alpha", "beta"}[i%2]},
			Process: audit.Process{PID: uint32(100 + i), Comm: "cat"},
			File:    &audit.FileDetail{Path: "/work/f" + string(rune('a'+i%26))}}
		if i%10 == 5 {
			e.Kind, e.Verdict, e.Rule, e.File = audit.KindDNS, audit.VerdictDenied, "no-exfil", nil
			e.DNS = &audit.DNSDetail{Name: "x.evil.example", QType: "TXT"}
		}
		if _, _, err := l.Append(e); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestVerifyCommand(t *testing.T) {
	dir := makeTestLedger(t)
	out, _, code := ledgerCLI(t, "verify", dir)
	if code != 0 || !strings.Contains(out, "OK") || !strings.Contains(out, "52 checked") {
		t.Fatalf("clean ledger: code %d\n%s", code, out)
	}
	// JSON report, and an exported public key passed explicitly.
	pub := filepath.Join(t.TempDir(), "ledger.pub")
	keyOut, _, code := ledgerCLI(t, "ledger", "pubkey", dir)
	if code != 0 {
		t.Fatal(keyOut)
	}
	os.WriteFile(pub, []byte(keyOut), 0o644)
	out, _, code = ledgerCLI(t, "verify", "--json", "--pubkey", pub, dir)
	var rep ledger.Report
	if code != 0 || json.Unmarshal([]byte(out), &rep) != nil || rep.Records != 52 {
		t.Fatalf("json: code %d %s", code, out)
	}

	// Tampered: exit 1 naming record and offset.
	segs, _ := filepath.Glob(filepath.Join(dir, "seg-*"))
	data, _ := os.ReadFile(segs[0])
	i := bytes.Index(data, []byte(`"x.evil.example"`))
	tampered := bytes.Replace(data, []byte(`"x.evil.example"`), []byte(`"x.good.example"`), 1)
	os.WriteFile(segs[0], tampered, 0o600)
	lineStart := int64(bytes.LastIndexByte(data[:i], '\n') + 1)
	out, errOut, code := ledgerCLI(t, "verify", "--pubkey", pub, dir)
	if code != 1 || !strings.Contains(out, "TAMPERED") || !strings.Contains(errOut, "record 6 in "+segs[0]) ||
		!strings.Contains(errOut, "offset "+ledgerItoa(lineStart)) {
		t.Fatalf("tampered: code %d\n%s\n%s", code, out, errOut)
	}
	os.WriteFile(segs[0], data, 0o600)

	// Unreadable: exit 2 naming the problem.
	if _, errOut, code := ledgerCLI(t, "verify", filepath.Join(dir, "nope")); code != 2 || !strings.Contains(errOut, "nope") {
		t.Fatalf("missing dir: code %d %s", code, errOut)
	}
	if _, errOut, code := ledgerCLI(t, "verify", "--pubkey", filepath.Join(dir, "missing.pub"), dir); code != 2 || !strings.Contains(errOut, "missing.pub") {
		t.Fatalf("missing key: code %d %s", code, errOut)
	}
	if _, _, code := ledgerCLI(t, "verify", t.TempDir(), "--pubkey", pub); code != 2 {
		t.Fatalf("empty dir: code %d", code)
	}
}

func ledgerItoa(n int64) string { return strconv.FormatInt(n, 10) }

func TestVerifyProgress(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "big")
	l, err := ledger.Open(dir, ledger.Options{SegmentMaxBytes: 16 << 20})
	if err != nil {
		t.Fatal(err)
	}
	e := audit.Event{Kind: audit.KindExec, Verdict: audit.VerdictAllowed, Severity: audit.SeverityRoutine,
		Process: audit.Process{Comm: "sh", Args: []string{"sh", "-c", strings.Repeat("echo hello; ", 40)}}}
	for i := 0; i < 160_000; i++ { // ~ 100 MB
		l.Append(e)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	_, errOut, code := ledgerCLI(t, "verify", dir)
	if code != 0 || !strings.Contains(errOut, "verify: 100%") {
		t.Fatalf("code %d, stderr:\n%s", code, errOut)
	}
}

func TestLedgerCat(t *testing.T) {
	dir := makeTestLedger(t)
	out, _, code := ledgerCLI(t, "ledger", "cat", dir)
	if code != 0 || strings.Count(out, "\n") != 52 {
		t.Fatalf("cat: code %d, %d lines", code, strings.Count(out, "\n"))
	}
	out, _, _ = ledgerCLI(t, "ledger", "cat", "--verdict", "denied", dir)
	if strings.Count(out, "\n") != 5 || !strings.Contains(out, "name=x.evil.example") || !strings.Contains(out, "rule=no-exfil") {
		t.Fatalf("denied:\n%s", out)
	}
	// Flags after the directory, several filters, JSON lines as stored.
	out, _, _ = ledgerCLI(t, "replay", dir, "--kind", "file_open", "--sandbox", "alpha",
		"--since", "2025-03-01T12:10:00Z", "--until", "2025-03-01T12:20:00Z", "--json")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 5 { // alpha is at even minutes: 10, 12, 14, 16, 18
		t.Fatalf("filtered replay: %d lines:\n%s", len(lines), out)
	}
	for _, ln := range lines {
		rec, err := ledger.DecodeRecord([]byte(ln))
		if err != nil {
			t.Fatal(err)
		}
		if rec.Event.Sandbox.Name != "alpha" || rec.Event.Kind != audit.KindFileOpen {
			t.Fatalf("filter let through %s", ln)
		}
	}
	if _, errOut, code := ledgerCLI(t, "ledger", "cat", "--verdict", "maybe", dir); code != 2 || !strings.Contains(errOut, "maybe") {
		t.Fatalf("bad verdict: %d %s", code, errOut)
	}
	if _, _, code := ledgerCLI(t, "ledger", "cat", "--help"); code != 0 {
		t.Fatalf("help exit %d", code)
	}
}

func TestLedgerProve(t *testing.T) {
	dir := makeTestLedger(t)
	out, errOut, code := ledgerCLI(t, "ledger", "prove", dir, "6")
	if code != 0 {
		t.Fatalf("prove: %d %s", code, errOut)
	}
	proof := filepath.Join(t.TempDir(), "proof.json")
	os.WriteFile(proof, []byte(out), 0o644)
	pub := filepath.Join(t.TempDir(), "pub")
	key, _, _ := ledgerCLI(t, "ledger", "pubkey", "--key", filepath.Join(dir, "ledger.key"))
	os.WriteFile(pub, []byte(key), 0o644)
	out, errOut, code = ledgerCLI(t, "ledger", "check-proof", "--pubkey", pub, proof)
	if code != 0 || !strings.Contains(out, "ok: record 6") || !strings.Contains(out, "x.evil.example") {
		t.Fatalf("check-proof: %d %s %s", code, out, errOut)
	}
	// An edited proof fails.
	data, _ := os.ReadFile(proof)
	os.WriteFile(proof, bytes.Replace(data, []byte("x.evil.example"), []byte("x.good.example"), 1), 0o644)
	if _, _, code := ledgerCLI(t, "ledger", "check-proof", "--pubkey", pub, proof); code != 1 {
		t.Fatalf("edited proof: exit %d", code)
	}
	// Another key does not verify it.
	other := filepath.Join(t.TempDir(), "other.key")
	okey, _, code := ledgerCLI(t, "ledger", "keygen", other)
	if code != 0 {
		t.Fatal(okey)
	}
	if st, _ := os.Stat(other); st.Mode().Perm() != 0o600 {
		t.Fatalf("key mode %v", st.Mode())
	}
	os.WriteFile(pub, []byte(okey), 0o644)
	os.WriteFile(proof, data, 0o644)
	if _, _, code := ledgerCLI(t, "ledger", "check-proof", "--pubkey", pub, proof); code != 1 {
		t.Fatalf("foreign key: exit %d", code)
	}
	if ck, _, code := ledgerCLI(t, "ledger", "checkpoint", dir); code != 0 || !strings.HasPrefix(ck, "watcher-ledger/") {
		t.Fatalf("checkpoint: %d %s", code, ck)
	}
	if _, _, code := ledgerCLI(t, "ledger", "prove", dir, "999"); code != 1 {
		t.Fatalf("prove beyond end: exit %d", code)
	}
}
