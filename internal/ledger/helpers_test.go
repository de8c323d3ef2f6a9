package ledger

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
)

var kinds = []audit.Kind{audit.KindFileOpen, audit.KindExec, audit.KindNet, audit.KindDNS}

// testEvent builds a realistic event; i makes it unique.
func testEvent(i int, alert bool) audit.Event {
	e := audit.Event{
		Time:      time.Unix(1_700_000_000, int64(i)*1000).UTC(),
		Kind:      kinds[i%len(kinds)],
		Verdict:   audit.VerdictAllowed,
		Severity:  audit.SeverityRoutine,
		Mechanism: "tracepoint",
		Sandbox:   audit.Sandbox{CgroupID: 4242, Name: fmt.Sprintf("sb%d", i%3)},
		Process: audit.Process{PID: uint32(1000 + i%50), TGID: uint32(1000 + i%50), PPID: 1, UID: 1000,
			Comm: "python3", Exe: "/usr/bin/python3.12", Args: []string{"python3", "-c", "import os; os.listdir('.')"}},
		File:    &audit.FileDetail{Path: fmt.Sprintf("/home/agent/work/file-%d.txt", i), Flags: 0o100},
		Message: fmt.Sprintf("event %d", i),
	}
	if alert {
		e.Verdict, e.Severity, e.Rule, e.Mechanism = audit.VerdictDenied, audit.SeverityAlert, "deny-ssh-keys", "lsm"
		e.File.Path = "/root/.ssh/id_ed25519"
	}
	return e
}

func openT(t testing.TB, dir string, opts Options) *Ledger {
	t.Helper()
	l, err := Open(dir, opts)
	if err != nil {
		t.Fatalf("Open(%s): %v", dir, err)
	}
	return l
}

func pubKeyOf(t testing.TB, dir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, pubKeyName))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func verifyT(t testing.TB, dir string) *Report {
	t.Helper()
	rep, err := Verify(dir, pubKeyOf(t, dir), nil)
	if err != nil {
		t.Fatalf("Verify(%s): %v", dir, err)
	}
	return rep
}

func requireClean(t testing.TB, dir string) *Report {
	t.Helper()
	rep := verifyT(t, dir)
	if !rep.OK() {
		for _, p := range rep.Problems {
			t.Errorf("problem: %s", p)
		}
		t.FailNow()
	}
	return rep
}

// readAll returns every record via the Reader.
func readAll(t testing.TB, dir string) []*Record {
	t.Helper()
	r, err := NewReader(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var out []*Record
	for {
		rec, err := r.Next()
		if err != nil {
			if err.Error() == "EOF" {
				return out
			}
			t.Fatalf("read: %v", err)
		}
		out = append(out, rec)
	}
}

func segFiles(t testing.TB, dir string) []string {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(dir, "seg-*"))
	return m
}

// checkpointFiles lists the checkpoint files of dir: the latest, the
// history and any legacy ckpt-*.note.
func checkpointFiles(t testing.TB, dir string) []string {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(dir, "ckpt-*"))
	for _, n := range []string{latestName, historyName} {
		if _, err := os.Stat(filepath.Join(dir, n)); err == nil {
			m = append(m, filepath.Join(dir, n))
		}
	}
	if len(m) == 0 {
		t.Fatalf("no checkpoint files in %s", dir)
	}
	return m
}
