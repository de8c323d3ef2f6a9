package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/policy"
	"github.com/watcherhq/watcher/pkg/toolproto"
)

// Defaults for limits a policy leaves at zero.
const (
	defaultMaxRequest  = 1 << 20
	defaultMaxArgument = 256 << 10
	defaultMaxOutput   = 64 << 10
	defaultAskTimeout  = 5 * time.Minute
)

func withDefaults(sb *policy.Sandbox) *policy.Sandbox {
	cp := *sb
	t := &cp.Tools
	if t.MaxRequestBytes <= 0 {
		t.MaxRequestBytes = defaultMaxRequest
	}
	if t.MaxArgumentBytes <= 0 {
		t.MaxArgumentBytes = defaultMaxArgument
	}
	if t.MaxOutputBytes <= 0 {
		t.MaxOutputBytes = defaultMaxOutput
	}
	if t.AskTimeout.Duration <= 0 {
		t.AskTimeout = policy.D(defaultAskTimeout)
	}
	return &cp
}

// call is one tool call in progress.
type call struct {
	g    *sandboxGateway
	sb   *policy.Sandbox
	act  *sessionCall
	o    *origin
	peer string
	cred *unix.Ucred // the caller's, from the kernel
	// args are the call's arguments, the exact bytes that are recorded,
	// shown to an approver and decoded by the tool; argsSum their SHA-256.
	args    json.RawMessage
	argsSum string
}

func (g *sandboxGateway) toolRequest(c *origin, raw json.RawMessage, sb *policy.Sandbox) (any, *toolproto.Error) {
	var p toolproto.ToolParams
	// The arguments are checked by run, so that their refusal is recorded
	// as the call's; the rest of the params here.
	if e := decodeParamsSkipping(raw, &p, "arguments"); e != nil {
		return nil, e
	}
	return g.request(c, p, sb)
}

// request is the decision path of every tool call, whichever protocol
// carries it (tool.request here, tools/call over MCP): the policy's rule
// for the tool, approval, then the tool.
func (g *sandboxGateway) request(c *origin, p toolproto.ToolParams, sb *policy.Sandbox) (any, *toolproto.Error) {
	if p.Tool == "" {
		return nil, rpcErr(toolproto.CodeInvalidParams, toolproto.TypeInvalidParams, `"tool" is required`)
	}
	known := false
	for _, t := range policy.ToolNames() {
		known = known || t == p.Tool
	}
	return g.run(c, sb, p, func(cl *call) (any, *toolproto.Error) {
		if !known {
			return nil, cl.deny("default-deny", fmt.Sprintf("no tool %q: this gateway offers %v, and only those the policy lists", p.Tool, policy.ToolNames()))
		}
		rule := sb.Tools.Tool(p.Tool)
		if rule == nil {
			return nil, cl.deny("default-deny", fmt.Sprintf("tool %q is not on this sandbox's list (see tool.list)", p.Tool))
		}
		switch rule.Action {
		case policy.ToolDeny:
			return nil, cl.deny(rule.RuleName(), fmt.Sprintf("the policy denies tool %q", p.Tool))
		case policy.ToolAsk:
			if e := cl.ask(c.ctx, rule.RuleName(), "the policy asks a human before "+p.Tool); e != nil {
				return nil, e
			}
		default:
			cl.allow(rule.RuleName())
		}
		return g.runTool(c.ctx, cl, p.Tool, p.Arguments)
	})
}

