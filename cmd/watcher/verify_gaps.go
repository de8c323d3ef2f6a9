package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/watcherhq/watcher/internal/agent"
	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/ledger"
	"github.com/watcherhq/watcher/internal/textesc"
)

// gapScanLimit is the ledger size up to which verify lists the agent's
// gaps (a second pass over the records); above it, it says how to.
const gapScanLimit = 256 << 20

var gapRule = []byte(`"rule":"` + agent.RuleAgentGap + `"`)

// agentGaps returns the ledger's gap records: one per death of the agent
// (a restart that found no clean stop). Nil, nil past gapScanLimit.
func agentGaps(ctx context.Context, dir string, size int64) ([]audit.Event, error) {
	if size > gapScanLimit {
		return nil, errGapsNotListed
	}
	r, err := ledger.NewReader(dir)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	var gaps []audit.Event
	for {
		if err := ctx.Err(); err != nil {
			return gaps, err
		}
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			return gaps, nil
		}
		if err != nil {
			return gaps, err
		}
		if rec.Event.Kind == audit.KindAgent && bytes.Contains(rec.Raw, gapRule) {
			gaps = append(gaps, rec.Event)
		}
	}
}

var errGapsNotListed = fmt.Errorf("ledger over %d MiB: list them with watcher ledger cat --kind agent DIR | grep %s", gapScanLimit>>20, agent.RuleAgentGap)

// printGaps adds the gaps to verify's report: how many, then one line
// each (when, how long, the suspect), every field escaped.
func printGaps(w io.Writer, gaps []audit.Event, err error) {
	if err != nil {
		fmt.Fprintf(w, "  gaps      not listed: %s\n", textesc.String(err.Error()))
		return
	}
	if len(gaps) == 0 {
		return
	}
	fmt.Fprintf(w, "  gaps      %d agent deaths (restarts without a clean stop; pinned programs enforced meanwhile)\n", len(gaps))
	for _, g := range gaps {
		fmt.Fprintf(w, "            %s\n", gapLine(&g))
	}
}

// gapLine is a gap record in one line: the restart time, then the
// record's own account cut to its first parts.
func gapLine(e *audit.Event) string {
	msg := strings.TrimPrefix(e.Message, "agent gap: ")
	parts := strings.Split(msg, "; ")
	var keep []string
	for _, p := range parts {
		if strings.HasPrefix(p, "pid ") || strings.HasPrefix(p, "no agent for") || strings.HasPrefix(p, "lost while away") || strings.HasPrefix(p, "suspected") {
			keep = append(keep, p)
		}
	}
	return e.Time.Format("2006-01-02 15:04:05.000") + " " + textesc.String(strings.Join(keep, "; "))
}
