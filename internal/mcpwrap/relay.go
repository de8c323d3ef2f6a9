package mcpwrap

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/gateway"
	"github.com/watcherhq/watcher/internal/policy"
	"github.com/watcherhq/watcher/pkg/toolproto"
)

// Defaults for the limits a policy leaves at zero.
const (
	DefaultMaxArgumentBytes = 256 << 10
	DefaultMaxResultBytes   = 256 << 10
	DefaultMaxFrameBytes    = 4 << 20
	DefaultAskTimeout       = 5 * time.Minute
	// DefaultSettle is how long a failed call's result waits for the
	// kernel's refusals of it, which travel through the agent's rings.
	DefaultSettle = 300 * time.Millisecond
	// junkRecorded is how many non-JSON lines of the server are recorded
	// one by one; the rest are counted.
	junkRecorded = 5
)

// Config sets up a relay.
type Config struct {
	// Sandbox and Session name the records; Session also prefixes the
	// ids `watcher approve` takes.
	Sandbox, Session string
	// Rules are the sandbox's tools.mcp policy.
	Rules policy.MCPTools
	// Pins keeps the approved tool definitions (nil: no pinning).
	Pins *Pins
	// AcceptChanges re-pins changed definitions (the user approved them)
	// and pins suspicious ones.
	AcceptChanges bool
	// Suspicious are checked against each tool definition before it is
	// pinned: one that matches is hidden and refused until accepted.
	Suspicious []Pattern
	// Record appends an event to the ledger (nil: none).
	Record func(audit.Event)
	// Hold waits for `watcher approve` (nil: ask rules refuse);
	// ApproveHint tells the model and the user how to answer.
	Hold        func(ctx context.Context, p gateway.Pending, timeout time.Duration) toolproto.Answer
	ApproveHint string
	// Tagger gives each call's kernel events its label (nil: the session's).
	Tagger *Tagger
	// Summary turns the kernel's refusals of a call (label: its events')
	// into text for the model (nil: counted only).
	Summary func(label string, refusals []audit.Event) string
	// Settle overrides DefaultSettle.
	Settle time.Duration
}

// Relay passes MCP messages between a client and a server.
type Relay struct {
	cfg Config

	outMu     sync.Mutex
	clientOut io.Writer
	inMu      sync.Mutex
	serverIn  io.Writer

	mu      sync.Mutex
	pending map[string]*pendingReq
	tools   map[string]*toolState
	seq     int
	events  map[string][]audit.Event
	junk    int
	server  string
	listSeq int
	held    sync.WaitGroup
	// inflight are the calls the server has; unlabelled the events of no
	// process that came while each was in flight.
	inflight   map[int]bool
	unlabelled map[int][]audit.Event
}

type pendingReq struct {
	id     json.RawMessage
	method string
	call   *callState
	// then, for the relay's own tools/list, runs once it is filtered
	// (its answer is not the client's).
	then func()
}

type toolState struct {
	// suspect names the pattern a new definition matched (not pinned).
	suspect string
	changed bool
	old     Pin
	now     string
}

type callState struct {
	seq int
	// callID names the call in the ledger and for `watcher approve`:
	// SESSION.call-N, the label its kernel events carry, so that `watcher
	// replay --call` joins them. id is the client's JSON-RPC id.
	callID string
	id     json.RawMessage
	tool   string
	label  string
	start  time.Time
}

// New makes a relay; the policy's zero limits take their defaults.
func New(cfg Config) *Relay {
	r := &cfg.Rules
	if r.MaxArgumentBytes <= 0 {
		r.MaxArgumentBytes = DefaultMaxArgumentBytes
	}
	if r.MaxResultBytes <= 0 {
		r.MaxResultBytes = DefaultMaxResultBytes
	}
	if r.MaxFrameBytes <= 0 {
		r.MaxFrameBytes = DefaultMaxFrameBytes
	}
	if r.AskTimeout.Duration <= 0 {
		r.AskTimeout = policy.D(DefaultAskTimeout)
	}
	if cfg.Settle <= 0 {
		cfg.Settle = DefaultSettle
	}
	return &Relay{cfg: cfg, pending: map[string]*pendingReq{}, tools: map[string]*toolState{}, events: map[string][]audit.Event{},
		inflight: map[int]bool{}, unlabelled: map[int][]audit.Event{}}
}

