package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
)

// TestPrintGaps: verify's gap lines keep how long, what was lost and the
// suspect, on one line each, with a sandbox-chosen process name escaped.
func TestPrintGaps(t *testing.T) {
	g := audit.Event{Time: time.Date(2026, 12, 2, 13, 40, 4, 0, time.UTC), Kind: audit.KindAgent, Rule: "agent_gap",
		Message: "agent gap: pid 42 ended without a stop; no agent for 3.2s (last sign of life: heartbeat 13:40:01.000, last ledger record 13:40:00.500, restarted 13:40:04.200)" +
			"; pinned programs kept enforcing; lost while away: 0 events (ring buffer drops since the last heartbeat: alert 0, routine 0)" +
			"; queued while away and recorded now: 3 events; suspected: sandbox agents, py\x1b[2K\nthon (pid 7) aimed at the agent at 13:40:01.500 (via write, killed)"}
	var b bytes.Buffer
	printGaps(&b, []audit.Event{g, g}, nil)
	out := b.String()
	if !strings.HasPrefix(out, "  gaps      2 agent deaths") || strings.Count(out, "\n") != 3 {
		t.Fatalf("report:\n%s", out)
	}
	for _, want := range []string{"2026-12-02 13:40:04.000 pid 42 ended without a stop; no agent for 3.2s", "lost while away: 0 events", "suspected: sandbox agents"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "\x1b") || strings.Contains(out, "queued while away") {
		t.Errorf("escape sequence passed through, or unasked parts kept:\n%q", out)
	}
	b.Reset()
	printGaps(&b, nil, nil)
	if b.Len() != 0 {
		t.Errorf("no gaps printed %q", b.String())
	}
	printGaps(&b, nil, errors.New("too big"))
	if !strings.Contains(b.String(), "not listed: too big") {
		t.Errorf("got %q", b.String())
	}
}
