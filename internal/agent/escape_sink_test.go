package agent

import (
	"testing"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/escape"
)

// TestEscapeSinkClassifies: the escape watch's sink (the classify step)
// passes events without an escape signal over, and turns an event whose
// class takes its sandbox over the threshold into a decision for the
// pipeline to carry out, not a call into the agent.
func TestEscapeSinkClassifies(t *testing.T) {
	sink := escapeSink{escape.New(escape.Config{Threshold: 10})}
	routine := audit.Event{Kind: audit.KindExec, Verdict: audit.VerdictAllowed, Sandbox: audit.Sandbox{Name: "sb"}}
	if d, err := sink.Consume(&routine); err != nil || d.Kind != "" {
		t.Fatalf("an exec made a decision: %+v %v", d, err)
	}
	mount := audit.Event{Kind: audit.KindMount, Verdict: audit.VerdictDenied, Sandbox: audit.Sandbox{Name: "sb", CgroupID: 7},
		Mount: &audit.MountDetail{Op: "pivot_root"}}
	var d any
	for range 10 {
		got, err := sink.Consume(&mount)
		if err != nil {
			t.Fatal(err)
		}
		if got.Kind != "" {
			d = got.Value
			break
		}
	}
	dec, ok := d.(*escape.Decision)
	if !ok || dec.Sandbox != "sb" || dec.Signals[escape.SigRootChange] == 0 {
		t.Fatalf("no escape decision for repeated refused pivot_root: %+v", d)
	}
}