// AddEvent hands the relay a refusal of the sandbox (any goroutine): a
// call's result tells the model what the kernel refused during it.
//
// Events of no process (the DNS proxy's answers: the query's socket, not
// its cgroup, is what the proxy sees) go to the calls in flight when they
// come; the ledger keeps them with their time, between the calls' records.
func (r *Relay) AddEvent(e audit.Event) {
	l := e.Sandbox.Labels["label"]
	r.mu.Lock()
	defer r.mu.Unlock()
	if l != "" {
		r.events[l] = append(r.events[l], e)
		return
	}
	if e.Process.CgroupID != 0 {
		return
	}
	for seq := range r.inflight {
		r.unlabelled[seq] = append(r.unlabelled[seq], e)
	}
}

// Run relays until the server's output ends (it exited, or closed it once
// the client's input ended and the relay closed serverIn). Requests still
// unanswered then get an error, so a client never waits for nothing.
func (r *Relay) Run(ctx context.Context, clientIn io.Reader, clientOut io.Writer, serverIn io.WriteCloser, serverOut io.Reader) error {
	r.clientOut, r.serverIn = clientOut, serverIn
	go func() {
		r.clientLoop(ctx, clientIn)
		// Calls held for an approver or the relay's own listing still go
		// to the server; then it learns the client is gone.
		r.held.Wait()
		serverIn.Close()
	}()
	err := r.serverLoop(serverOut)
	r.mu.Lock()
	left := r.pending
	r.pending = map[string]*pendingReq{}
	junk := r.junk
	r.mu.Unlock()
	for _, p := range left {
		if p.then != nil {
			p.then() // its call finds the server gone
		}
		switch {
		case p.call != nil:
			r.endCall(p.call)
			r.record(p.call, "result", "error", "", "the server exited before answering", "", "", audit.VerdictDenied)
			r.toClient(toolResult(p.call.id, "watcher: the MCP server exited before answering this call", true))
		case p.id != nil:
			r.toClient(rpcError(p.id, -32603, "watcher: the MCP server exited before answering"))
		}
	}
	if junk > junkRecorded {
		r.note("frame", "dropped", fmt.Sprintf("%d lines of the server's output were not JSON-RPC and were dropped (the first %d are recorded)", junk, junkRecorded))
	}
	if r.cfg.Tagger != nil {
		r.cfg.Tagger.Close()
	}
	return err
}

func (r *Relay) toClient(b []byte) {
	r.outMu.Lock()
	defer r.outMu.Unlock()
	r.clientOut.Write(append(b, '\n'))
}

func (r *Relay) toServer(b []byte) error {
	r.inMu.Lock()
	defer r.inMu.Unlock()
	_, err := r.serverIn.Write(append(b[:len(b):len(b)], '\n'))
	return err
}

func idKey(id json.RawMessage) string { return string(bytes.TrimSpace(id)) }

func (r *Relay) clientLoop(ctx context.Context, in io.Reader) {
	br := bufio.NewReaderSize(in, 64<<10)
	max := r.cfg.Rules.MaxFrameBytes
	for {
		f, err := readFrame(br, max)
		if err == errEmpty {
			continue
		}
		if err != nil {
			return
		}
		if f.Over > 0 {
			why := fmt.Sprintf("watcher: message of %d bytes is over the cap of %d (tools.mcp.max_frame_bytes): not passed to the server", f.Over, max)
			r.note("frame", "refused", why)
			r.toClient(rpcError(guessID(f), codeInvalidRequest, why))
			continue
		}
		r.fromClient(ctx, f.Data)
	}
}

