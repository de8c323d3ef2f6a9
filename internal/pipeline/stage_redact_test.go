package pipeline

import (
	"slices"
	"testing"

	"github.com/watcherhq/watcher/internal/audit"
)

// TestRedactStage: the stage replaces secrets in place and lists the
// fields it touched; it never drops an event.
func TestRedactStage(t *testing.T) {
	ev := audit.Event{Kind: audit.KindExec, Message: "login --password hunter2",
		Process: audit.Process{Args: []string{"login", "--password", "hunter2"}}}
	if !Redact(&ev) {
		t.Fatal("redact dropped the event")
	}
	if slices.Contains(ev.Process.Args, "hunter2") || ev.Process.Args[2] != audit.Redacted {
		t.Fatalf("args %q", ev.Process.Args)
	}
	if !slices.Contains(ev.Redacted, "process.args[2]") {
		t.Fatalf("redacted %q", ev.Redacted)
	}
}
