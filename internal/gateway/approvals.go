package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"os/user"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/watcherhq/watcher/pkg/toolproto"
	"golang.org/x/sys/unix"
)

// Pending is a call waiting for a human.
type Pending struct {
	// ID is what `watcher approve ID` names: SANDBOX/CALL_ID.
	ID      string `json:"id"`
	Sandbox string `json:"sandbox"`
	Session string `json:"session"`
	CallID  string `json:"call_id"`
	Tool    string `json:"tool"`
	// Arguments are the call's arguments whole: the exact bytes the
	// request record holds and the tool decodes (valid UTF-8, checked by
	// checkArguments; at most MaxApprovalArgumentBytes).
	Arguments string `json:"arguments"`
	// ArgumentsBytes is their length, ArgumentsSHA256 their SHA-256 (hex,
	// also in the request record); approvals.decide can be bound to it.
	ArgumentsBytes  int       `json:"arguments_bytes"`
	ArgumentsSHA256 string    `json:"arguments_sha256"`
	Rule            string    `json:"rule"`
	Why             string    `json:"why"`
	Peer            string    `json:"peer,omitempty"`
	Since           time.Time `json:"since"`
	Deadline        time.Time `json:"deadline"`
}

type waiter struct {
	p  Pending
	ch chan toolproto.Answer
}

type approvals struct {
	mu      sync.Mutex
	pending map[string]*waiter
}

func newApprovals() *approvals { return &approvals{pending: map[string]*waiter{}} }

// wait registers p and blocks until an answer (from an approver, or on
// client when not nil: the caller's own user), the timeout (denied) or the
// end of ctx (the client left: denied).
func (a *approvals) wait(ctx context.Context, p Pending, timeout time.Duration, client <-chan toolproto.Answer) toolproto.Answer {
	p.ID = p.Sandbox + "/" + p.CallID
	p.Since = now()
	p.Deadline = p.Since.Add(timeout)
	w := &waiter{p: p, ch: make(chan toolproto.Answer, 1)}
	a.mu.Lock()
	if _, dup := a.pending[p.ID]; dup {
		a.mu.Unlock()
		return toolproto.Answer{By: "gateway", Reason: "another call with this id is already waiting"}
	}
	a.pending[p.ID] = w
	a.mu.Unlock()
	t := time.NewTimer(timeout)
	defer t.Stop()
	var ans toolproto.Answer
	select {
	case ans = <-w.ch:
	case ans = <-client:
	case <-t.C:
		ans = toolproto.Answer{TimedOut: true, By: "timeout"}
	case <-ctx.Done():
		ans = toolproto.Answer{By: "gateway", Reason: "the gateway stopped before an answer"}
	}
	a.mu.Lock()
	delete(a.pending, p.ID)
	a.mu.Unlock()
	// An answer that raced the timeout is taken if it is already there.
	select {
	case late := <-w.ch:
		if ans.TimedOut {
			ans = late
		}
	default:
	}
	return ans
}

func (a *approvals) list() []Pending {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := []Pending{}
	for _, w := range a.pending {
		out = append(out, w.p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Since.Before(out[j].Since) })
	return out
}

// decide answers the pending call id (SANDBOX/CALL_ID, or a CALL_ID that
// is pending in one sandbox only). With sum, only a call whose arguments
// have that SHA-256 is answered: the approver decides on the bytes it was
// shown, not on another call that took the id since.
func (a *approvals) decide(id, sum string, ans toolproto.Answer) *toolproto.Error {
	a.mu.Lock()
	defer a.mu.Unlock()
	w := a.pending[id]
	if w == nil && !strings.Contains(id, "/") {
		var hits []*waiter
		for _, x := range a.pending {
			if x.p.CallID == id {
				hits = append(hits, x)
			}
		}
		if len(hits) > 1 {
			return rpcErr(toolproto.CodeInvalidParams, toolproto.TypeInvalidParams, "call id %s is pending in several sandboxes: name it SANDBOX/%s", id, id)
		}
		if len(hits) == 1 {
			w = hits[0]
		}
	}
	if w == nil {
		return rpcErr(toolproto.CodeInvalidParams, toolproto.TypeNotFound, "no pending call %q (it may have timed out; see watcher approvals)", id)
	}
	if sum != "" && !strings.EqualFold(sum, w.p.ArgumentsSHA256) {
		return rpcErr(toolproto.CodeInvalidParams, toolproto.TypeInvalidParams, "the arguments of pending call %s have SHA-256 %s, not %s: nothing decided (see watcher approvals --show %s)",
			w.p.ID, w.p.ArgumentsSHA256, sum, w.p.ID)
	}
	delete(a.pending, w.p.ID)
	w.ch <- ans
	return nil
}

