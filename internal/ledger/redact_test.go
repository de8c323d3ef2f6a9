package ledger

import (
	"bytes"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/pipeline"
)

// TestNoSecretReachesTheFile: whichever way an event comes in (Append and
// Notify redact on append; the pipeline's redact stage redacts once and
// its ledger sink appends with AppendRedacted), no secret reaches a
// segment, and every record says which fields were redacted.
func TestNoSecretReachesTheFile(t *testing.T) {
	secrets := []string{"abc.def.ghi", "s3cr3tvalue", "hunter2"}
	leaky := func(msg string) audit.Event {
		e := testEvent(1, true)
		e.Process.Args = []string{"curl", "-H", "Authorization: Bearer abc.def.ghi",
			"https://api.example.com/?token=s3cr3tvalue", "--password", "hunter2"}
		e.Message = msg
		return e
	}
	dir := t.TempDir()
	l := openT(t, dir, Options{})
	if _, _, err := l.Append(leaky("append")); err != nil {
		t.Fatal(err)
	}
	if err := l.Notify(leaky("notify")); err != nil {
		t.Fatal(err)
	}
	p := pipeline.New([]pipeline.Stage{{Name: "redact", Run: pipeline.Redact}}, pipeline.LedgerSink{Ledger: l})
	ev := leaky("pipeline")
	p.Emit(&ev)
	if err := p.Close(); err != nil { // closes the ledger
		t.Fatal(err)
	}
	raw, err := os.ReadFile(onlySeg(t, dir))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range secrets {
		if bytes.Contains(raw, []byte(s)) {
			t.Errorf("secret %q reached the ledger", s)
		}
	}
	var paths []string
	for _, r := range readAll(t, dir) {
		if r.Event.Severity != audit.SeverityAlert || r.Event.Kind == audit.KindLoss {
			continue
		}
		paths = append(paths, r.Event.Message)
		if len(r.Event.Redacted) != 3 {
			t.Errorf("%s: redacted %q, want 3 fields, each once", r.Event.Message, r.Event.Redacted)
		}
	}
	if !slices.Equal(paths, []string{"append", "notify", "pipeline"}) {
		t.Fatalf("records %q", paths)
	}
	requireClean(t, dir)
}

// TestAppendRedactedLeavesTheEvent: the pipeline's event is appended as
// it is and not changed (later sinks see it), even when it is cut to fit
// the record limit or has no time yet.
func TestAppendRedactedLeavesTheEvent(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, Options{})
	e := testEvent(1, false)
	e.Message = strings.Repeat("m", MaxRecordBytes)
	e.Redacted = make([]string, 0, 4)
	before := e
	if _, _, err := l.AppendRedacted(&e); err != nil {
		t.Fatal(err)
	}
	noTime := testEvent(2, false)
	noTime.Time = time.Time{}
	if _, _, err := l.AppendRedacted(&noTime); err != nil {
		t.Fatal(err)
	}
	if !noTime.Time.IsZero() {
		t.Fatal("the caller's event got a time")
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if e.Message != before.Message || len(e.Redacted) != 0 || slices.Contains(e.Redacted[:cap(e.Redacted)], "truncated") {
		t.Fatalf("the caller's event was changed: message %d bytes, redacted %q", len(e.Message), e.Redacted[:cap(e.Redacted)])
	}
	recs := readAll(t, dir)
	if got := recs[1].Event; len(got.Message) >= MaxRecordBytes || !slices.Contains(got.Redacted, "truncated") {
		t.Fatalf("record: message %d bytes, redacted %q: not cut to fit", len(got.Message), got.Redacted)
	}
	if recs[2].Event.Time.IsZero() {
		t.Fatal("a record without a time")
	}
}
