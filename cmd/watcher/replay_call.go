package main

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/watcherhq/watcher/internal/audit"
)

// matchCall applies --call and --session. Records come in ledger order, so
// a session's call ids are known (from its request records) before the
// kernel events labelled with them.
func (f *recordFilter) matchCall(e *audit.Event) bool {
	label := e.Sandbox.Labels["label"]
	if f.callID != "" {
		if e.Tool != nil {
			return e.Tool.CallID == f.callID
		}
		return label == f.callID
	}
	if f.session != "" {
		if e.Tool != nil {
			if e.Tool.Session != f.session {
				return false
			}
			if f.sessionCalls == nil {
				f.sessionCalls = map[string]bool{}
			}
			f.sessionCalls[e.Tool.CallID] = true
			return true
		}
		return label != "" && f.sessionCalls[label]
	}
	return true
}

// toolText is the human form of a gateway record.
func toolText(t *audit.ToolDetail) string {
	var b strings.Builder
	fmt.Fprintf(&b, " call=%s session=%s seq=%d tool=%s %s", t.CallID, t.Session, t.Seq, t.Tool, t.Stage)
	if t.Decision != "" {
		fmt.Fprintf(&b, "=%s", t.Decision)
	}
	if t.By != "" {
		fmt.Fprintf(&b, " by=%s", strconv.Quote(t.By))
	}
	if t.Reason != "" {
		fmt.Fprintf(&b, " reason=%s", strconv.Quote(t.Reason))
	}
	if t.Arguments != "" {
		fmt.Fprintf(&b, " arguments=%s", t.Arguments)
	}
	if t.Result != "" {
		fmt.Fprintf(&b, " summary=%s", strconv.Quote(t.Result))
	}
	if t.SHA256 != "" {
		fmt.Fprintf(&b, " sha256=%s", t.SHA256)
	}
	return b.String()
}
