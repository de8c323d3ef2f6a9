package mcpwrap

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/policy"
)

// filterList passes on a tools/list result with only the tools a call
// could pass: those the policy refuses whatever the arguments, and those
// whose definition changed since it was pinned, are left out (a changed
// description is what the model would read: it is not shown either).
func (r *Relay) filterList(m *message, data []byte) []byte {
	var res map[string]json.RawMessage
	if err := json.Unmarshal(m.Result, &res); err != nil {
		return data
	}
	var raws []json.RawMessage
	if err := json.Unmarshal(res["tools"], &raws); err != nil {
		return data
	}
	var kept []json.RawMessage
	var hidden []string
	for _, raw := range raws {
		var t Tool
		if err := json.Unmarshal(raw, &t); err != nil || t.Name == "" {
			hidden = append(hidden, "(a tool without a name)")
			continue
		}
		if d := r.cfg.Rules.DecideMCP(t.Name, nil); d.Action == policy.ToolDeny {
			hidden = append(hidden, t.Name)
			continue
		}
		st := &toolState{now: t.Hash()}
		susp := ""
		if r.cfg.Pins != nil && !r.cfg.AcceptChanges && !r.cfg.Pins.Pinned(t) {
			susp = suspicious(r.cfg.Suspicious, t)
		}
		if susp != "" && !r.cfg.Pins.Has(t.Name) {
			// New, and it reads as an attack: not pinned on first sight.
			st.suspect = susp
			r.pinNote(t, "suspicious", fmt.Sprintf("tool %q not pinned: its definition matches %s; hidden and refused until accepted; description: %s", t.Name, susp, excerpt([]byte(t.Description), 500)), audit.VerdictDenied)
		} else if r.cfg.Pins != nil {
			state, old, err := r.cfg.Pins.Check(t, r.cfg.AcceptChanges)
			if err != nil {
				r.note("pin", "error", err.Error())
			}
			switch {
			case state == PinNew:
				r.pinNote(t, "pinned", fmt.Sprintf("tool %q pinned (first seen) sha256 %s", t.Name, st.now), audit.VerdictRecorded)
			case state == PinChanged && r.cfg.AcceptChanges:
				r.pinNote(t, "accepted", fmt.Sprintf("tool %q changed and the change was accepted (--accept-changes): sha256 %s, was %s; description now: %s", t.Name, st.now, old.SHA256, excerpt([]byte(t.Description), 500)), audit.VerdictRecorded)
			case state == PinChanged:
				st.changed, st.old = true, old
				also := ""
				if susp != "" {
					also = "; the new definition matches " + susp
				}
				r.pinNote(t, "changed", fmt.Sprintf("tool %q changed since it was approved on %s (sha256 %s, was %s): hidden and refused until approved again%s; description was: %s; now: %s",
					t.Name, old.Since.Format("2006-01-02T15:04:05Z"), st.now, old.SHA256, also, excerpt([]byte(old.Description), 300), excerpt([]byte(t.Description), 500)), audit.VerdictDenied)
			}
		}
		r.mu.Lock()
		r.tools[t.Name] = st
		r.mu.Unlock()
		if st.changed || st.suspect != "" {
			hidden = append(hidden, t.Name)
			continue
		}
		kept = append(kept, raw)
	}
	if len(hidden) == 0 {
		return data
	}
	r.note("list", "filtered", fmt.Sprintf("%d of %d tools hidden from the client: %s", len(hidden), len(raws), strings.Join(hidden, ", ")))
	if kept == nil {
		kept = []json.RawMessage{}
	}
	res["tools"], _ = json.Marshal(kept)
	b, _ := json.Marshal(res)
	out, _ := json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Result  json.RawMessage `json:"result"`
	}{"2.0", m.ID, b})
	return out
}

// record appends one step of a call to the ledger.
func (r *Relay) record(cs *callState, stage, decision, by, reason, result, sha string, v audit.Verdict) {
	r.emit(cs, &audit.ToolDetail{Stage: stage, Decision: decision, By: by, Reason: reason, Result: result, SHA256: sha}, v)
}

// recordArgs records a call's request: the exact arguments and their hash.
func (r *Relay) recordArgs(cs *callState, args, sum string) {
	d := &audit.ToolDetail{Stage: "request", Arguments: args, SHA256: sum, Reason: "jsonrpc id " + idKey(cs.id)}
	if len(args) > 64<<10 {
		d.Arguments = string(cutUTF8([]byte(args), 64<<10))
		d.Reason += fmt.Sprintf("; arguments are %d bytes: the record keeps the first %d; sha256 is of them all", len(args), len(d.Arguments))
	}
	r.emit(cs, d, audit.VerdictRecorded)
}

func (r *Relay) emit(cs *callState, d *audit.ToolDetail, v audit.Verdict) {
	if r.cfg.Record == nil {
		return
	}
	d.CallID, d.Session, d.Seq, d.Tool = cs.callID, r.cfg.Session, uint64(cs.seq), cs.tool
	labels := map[string]string{"session": r.cfg.Session}
	if cs.label != "" {
		labels["label"] = cs.label
	}
	r.cfg.Record(audit.Event{Time: now(), Kind: audit.KindTool, Verdict: v, Severity: audit.SeverityAlert, Mechanism: "mcp-wrap",
		Rule: "", Sandbox: audit.Sandbox{Name: r.cfg.Sandbox, Labels: labels}, Tool: d})
}

// note records something of the session that is not a call's.
func (r *Relay) note(stage, decision, reason string) {
	r.noteTool("-", stage, decision, reason, audit.VerdictRecorded)
}

func (r *Relay) pinNote(t Tool, decision, reason string, v audit.Verdict) {
	r.noteTool(t.Name, "pin", decision, reason, v)
}

func (r *Relay) noteTool(tool, stage, decision, reason string, v audit.Verdict) {
	if r.cfg.Record == nil {
		return
	}
	labels := map[string]string{"session": r.cfg.Session}
	if r.cfg.Tagger != nil {
		labels["label"] = r.cfg.Tagger.SessionLabel()
	}
	r.cfg.Record(audit.Event{Time: now(), Kind: audit.KindTool, Verdict: v, Severity: audit.SeverityAlert, Mechanism: "mcp-wrap",
		Sandbox: audit.Sandbox{Name: r.cfg.Sandbox, Labels: labels},
		Tool:    &audit.ToolDetail{CallID: "-", Session: r.cfg.Session, Tool: tool, Stage: stage, Decision: decision, By: "mcp-wrap", Reason: reason}})
}