// run wraps a call: checks ids, limits and duplicates, records the
// request, runs body and records the result.
func (g *sandboxGateway) run(c *origin, sb *policy.Sandbox, p toolproto.ToolParams, body func(*call) (any, *toolproto.Error)) (any, *toolproto.Error) {
	if !idPattern.MatchString(p.CallID) {
		return nil, rpcErr(toolproto.CodeInvalidParams, toolproto.TypeInvalidParams, `"call_id" must be 1-64 of letters, digits, '_', '.', '-' (starting with a letter, digit or '_')`)
	}
	if p.Session == "" {
		p.Session = "default"
	}
	if !idPattern.MatchString(p.Session) {
		return nil, rpcErr(toolproto.CodeInvalidParams, toolproto.TypeInvalidParams, `"session" must be 1-64 of letters, digits, '_', '.', '-'`)
	}
	if len(p.Arguments) == 0 || string(p.Arguments) == "null" {
		p.Arguments = json.RawMessage("{}")
	}
	// Over the rate: refused before anything is recorded per call (a flood
	// must not flood the ledger); the refusals are counted and recorded
	// once a second. The call gets no number: it never happened.
	if !g.limiter.allow() {
		g.fold.add(p.Tool)
		e := rpcErr(toolproto.CodeRateLimited, toolproto.TypeRateLimited, "over the sandbox's rate of %g calls/s (burst %d): retry later", sb.Tools.Rate, sb.Tools.Burst)
		e.Data.Tool, e.Data.CallID = p.Tool, p.CallID
		return nil, e
	}
	sess := g.sessions.get(p.Session)
	act, prev := sess.begin(p.CallID, p.Tool, p.Arguments)
	if prev != nil {
		e := rpcErr(toolproto.CodeDuplicateCall, toolproto.TypeDuplicateCall, "call id %q was already used in session %s (seq %d, %s); use a new id, or session.resume to read its result", p.CallID, p.Session, prev.Seq, prev.Status)
		e.Data.CallID = p.CallID
		return nil, e
	}
	cl := &call{g: g, sb: sb, act: act, o: c, peer: c.peer, cred: c.cred, args: p.Arguments, argsSum: argsSHA256(p.Arguments)}
	cl.emit("request", "", c.peer, "", "", "", audit.VerdictRecorded)
	var out any
	var rerr *toolproto.Error
	if len(p.Arguments) > sb.Tools.MaxArgumentBytes {
		rerr = cl.deny("limit:max_argument_bytes", fmt.Sprintf("arguments are %d bytes, over the limit of %d", len(p.Arguments), sb.Tools.MaxArgumentBytes))
		rerr.Code, rerr.Data.Type, rerr.Data.Limit = toolproto.CodeTooLarge, toolproto.TypeTooLarge, int64(sb.Tools.MaxArgumentBytes)
	} else if err := checkArguments(p.Arguments); err != nil {
		// What a decoder reads from them could differ from what the
		// record and an approver show: refused, whatever the policy.
		rule, typ, hint := "arguments:invalid", toolproto.TypeInvalidParams, ""
		if errors.Is(err, ErrAmbiguousArguments) {
			rule, typ, hint = "arguments:ambiguous", toolproto.TypeAmbiguousArguments, ": send each key once, in one spelling, as valid UTF-8"
		}
		rerr = cl.deny(rule, fmt.Sprintf("refused: %v%s", err, hint))
		rerr.Code, rerr.Data.Type = toolproto.CodeInvalidParams, typ
	} else {
		out, rerr = body(cl)
	}
	if rerr != nil {
		if rerr.Data == nil {
			rerr.Data = &toolproto.ErrorData{Type: toolproto.TypeToolFailed}
		}
		rerr.Data.Tool, rerr.Data.CallID = p.Tool, p.CallID
		if !cl.act.decided() {
			// Refused before the policy was consulted (bad arguments).
			cl.emit("decision", "deny", "policy", rerr.Message, "", "", audit.VerdictDenied)
		}
		cl.emit("result", "error", "", rerr.Message, "", "", audit.VerdictDenied)
		act.finish(nil, rerr)
		return nil, rerr
	}
	b, err := json.Marshal(out)
	if err != nil {
		rerr = rpcErr(toolproto.CodeInternal, toolproto.TypeInternal, "encode output: %v", err)
		act.finish(nil, rerr)
		return nil, rerr
	}
	cl.emit("result", "ok", "", "", summarize(out), hashOf(out), audit.VerdictAllowed)
	act.finish(b, nil)
	return &toolproto.CallResult{CallID: p.CallID, Session: p.Session, Seq: act.Seq, Tool: p.Tool, Output: b}, nil
}

