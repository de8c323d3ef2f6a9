package gateway

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"sync"

	"github.com/watcherhq/watcher/pkg/toolproto"
)

// Memory bounds: a client must not grow the agent without limit.
const (
	// maxActions is how many calls a session remembers for resume.
	maxActions = 10000
	// maxSessionOutput caps the outputs and arguments a session keeps;
	// the oldest are dropped first (the call stays listed, marked
	// output_dropped).
	maxSessionOutput = 4 << 20
	// maxSessions per sandbox; the least recently used is forgotten. With
	// maxSessionOutput this bounds a sandbox's sessions near 256 MiB.
	maxSessions = 64
)

// sessionCall is one call of a session: its wire form and the session
// that keeps it.
type sessionCall struct {
	toolproto.Action

	session string
	s       *session
}

type sessions struct {
	mu    sync.Mutex
	m     map[string]*session
	clock uint64
	// dir keeps each session's calls (DIR/SESSION.jsonl), so numbering
	// and resume survive an agent restart; "" keeps them in memory only.
	dir string
}

func newSessions(dir string) *sessions { return &sessions{m: map[string]*session{}, dir: dir} }

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
			oldest.close()
			delete(ss.m, oldest.name)
		}
		s = &session{name: name, byID: map[string]*sessionCall{}}
		if ss.dir != "" {
			s.load(filepath.Join(ss.dir, name+".jsonl"))
		}
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
	actions []*sessionCall
	byID    map[string]*sessionCall
	used    uint64 // sessions.clock at the last use
	outputs int    // bytes of outputs kept
	f       *os.File
}

// load reads the session's file: the last line of each call wins; a call
// still running when the agent stopped is marked interrupted (its records
// in the ledger say how far it got). Best effort: the ledger is the
// record, this file only numbering and resume.
func (s *session) load(path string) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return
	}
	lines := 0
	if f, err := os.Open(path); err == nil {
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64<<10), 16<<20)
		bySeq := map[uint64]*sessionCall{}
		for sc.Scan() {
			var a sessionCall
			if json.Unmarshal(sc.Bytes(), &a) != nil || a.Seq == 0 {
				continue
			}
			lines++
			if prev := bySeq[a.Seq]; prev == nil {
				s.actions = append(s.actions, &a)
			} else {
				*prev = a
				continue
			}
			bySeq[a.Seq] = s.actions[len(s.actions)-1]
		}
		f.Close()
		if len(s.actions) > maxActions {
			s.actions = s.actions[len(s.actions)-maxActions:]
		}
		for _, a := range s.actions {
			a.session, a.s = s.name, s
			if a.Status == "running" {
				a.Status = "interrupted"
				a.Error = rpcErr(toolproto.CodeToolFailed, toolproto.TypeToolFailed, "the agent stopped while the call ran: see watcher replay --call %s", a.CallID)
			}
			s.byID[a.CallID] = a
			s.seq = max(s.seq, a.Seq)
			s.outputs += a.size()
		}
		s.trimOutputs()
	}
	if lines > 2*len(s.actions)+100 {
		s.rewrite(path)
	}
	s.f, _ = os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
}

// rewrite compacts the file to one line per call.
func (s *session) rewrite(path string) {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return
	}
	w := bufio.NewWriter(f)
	for _, a := range s.actions {
		if b, err := json.Marshal(a); err == nil {
			w.Write(append(b, '\n'))
		}
	}
	if w.Flush() == nil && f.Close() == nil {
		os.Rename(tmp, path)
	} else {
		os.Remove(tmp)
	}
}

// persist appends a's state; s.mu is held.
func (s *session) persist(a *sessionCall) {
	if s.f == nil {
		return
	}
	if b, err := json.Marshal(a); err == nil {
		s.f.Write(append(b, '\n'))
	}
}

func (s *session) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.f != nil {
		s.f.Close()
		s.f = nil
	}
}

// trimOutputs drops the oldest outputs over maxSessionOutput; s.mu is
// held (or s not yet shared).
func (s *session) trimOutputs() {
	for _, old := range s.actions {
		if s.outputs <= maxSessionOutput {
			break
		}
		if n := old.size(); n > 0 && !old.OutputDropped && old.Status != "running" {
			s.outputs -= n
			old.Output, old.Arguments, old.OutputDropped = nil, json.RawMessage("null"), true
		}
	}
}

// begin numbers a new call, or returns the earlier call with the same id.
func (s *session) begin(callID, tool string, args json.RawMessage) (*sessionCall, *sessionCall) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if prev := s.byID[callID]; prev != nil {
		cp := *prev
		return nil, &cp
	}
	s.seq++
	a := &sessionCall{Action: toolproto.Action{Seq: s.seq, CallID: callID, Tool: tool, Arguments: append(json.RawMessage(nil), args...),
		Time: now(), Status: "running"}, session: s.name, s: s}
	s.outputs += len(a.Arguments)
	s.trimOutputs()
	s.actions = append(s.actions, a)
	s.byID[callID] = a
	if len(s.actions) > maxActions {
		if !s.actions[0].OutputDropped {
			s.outputs -= s.actions[0].size()
		}
		delete(s.byID, s.actions[0].CallID)
		s.actions = s.actions[1:]
	}
	s.persist(a)
	return a, nil
}

// size is what the call's arguments and output weigh in memory.
func (a *sessionCall) size() int { return len(a.Arguments) + len(a.Output) }

func (a *sessionCall) setDecision(d, rule string) {
	a.s.mu.Lock()
	a.Decision, a.Rule = d, rule
	a.s.persist(a)
	a.s.mu.Unlock()
}

func (a *sessionCall) decided() bool {
	a.s.mu.Lock()
	defer a.s.mu.Unlock()
	return a.Decision != ""
}

func (a *sessionCall) setApproval(ans toolproto.Answer) {
	a.s.mu.Lock()
	a.Approval = &ans
	a.s.persist(a)
	a.s.mu.Unlock()
}

func (a *sessionCall) finish(out json.RawMessage, e *toolproto.Error) {
	a.s.mu.Lock()
	defer a.s.mu.Unlock()
	if e != nil {
		a.Status, a.Error = "error", e
		a.s.persist(a)
		return
	}
	a.Status, a.Output = "ok", out
	a.s.outputs += len(out)
	a.s.trimOutputs()
	a.s.persist(a)
}

// after returns copies of the calls numbered above seq, in order.
func (s *session) after(seq uint64) ([]toolproto.Action, uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []toolproto.Action{}
	for _, a := range s.actions {
		if a.Seq > seq {
			out = append(out, a.Action)
		}
	}
	return out, s.seq
}

func (g *sandboxGateway) resume(raw json.RawMessage) (any, *toolproto.Error) {
	var p toolproto.ResumeParams
	if e := decodeParams(raw, &p); e != nil {
		return nil, e
	}
	if p.Session == "" {
		p.Session = "default"
	}
	if !idPattern.MatchString(p.Session) {
		return nil, rpcErr(toolproto.CodeInvalidParams, toolproto.TypeInvalidParams, `"session" must be 1-64 of letters, digits, '_', '.', '-'`)
	}
	acts, last := g.sessions.get(p.Session).after(p.AfterSeq)
	return &toolproto.Resumed{Session: p.Session, LastSeq: last, Actions: acts}, nil
}

func (ss *sessions) closeAll() {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for _, s := range ss.m {
		s.close()
	}
}