func (r *Relay) fromClient(ctx context.Context, data []byte) {
	trim := bytes.TrimSpace(data)
	if trim[0] == '[' {
		r.toClient(rpcError(nil, codeInvalidRequest, "watcher: JSON-RPC batches are not part of MCP (removed in 2025-06-18): send one message a line"))
		return
	}
	var m message
	if err := json.Unmarshal(trim, &m); err != nil {
		r.toClient(rpcError(nil, codeParseError, "watcher: not a JSON-RPC message: "+err.Error()))
		return
	}
	if m.JSONRPC != "2.0" {
		r.toClient(rpcError(m.ID, codeInvalidRequest, `watcher: "jsonrpc" must be "2.0"`))
		return
	}
	if !m.isRequest() {
		if m.Method == "notifications/cancelled" {
			r.cancelled(m.Params)
		}
		r.toServer(trim) // notifications, answers to the server's requests
		return
	}
	key := idKey(m.ID)
	r.mu.Lock()
	_, dup := r.pending[key]
	r.mu.Unlock()
	if dup {
		r.toClient(rpcError(m.ID, codeInvalidRequest, "watcher: a request with id "+key+" is still in flight: use a new id"))
		return
	}
	switch m.Method {
	case "tools/call":
		r.call(ctx, &m, trim)
		return
	case "initialize":
		var p struct {
			ClientInfo struct{ Name, Version string } `json:"clientInfo"`
			Version    string                         `json:"protocolVersion"`
		}
		json.Unmarshal(m.Params, &p)
		r.note("initialize", "client", fmt.Sprintf("client %s %s, protocol %s", p.ClientInfo.Name, p.ClientInfo.Version, p.Version))
	}
	r.mu.Lock()
	r.pending[key] = &pendingReq{id: m.ID, method: m.Method}
	r.mu.Unlock()
	if err := r.toServer(trim); err != nil {
		r.mu.Lock()
		delete(r.pending, key)
		r.mu.Unlock()
		r.toClient(rpcError(m.ID, -32603, "watcher: the MCP server is gone: "+err.Error()))
	}
}

// call decides a tools/call and forwards, holds or refuses it.
func (r *Relay) call(ctx context.Context, m *message, data []byte) {
	var p struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	}
	if err := json.Unmarshal(m.Params, &p); err != nil || p.Name == "" {
		r.toClient(rpcError(m.ID, -32602, `watcher: tools/call needs params with a "name"`))
		return
	}
	r.mu.Lock()
	r.seq++
	cs := &callState{seq: r.seq, id: m.ID, tool: p.Name, start: time.Now(), callID: cleanLabel(fmt.Sprintf("%s.call-%d", r.cfg.Session, r.seq))}
	st := r.tools[p.Name]
	r.mu.Unlock()
	if r.cfg.Tagger != nil {
		cs.label = r.cfg.Tagger.SessionLabel()
	}
	args := p.Arguments
	if len(args) == 0 || string(args) == "null" {
		args = json.RawMessage("{}")
	}
	sum := sha256.Sum256(args)
	argsSum := hex.EncodeToString(sum[:])
	r.recordArgs(cs, string(args), argsSum)

	if len(args) > r.cfg.Rules.MaxArgumentBytes {
		r.refuse(cs, "limit:max_argument_bytes", fmt.Sprintf("the arguments are %d bytes, over the limit of %d", len(args), r.cfg.Rules.MaxArgumentBytes),
			"raise tools.mcp.max_argument_bytes in the sandbox's policy")
		return
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(args, &obj); err != nil {
		r.refuse(cs, "arguments:invalid", "the arguments are not a JSON object", "send the arguments as an object")
		return
	}
	if st == nil {
		// Not listed yet (a client that cached the list, or pipelined the
		// call): the relay lists the tools itself, then decides.
		r.held.Add(1)
		r.mu.Lock()
		_, taken := r.pending[idKey(cs.id)]
		if !taken {
			r.pending[idKey(cs.id)] = &pendingReq{method: "tools/call"} // held meanwhile
		}
		r.listSeq++
		lid := json.RawMessage(fmt.Sprintf(`"watcher-list-%d"`, r.listSeq))
		r.pending[idKey(lid)] = &pendingReq{method: "tools/list", then: func() {
			defer r.held.Done()
			r.mu.Lock()
			delete(r.pending, idKey(cs.id))
			st := r.tools[p.Name]
			r.mu.Unlock()
			r.decide(ctx, cs, p.Name, args, argsSum, obj, data, st)
		}}
		r.mu.Unlock()
		req, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": lid, "method": "tools/list"})
		if err := r.toServer(req); err != nil {
			r.mu.Lock()
			delete(r.pending, idKey(lid))
			delete(r.pending, idKey(cs.id))
			r.mu.Unlock()
			r.decide(ctx, cs, p.Name, args, argsSum, obj, data, nil)
			r.held.Done()
		}
		return
	}
	r.decide(ctx, cs, p.Name, args, argsSum, obj, data, st)
}