// emit records one step of the call in the ledger.
func (cl *call) emit(stage, decision, by, reason, result, sha string, v audit.Verdict) {
	a := cl.act
	ev := audit.Event{Time: now(), Kind: audit.KindTool, Verdict: v, Severity: audit.SeverityAlert, Mechanism: "gateway",
		Rule:    a.Rule,
		Sandbox: audit.Sandbox{Name: cl.sb.Name, Labels: map[string]string{"label": a.CallID, "session": a.session}},
		Tool: &audit.ToolDetail{CallID: a.CallID, Session: a.session, Seq: a.Seq, Tool: a.Tool, Stage: stage,
			Decision: decision, By: by, Reason: reason, Result: result, SHA256: sha,
			Protocol: cl.o.proto, ProtocolSession: cl.o.protoSession, ProtocolRequest: cl.o.protoRequest}}
	if stage == "request" {
		// The exact arguments and their SHA-256 (cut only past
		// maxRecordedArgs, which the reason then says).
		ev.Tool.Arguments, ev.Tool.SHA256 = string(cl.args), cl.argsSum
		if len(cl.args) > maxRecordedArgs {
			ev.Tool.Arguments = string(cutUTF8(cl.args, maxRecordedArgs))
			ev.Tool.Reason = fmt.Sprintf("arguments are %d bytes: the record keeps the first %d; sha256 is of them all", len(cl.args), len(ev.Tool.Arguments))
		}
	}
	cl.g.m.cfg.Emit(ev)
}

func (cl *call) allow(rule string) {
	cl.act.setDecision("allow", rule)
	cl.emit("decision", "allow", "policy", "", "", "", audit.VerdictAllowed)
}

func (cl *call) deny(rule, why string) *toolproto.Error {
	cl.act.setDecision("deny", rule)
	cl.emit("decision", "deny", "policy", why, "", "", audit.VerdictDenied)
	e := rpcErr(toolproto.CodeDenied, toolproto.TypeDenied, "%s (rule %s)", why, rule)
	e.Data.Rule = rule
	return e
}

// ask holds the call until an approver answers or the timeout denies it.
func (cl *call) ask(ctx context.Context, rule, why string) *toolproto.Error {
	if err := checkApprovable(cl.args); err != nil {
		// An approver is shown the whole arguments or none: no cut.
		e := cl.deny(rule, fmt.Sprintf("refused: %v", err))
		e.Code, e.Data.Type, e.Data.Limit = toolproto.CodeTooLarge, toolproto.TypeTooLargeForApproval, MaxApprovalArgumentBytes
		return e
	}
	cl.act.setDecision("ask", rule)
	cl.emit("decision", "ask", "policy", why, "", "", audit.VerdictRecorded)
	timeout := cl.sb.Tools.AskTimeout.Duration
	pend := Pending{Sandbox: cl.sb.Name, Session: cl.act.session, CallID: cl.act.CallID,
		Tool: cl.act.Tool, Arguments: string(cl.args), ArgumentsBytes: len(cl.args), ArgumentsSHA256: cl.argsSum,
		Rule: rule, Why: why, Peer: cl.peer}
	var client <-chan toolproto.Answer
	if cl.o.elicit != nil {
		// The client's user is asked too; `watcher approve` still
		// answers (a client whose user never looks must not hold the call
		// past the timeout, nor keep the operator from deciding).
		ch := make(chan toolproto.Answer, 1)
		ectx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		go func() {
			ans, err := cl.o.elicit(ectx, pend)
			if err == nil {
				ch <- ans
			}
		}()
		client = ch
	}
	ans := cl.g.m.approvals.wait(ctx, pend, timeout, client)
	cl.act.setApproval(ans)
	switch {
	case ans.Approved:
		cl.emit("approval", "approved", ans.By, ans.Reason, "", "", audit.VerdictAllowed)
		return nil
	case ans.TimedOut:
		cl.emit("approval", "timeout", "timeout", fmt.Sprintf("no approver answered within %s", timeout), "", "", audit.VerdictDenied)
		e := rpcErr(toolproto.CodeApproval, toolproto.TypeApprovalTimeout, "no approver answered within %s: denied (rule %s)", timeout, rule)
		e.Data.Rule = rule
		return e
	default:
		cl.emit("approval", "denied", ans.By, ans.Reason, "", "", audit.VerdictDenied)
		e := rpcErr(toolproto.CodeApproval, toolproto.TypeApprovalDenied, "denied by %s: %s (rule %s)", ans.By, orNone(ans.Reason), rule)
		e.Data.Rule = rule
		return e
	}
}

