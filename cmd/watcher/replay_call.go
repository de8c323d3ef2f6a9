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

// toolText is the human form of a gateway record, with the unquoted
// fields passed through q (textesc.String for the terminal; the quoted ones
// are strconv.Quote'd, which escapes as much).
func toolText(t *audit.ToolDetail, q func(string) string) string {
	var b strings.Builder
	fmt.Fprintf(&b, " call=%s session=%s seq=%d tool=%s %s", q(t.CallID), q(t.Session), t.Seq, q(t.Tool), q(t.Stage))
	if t.Decision != "" {
		fmt.Fprintf(&b, "=%s", q(t.Decision))
	}
	if t.By != "" {
		fmt.Fprintf(&b, " by=%s", strconv.Quote(t.By))
	}
	if t.Reason != "" {
		fmt.Fprintf(&b, " reason=%s", strconv.Quote(t.Reason))
	}
	if t.Arguments != "" {
		fmt.Fprintf(&b, " arguments=%s", q(t.Arguments))
	}
	if t.Result != "" {
		fmt.Fprintf(&b, " summary=%s", strconv.Quote(t.Result))
	}
	if t.SHA256 != "" {
		fmt.Fprintf(&b, " sha256=%s", q(t.SHA256))
	}
	if t.Protocol != "" {
		fmt.Fprintf(&b, " via=%s %s_session=%s %s_request=%s", q(t.Protocol), q(t.Protocol), q(t.ProtocolSession), q(t.Protocol), q(t.ProtocolRequest))
	}
	return b.String()
}