// decide applies pins and the policy to a call of a listed tool.
func (r *Relay) decide(ctx context.Context, cs *callState, name string, args json.RawMessage, argsSum string, obj map[string]json.RawMessage, data []byte, st *toolState) {
	p := struct{ Name string }{name}
	if st == nil {
		if d := r.cfg.Rules.DecideMCP(name, nil); d.Action == policy.ToolDeny {
			r.refuse(cs, d.Rule, d.Why, denyHint(name, d.Rule))
			return
		}
	}
	switch {
	case st == nil:
		r.refuse(cs, "mcp:unlisted", fmt.Sprintf("tool %q was not in this session's tools/list (hidden by the policy, or not listed yet): a tool that was not shown cannot be checked against its pinned definition", p.Name),
			"call tools/list first; if it is hidden, allow it in the sandbox's tools.mcp rules")
		return
	case st.suspect != "":
		r.refuse(cs, "mcp:suspicious-description", fmt.Sprintf("the definition of tool %q matches the pattern %s (instructions to the model, credential paths or network pipelines in a tool description): it was not approved", p.Name, st.suspect),
			"review the description, then approve it: start the server once with `watcher mcp wrap --accept-changes ...`")
		return
	case st.changed:
		r.refuse(cs, "mcp:pin", fmt.Sprintf("the definition of tool %q changed since it was approved on %s (sha256 %s, now %s): its description or input schema is not the one the user approved", p.Name, st.old.Since.Format(time.RFC3339), short(st.old.SHA256), short(st.now)),
			"review the new definition, then approve it: start the server once with `watcher mcp wrap --accept-changes ...`")
		return
	}
	raw := make(map[string][]byte, len(obj))
	for k, v := range obj {
		raw[k] = v
	}
	d := r.cfg.Rules.DecideMCP(p.Name, raw)
	switch d.Action {
	case policy.ToolDeny:
		r.refuse(cs, d.Rule, d.Why, denyHint(p.Name, d.Rule))
	case policy.ToolAsk:
		if r.cfg.Hold == nil {
			r.refuse(cs, d.Rule, d.Why+", and no approver can be reached (--url without a running agent)", "allow the tool, or run `watcher run` so that `watcher approve` reaches the call")
			return
		}
		r.record(cs, "decision", "ask", "policy", d.Why, "", "", audit.VerdictRecorded)
		r.mu.Lock()
		r.pending[idKey(cs.id)] = &pendingReq{method: "tools/call"} // the id is taken while held
		r.mu.Unlock()
		r.held.Add(1)
		go func() {
			defer r.held.Done()
			timeout := r.cfg.Rules.AskTimeout.Duration
			callID := cs.callID
			ans := r.cfg.Hold(ctx, gateway.Pending{Sandbox: r.cfg.Sandbox, Session: r.cfg.Session, CallID: callID, Tool: p.Name,
				Arguments: string(args), ArgumentsBytes: len(args), ArgumentsSHA256: argsSum, Rule: d.Rule, Why: d.Why, Peer: "mcp client"}, timeout)
			r.mu.Lock()
			delete(r.pending, idKey(cs.id))
			r.mu.Unlock()
			switch {
			case ans.Approved:
				r.record(cs, "approval", "approved", ans.By, ans.Reason, "", "", audit.VerdictAllowed)
				r.forward(cs, data)
			case ans.TimedOut:
				r.record(cs, "approval", "timeout", "timeout", fmt.Sprintf("no approver answered within %s", timeout), "", "", audit.VerdictDenied)
				r.refuseDecided(cs, d.Rule, fmt.Sprintf("no approver answered within %s", timeout), "approve it in time: "+r.cfg.ApproveHint+" "+r.cfg.Sandbox+"/"+callID)
			default:
				r.record(cs, "approval", "denied", ans.By, ans.Reason, "", "", audit.VerdictDenied)
				r.refuseDecided(cs, d.Rule, fmt.Sprintf("denied by %s: %s", ans.By, orNone(ans.Reason)), "ask the approver")
			}
		}()
	default:
		r.record(cs, "decision", "allow", "policy", "", "", "", audit.VerdictAllowed)
		r.forward(cs, data)
	}
}