func orNone(s string) string {
	if s == "" {
		return "no reason given"
	}
	return s
}

// cutUTF8 is the longest prefix of b of at most n bytes that does not end
// inside a UTF-8 sequence.
func cutUTF8(b []byte, n int) []byte {
	if len(b) <= n {
		return b
	}
	i := n
	for i > 0 && i > n-utf8.UTFMax && !utf8.RuneStart(b[i]) {
		i--
	}
	return b[:i]
}

func capString(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "...(cut)"
}

// peerCred is the connecting process's credentials from the kernel
// (SO_PEERCRED, fixed at connect), or nil.
func peerCred(c net.Conn) *unix.Ucred {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return nil
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return nil
	}
	var cred *unix.Ucred
	raw.Control(func(fd uintptr) { cred, err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) })
	if err != nil {
		return nil
	}
	return cred
}

func credName(cred *unix.Ucred) string {
	if cred == nil {
		return ""
	}
	return "pid=" + strconv.Itoa(int(cred.Pid)) + " uid=" + strconv.Itoa(int(cred.Uid))
}

// limiter is a token bucket: rate calls per second, burst at once.
type limiter struct {
	mu     sync.Mutex
	rate   float64
	burst  float64
	tokens float64
	last   time.Time
}

func newLimiter() *limiter { return &limiter{} }

func (l *limiter) set(rate float64, burst int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.rate, l.burst = rate, float64(max(burst, 1))
	if l.last.IsZero() {
		l.tokens, l.last = l.burst, time.Now()
	}
	l.tokens = min(l.tokens, l.burst)
}

func (l *limiter) allow() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.rate <= 0 {
		return true
	}
	t := time.Now()
	l.tokens = min(l.burst, l.tokens+t.Sub(l.last).Seconds()*l.rate)
	l.last = t
	if l.tokens < 1 {
		return false
	}
	l.tokens--
	return true
}

var errNoRoot = errors.New("this sandbox has no workspace: file tools have nothing to work in")

// rateFold counts calls refused by the rate limit and records them as one
// event per second.
type rateFold struct {
	g     *sandboxGateway
	mu    sync.Mutex
	n     int
	tools map[string]int
	first time.Time
	timer *time.Timer
}

func (f *rateFold) add(tool string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n == 0 {
		f.first, f.tools = now(), map[string]int{}
		f.timer = time.AfterFunc(time.Second, f.flush)
	}
	f.n++
	f.tools[tool]++
}

func (f *rateFold) flush() {
	f.mu.Lock()
	n, tools, first := f.n, f.tools, f.first
	f.n, f.tools = 0, nil
	if f.timer != nil {
		f.timer.Stop()
		f.timer = nil
	}
	f.mu.Unlock()
	if n == 0 {
		return
	}
	sb := f.g.sb.Load()
	f.g.m.cfg.Emit(audit.Event{Time: now(), Kind: audit.KindTool, Verdict: audit.VerdictDenied, Severity: audit.SeverityAlert,
		Mechanism: "gateway", Rule: "limit:rate", Sandbox: audit.Sandbox{Name: sb.Name},
		Tool: &audit.ToolDetail{CallID: "-", Tool: "*", Stage: "decision", Decision: "deny", By: "policy",
			Reason: fmt.Sprintf("%d calls refused by the rate limit (%g/s, burst %d) since %s: %v", n, sb.Tools.Rate, sb.Tools.Burst, first.UTC().Format(time.RFC3339Nano), tools)}})
}
