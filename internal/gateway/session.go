package gateway

import (
	"encoding/json"
	"sync"
	"time"
)

// Memory bounds: a client must not grow the agent without limit.
const (
	// maxActions is how many calls a session remembers for resume.
	maxActions = 10000
	// maxSessionOutput caps the outputs a session keeps; older outputs are
	// dropped first (the call stays listed, marked output_dropped).
	maxSessionOutput = 4 << 20
	// maxSessions per sandbox; the least recently used is forgotten.
	maxSessions = 256
)

// Action is one call of a session as session.resume returns it.
type Action struct {
	Seq       uint64          `json:"seq"`
	CallID    string          `json:"call_id"`
	Tool      string          `json:"tool"`
	Arguments json.RawMessage `json:"arguments"`
	Time      time.Time       `json:"time"`
	// Decision is allow, deny or ask; Rule the rule that decided.
	Decision string `json:"decision,omitempty"`
	Rule     string `json:"rule,omitempty"`
	// Approval is set for calls that asked.
	Approval *Answer `json:"approval,omitempty"`
	// Status is running, ok or error.
	Status string          `json:"status"`
	Output json.RawMessage `json:"output,omitempty"`
	// OutputDropped says the output was forgotten to bound memory (the
	// ledger keeps the call's records and hashes).
	OutputDropped bool   `json:"output_dropped,omitempty"`
	Error         *Error `json:"error,omitempty"`

	session string
	s       *session
}

type sessions struct {
	mu    sync.Mutex
	m     map[string]*session
	clock uint64
}

func newSessions() *sessions { return &sessions{m: map[string]*session{}} }

func (ss *sessions) get(name string) *session {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.clock++
	s := ss.m[name]
	if s == nil {
		if len(ss.m) >= maxSessions {
			var oldest *session
			for _, x := range ss.m {
				if oldest == nil || x.used < oldest.used {
					oldest = x
				}
			}
			delete(ss.m, oldest.name)
		}
		s = &session{name: name, byID: map[string]*Action{}}
		ss.m[name] = s
	}
	s.used = ss.clock
	return s
}

// session is the ordered calls of one session.
type session struct {
	name    string
	mu      sync.Mutex
	seq     uint64
	actions []*Action
	byID    map[string]*Action
	used    uint64 // sessions.clock at the last use
	outputs int    // bytes of outputs kept
}

// begin numbers a new call, or returns the earlier call with the same id.
func (s *session) begin(callID, tool string, args json.RawMessage) (*Action, *Action) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if prev := s.byID[callID]; prev != nil {
		cp := *prev
		return nil, &cp
	}
	s.seq++
	a := &Action{Seq: s.seq, CallID: callID, Tool: tool, Arguments: append(json.RawMessage(nil), args...), Time: now(), Status: "running", session: s.name, s: s}
	s.actions = append(s.actions, a)
	s.byID[callID] = a
	if len(s.actions) > maxActions {
		s.outputs -= len(s.actions[0].Output)
		delete(s.byID, s.actions[0].CallID)
		s.actions = s.actions[1:]
	}
	return a, nil
}

func (a *Action) setDecision(d, rule string) {
	a.s.mu.Lock()
	a.Decision, a.Rule = d, rule
	a.s.mu.Unlock()
}

func (a *Action) decided() bool {
	a.s.mu.Lock()
	defer a.s.mu.Unlock()
	return a.Decision != ""
}

func (a *Action) setApproval(ans Answer) {
	a.s.mu.Lock()
	a.Approval = &ans
	a.s.mu.Unlock()
}

func (a *Action) finish(out json.RawMessage, e *Error) {
	a.s.mu.Lock()
	defer a.s.mu.Unlock()
	if e != nil {
		a.Status, a.Error = "error", e
		return
	}
	a.Status, a.Output = "ok", out
	s := a.s
	s.outputs += len(out)
	for _, old := range s.actions {
		if s.outputs <= maxSessionOutput {
			break
		}
		if len(old.Output) > 0 {
			s.outputs -= len(old.Output)
			old.Output, old.OutputDropped = nil, true
		}
	}
}

// after returns copies of the calls numbered above seq, in order.
func (s *session) after(seq uint64) ([]Action, uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []Action{}
	for _, a := range s.actions {
		if a.Seq > seq {
			out = append(out, *a)
		}
	}
	return out, s.seq
}

type resumeParams struct {
	Session  string `json:"session"`
	AfterSeq uint64 `json:"after_seq"`
}

// Resumed is what session.resume returns.
type Resumed struct {
	Session string   `json:"session"`
	LastSeq uint64   `json:"last_seq"`
	Actions []Action `json:"actions"`
}

func (g *sandboxGateway) resume(raw json.RawMessage) (any, *Error) {
	var p resumeParams
	if e := decodeParams(raw, &p); e != nil {
		return nil, e
	}
	if p.Session == "" {
		p.Session = "default"
	}
	if !idPattern.MatchString(p.Session) {
		return nil, rpcErr(CodeInvalidParams, TypeInvalidParams, `"session" must be 1-64 of letters, digits, '_', '.', '-'`)
	}
	acts, last := g.sessions.get(p.Session).after(p.AfterSeq)
	return &Resumed{Session: p.Session, LastSeq: last, Actions: acts}, nil
}