// denyHint is the policy change that would allow a refused call.
func denyHint(tool, rule string) string {
	if rule == "default-deny" {
		return "add a rule to the sandbox's tools.mcp list: {tool: " + strconv.Quote(tool) + ", action: allow}"
	}
	return "change rule " + rule + " in the sandbox's tools.mcp list"
}

func orNone(s string) string {
	if s == "" {
		return "no reason given"
	}
	return s
}

func short(sum string) string {
	if len(sum) > 12 {
		return sum[:12]
	}
	return sum
}

func (r *Relay) forward(cs *callState, data []byte) {
	if r.cfg.Tagger != nil {
		label, err := r.cfg.Tagger.Begin(cs.seq)
		if err != nil {
			r.note("tag", "error", err.Error())
		}
		cs.label = label
	}
	r.mu.Lock()
	r.pending[idKey(cs.id)] = &pendingReq{method: "tools/call", call: cs}
	r.inflight[cs.seq] = true
	r.mu.Unlock()
	if err := r.toServer(data); err != nil {
		r.mu.Lock()
		delete(r.pending, idKey(cs.id))
		r.mu.Unlock()
		r.endCall(cs)
		r.record(cs, "result", "error", "", "the server is gone: "+err.Error(), "", "", audit.VerdictDenied)
		r.toClient(toolResult(cs.id, "watcher: the MCP server is gone: "+err.Error(), true))
	}
}

func (r *Relay) endCall(cs *callState) {
	r.mu.Lock()
	delete(r.inflight, cs.seq)
	delete(r.unlabelled, cs.seq)
	r.mu.Unlock()
	if r.cfg.Tagger != nil {
		if _, err := r.cfg.Tagger.End(cs.seq); err != nil {
			r.note("tag", "error", err.Error())
		}
	}
}

// cancelled ends a call the client gave up on: the server need not
// answer it (MCP), and its leaf must not stay "in flight".
func (r *Relay) cancelled(params json.RawMessage) {
	var p struct {
		RequestID json.RawMessage `json:"requestId"`
		Reason    string          `json:"reason"`
	}
	if json.Unmarshal(params, &p) != nil || len(p.RequestID) == 0 {
		return
	}
	r.mu.Lock()
	pr := r.pending[idKey(p.RequestID)]
	if pr != nil && pr.call != nil {
		delete(r.pending, idKey(p.RequestID))
	}
	r.mu.Unlock()
	if pr != nil && pr.call != nil {
		r.endCall(pr.call)
		r.record(pr.call, "result", "cancelled", "client", p.Reason, "", "", audit.VerdictRecorded)
	}
}

// refuse answers a call the policy refused with an error result the model
// can read: what, by which rule and layer, and what would allow it.
func (r *Relay) refuse(cs *callState, rule, why, allow string) {
	r.record(cs, "decision", "deny", "policy", why, "", "", audit.VerdictDenied)
	r.refuseDecided(cs, rule, why, allow)
}

func (r *Relay) refuseDecided(cs *callState, rule, why, allow string) {
	text := fmt.Sprintf("watcher refused this call of tool %q: %s.\nrule: %s (layer: watcher mcp wrap, the sandbox's tools.mcp policy)\nto allow it: %s", cs.tool, why, rule, allow)
	r.record(cs, "result", "error", "", why, "", "", audit.VerdictDenied)
	r.toClient(toolResult(cs.id, text, true))
}