func (a *approvals) closeAll() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for id, w := range a.pending {
		w.ch <- toolproto.Answer{By: "gateway", Reason: "the gateway stopped"}
		delete(a.pending, id)
	}
}

type decideParams struct {
	ID      string `json:"id"`
	Approve bool   `json:"approve"`
	Reason  string `json:"reason"`
	// By is the name the approver claims (recorded beside the kernel's
	// uid of the connecting process).
	By string `json:"by"`
	// ArgumentsSHA256, when set, must be the pending call's (see decide).
	ArgumentsSHA256 string `json:"arguments_sha256,omitempty"`
}

// serveAdmin serves approvals.list and approvals.decide on the root-only
// socket.
func (m *Manager) serveAdmin(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			defer c.Close()
			who := approverName(c)
			cn := &conn{c: c}
			r := bufio.NewReaderSize(c, 64<<10)
			for {
				frame, err := readFrame(r, 1<<20)
				if err != nil {
					if err == errFrameTooLarge {
						cn.reply(nil, nil, rpcErr(toolproto.CodeTooLarge, toolproto.TypeFrameTooLarge, "frame too large"))
					}
					return
				}
				req, rerr := decodeRequest(frame)
				if rerr != nil {
					cn.reply(nil, nil, rerr)
					return
				}
				switch req.Method {
				case "approvals.list":
					cn.reply(req.ID, m.approvals.list(), nil)
				case "approvals.decide":
					var p decideParams
					if e := decodeParams(req.Params, &p); e != nil {
						cn.reply(req.ID, nil, e)
						continue
					}
					by := who
					if p.By != "" && !strings.Contains(who, "("+p.By+")") {
						by += " as " + strconv.Quote(p.By)
					}
					if e := m.approvals.decide(p.ID, p.ArgumentsSHA256, toolproto.Answer{Approved: p.Approve, By: by, Reason: p.Reason}); e != nil {
						cn.reply(req.ID, nil, e)
						continue
					}
					cn.reply(req.ID, map[string]any{"id": p.ID, "approved": p.Approve, "by": by}, nil)
				default:
					cn.reply(req.ID, nil, rpcErr(toolproto.CodeMethodNotFound, toolproto.TypeMethodNotFound, "no method %q (approvals.list, approvals.decide)", req.Method))
				}
			}
		}()
	}
}

// approverName is the connecting process's uid (and user name) from the
// kernel, which the approver cannot choose.
func approverName(c net.Conn) string {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return "unknown"
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return "unknown"
	}
	var cred *unix.Ucred
	raw.Control(func(fd uintptr) { cred, err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) })
	if err != nil || cred == nil {
		return "unknown"
	}
	name := "uid=" + strconv.Itoa(int(cred.Uid))
	if u, err := user.LookupId(strconv.Itoa(int(cred.Uid))); err == nil {
		name += "(" + u.Username + ")"
	}
	return name + " pid=" + strconv.Itoa(int(cred.Pid))
}

// AdminClient talks to the approvals socket.
type AdminClient struct{ Path string }

// List returns the pending calls.
func (c AdminClient) List() ([]Pending, error) {
	var out []Pending
	err := c.call("approvals.list", nil, &out)
	return out, err
}

// Decide approves or denies a pending call; by is the approver's name.
func (c AdminClient) Decide(id string, approve bool, reason, by string) error {
	return c.DecideExact(id, "", approve, reason, by)
}

// DecideExact is Decide for the pending call only if its arguments have
// the SHA-256 sum (hex; "" for any).
func (c AdminClient) DecideExact(id, sum string, approve bool, reason, by string) error {
	return c.call("approvals.decide", decideParams{ID: id, Approve: approve, Reason: reason, By: by, ArgumentsSHA256: sum}, nil)
}

func (c AdminClient) call(method string, params, out any) error {
	nc, err := net.DialTimeout("unix", c.Path, 5*time.Second)
	if err != nil {
		return err
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(30 * time.Second))
	req := map[string]any{"jsonrpc": "2.0", "id": 1, "method": method}
	if params != nil {
		req["params"] = params
	}
	b, _ := json.Marshal(req)
	if _, err := nc.Write(append(b, '\n')); err != nil {
		return err
	}
	line, err := bufio.NewReader(nc).ReadBytes('\n')
	if err != nil {
		return err
	}
	var resp toolproto.Response
	if err := json.Unmarshal(line, &resp); err != nil {
		return err
	}
	if resp.Error != nil {
		return resp.Error
	}
	if out != nil {
		return json.Unmarshal(resp.Result, out)
	}
	return nil
}