func (r *Relay) serverLoop(out io.Reader) error {
	br := bufio.NewReaderSize(out, 64<<10)
	max := r.cfg.Rules.MaxFrameBytes
	for {
		f, err := readFrame(br, max)
		if err == errEmpty {
			continue
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if f.Over > 0 {
			r.oversize(f)
			continue
		}
		var m message
		if err := json.Unmarshal(f.Data, &m); err != nil || m.JSONRPC != "2.0" {
			r.mu.Lock()
			r.junk++
			n := r.junk
			r.mu.Unlock()
			if n <= junkRecorded {
				r.note("frame", "dropped", "the server wrote a line that is not JSON-RPC (not passed on): "+excerpt(f.Data, 200))
			}
			continue
		}
		outb := f.Data
		if m.isResponse() {
			r.mu.Lock()
			pr := r.pending[idKey(m.ID)]
			sent := pr != nil && (pr.method != "tools/call" || pr.call != nil)
			if sent {
				delete(r.pending, idKey(m.ID))
			}
			r.mu.Unlock()
			if !sent {
				// An answer to nothing it was sent (a call the relay
				// refused or still holds, or an id it made up) would
				// pass unchecked: dropped.
				r.note("frame", "dropped", "the server answered id "+excerpt([]byte(idKey(m.ID)), 80)+", a request it was not sent")
				continue
			}
			if pr != nil {
				switch {
				case pr.call != nil:
					outb = r.result(pr.call, &m, f.Data)
				case pr.method == "tools/list":
					outb = r.filterList(&m, f.Data)
					if pr.then != nil {
						go pr.then()
						continue
					}
				case pr.method == "initialize":
					var res struct {
						ServerInfo struct{ Name, Version string } `json:"serverInfo"`
					}
					json.Unmarshal(m.Result, &res)
					r.mu.Lock()
					r.server = res.ServerInfo.Name + " " + res.ServerInfo.Version
					r.mu.Unlock()
					r.note("initialize", "server", "server "+res.ServerInfo.Name+" "+res.ServerInfo.Version)
				}
			}
		}
		r.toClient(outb)
	}
}

// oversize handles a message of the server over the frame cap: dropped,
// and the request it answers (its id guessed from its ends) gets an error.
func (r *Relay) oversize(f frame) {
	max := r.cfg.Rules.MaxFrameBytes
	why := fmt.Sprintf("the server sent a message of %d bytes, over the cap of %d (tools.mcp.max_frame_bytes): dropped", f.Over, max)
	id := guessID(f)
	r.mu.Lock()
	pr := r.pending[idKey(id)]
	if pr != nil && pr.method == "tools/call" && pr.call == nil {
		pr = nil // held by the relay: the server was not sent it
	}
	if pr != nil {
		delete(r.pending, idKey(id))
	}
	r.mu.Unlock()
	switch {
	case pr != nil && pr.then != nil:
		r.note("frame", "dropped", why)
		go pr.then() // the call it was for is decided without the list
	case pr != nil && pr.call != nil:
		r.endCall(pr.call)
		r.record(pr.call, "result", "error", "", why, "", "", audit.VerdictDenied)
		r.toClient(toolResult(id, "watcher: "+why, true))
	case pr != nil:
		r.note("frame", "dropped", why)
		r.toClient(rpcError(id, -32603, "watcher: "+why))
	default:
		r.note("frame", "dropped", why)
	}
}

// result caps a call's result, adds what the kernel refused during the
// call, and records it (size and hash: the content stays out of the
// ledger).
func (r *Relay) result(cs *callState, m *message, data []byte) []byte {
	defer r.endCall(cs) // after the refusals are in: the events of no process come while it is in flight
	if len(m.Error) > 0 {
		r.record(cs, "result", "error", "", "protocol error: "+excerpt(m.Error, 300), "", "", audit.VerdictDenied)
		return data
	}
	var res map[string]json.RawMessage
	if err := json.Unmarshal(m.Result, &res); err != nil {
		r.record(cs, "result", "error", "", "the result is not an object", "", "", audit.VerdictDenied)
		return toolResult(cs.id, "watcher: the MCP server's result was not a JSON object (dropped)", true)
	}
	var isError bool
	json.Unmarshal(res["isError"], &isError)
	sum := sha256.Sum256(m.Result)
	note := ""
	changed := false
	if len(m.Result) > r.cfg.Rules.MaxResultBytes {
		res = capResult(res, r.cfg.Rules.MaxResultBytes, len(m.Result))
		note = fmt.Sprintf("; cut to the cap of %d bytes", r.cfg.Rules.MaxResultBytes)
		changed = true
	}
	refusals := r.refusalsOf(cs.seq, isError)
	if len(refusals) > 0 {
		text := fmt.Sprintf("watcher: the kernel refused %d operation(s) of the MCP server during this call", len(refusals))
		if r.cfg.Summary != nil {
			text += ":\n" + r.cfg.Summary(cs.label, refusals)
		}
		res = appendText(res, text)
		note += fmt.Sprintf("; %d kernel refusal(s)", len(refusals))
		changed = true
	}
	decision, v := "ok", audit.VerdictAllowed
	if isError {
		decision, v = "error", audit.VerdictDenied
	}
	r.record(cs, "result", decision, "", "", fmt.Sprintf("%d bytes isError=%v%s", len(m.Result), isError, note), hex.EncodeToString(sum[:]), v)
	if !changed {
		return data
	}
	b, _ := json.Marshal(res)
	out, _ := json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Result  json.RawMessage `json:"result"`
	}{"2.0", m.ID, b})
	return out
}

// refusalsOf are the events labelled with call seq, alone or overlapping.
// A failed call waits a little for them: they come through the rings.
func (r *Relay) refusalsOf(seq int, wait bool) []audit.Event {
	if r.cfg.Tagger == nil {
		return nil
	}
	one := r.cfg.Tagger.CallLabel(seq)
	many := r.cfg.Tagger.labelFor([]int{0, 0})
	many = many[:len(many)-3] // LABEL.calls-
	collect := func() []audit.Event {
		r.mu.Lock()
		defer r.mu.Unlock()
		out := append([]audit.Event(nil), r.unlabelled[seq]...)
		for l, evs := range r.events {
			if l == one {
				out = append(out, evs...)
				continue
			}
			if rest, ok := strings.CutPrefix(l, many); ok {
				for _, s := range strings.Split(rest, ".") {
					if s == strconv.Itoa(seq) {
						out = append(out, evs...)
					}
				}
			}
		}
		return out
	}
	evs := collect()
	if len(evs) == 0 && wait {
		time.Sleep(r.cfg.Settle)
		evs = collect()
	}
	return evs
}

// capResult keeps the text of a result up to max bytes and says so;
// other content (images, resources, structured content) goes.
func capResult(res map[string]json.RawMessage, max, size int) map[string]json.RawMessage {
	var content []map[string]any
	json.Unmarshal(res["content"], &content)
	var text strings.Builder
	for _, c := range content {
		if s, ok := c["text"].(string); ok {
			text.WriteString(s)
		}
	}
	t := string(cutUTF8([]byte(text.String()), max))
	out := map[string]json.RawMessage{}
	if v, ok := res["isError"]; ok {
		out["isError"] = v
	}
	b, _ := json.Marshal([]map[string]string{{"type": "text", "text": t},
		{"type": "text", "text": fmt.Sprintf("watcher: the result was %d bytes, over the cap of %d (tools.mcp.max_result_bytes): cut here, other content dropped", size, max)}})
	out["content"] = b
	return out
}

func appendText(res map[string]json.RawMessage, text string) map[string]json.RawMessage {
	var content []json.RawMessage
	json.Unmarshal(res["content"], &content)
	item, _ := json.Marshal(map[string]string{"type": "text", "text": text})
	content = append(content, item)
	b, _ := json.Marshal(content)
	res["content"] = b
	return res
}

func cutUTF8(b []byte, n int) []byte {
	if len(b) <= n {
		return b
	}
	i := n
	for i > 0 && i > n-4 && b[i]&0xC0 == 0x80 {
		i--
	}
	return b[:i]
}

func excerpt(b []byte, n int) string {
	if len(b) <= n {
		return string(b)
	}
	return string(cutUTF8(b, n)) + "...(cut)"
}
