package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/policy"
	"github.com/watcherhq/watcher/pkg/toolproto"
)

// This file is the gateway as other protocols reach it (MCP, in
// internal/mcpserve): the same decision path as tool.request, the same
// records, the same sessions.

// Caller is who makes a call over another protocol.
type Caller struct {
	// Cred is the calling process's credentials from the kernel
	// (SO_PEERCRED of its connection); nil refuses shell.
	Cred *unix.Ucred
	// Protocol names the protocol ("mcp"); Session and Request are its
	// session and request id, recorded with every step of the call.
	Protocol, Session, Request string
	// Elicit, when set, asks the client's user about a call the policy
	// holds for approval; it races `watcher approve`, the first answer
	// decides. An error leaves the call to `watcher approve`.
	Elicit func(context.Context, Pending) (toolproto.Answer, error)
}

// ErrNoGateway says the sandbox serves no gateway.
var ErrNoGateway = fmt.Errorf("no tool gateway for this sandbox")

func (m *Manager) gateway(sandbox string) (*sandboxGateway, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	g := m.gateways[sandbox]
	if g == nil {
		return nil, fmt.Errorf("sandbox %q: %w", sandbox, ErrNoGateway)
	}
	return g, nil
}

// Sandbox is the sandbox's policy as the gateway applies it now (limits
// filled in with their defaults).
func (m *Manager) Sandbox(sandbox string) (*policy.Sandbox, error) {
	g, err := m.gateway(sandbox)
	if err != nil {
		return nil, err
	}
	return g.sb.Load(), nil
}

// Tools is tool.list: the tools the sandbox's policy allows or asks for.
func (m *Manager) Tools(sandbox string) (*toolproto.ToolList, error) {
	g, err := m.gateway(sandbox)
	if err != nil {
		return nil, err
	}
	return g.toolList(g.sb.Load()), nil
}

// Call is tool.request for a caller of another protocol: the same checks,
// decision, approval, tool and records. ctx ends the call's wait for
// approval and its shell command.
func (m *Manager) Call(ctx context.Context, sandbox string, who Caller, p toolproto.ToolParams) (*toolproto.CallResult, *toolproto.Error) {
	g, err := m.gateway(sandbox)
	if err != nil {
		return nil, rpcErr(toolproto.CodeToolFailed, toolproto.TypeToolFailed, "%v", err)
	}
	out, rerr := g.request(who.origin(ctx), p, g.sb.Load())
	if rerr != nil {
		return nil, rerr
	}
	return out.(*toolproto.CallResult), nil
}

// Exchange is exchange.put (put) or exchange.get for a caller of another
// protocol: args ({"name", "content"} for put, {"name"} for get) are
// decoded as strictly as any params, then the same checks, decision and
// records.
func (m *Manager) Exchange(ctx context.Context, sandbox string, who Caller, put bool, callID, session string, args json.RawMessage) (*toolproto.CallResult, *toolproto.Error) {
	g, err := m.gateway(sandbox)
	if err != nil {
		return nil, rpcErr(toolproto.CodeToolFailed, toolproto.TypeToolFailed, "%v", err)
	}
	var a struct {
		Name    string  `json:"name"`
		Content *string `json:"content"`
	}
	if e := decodeParams(args, &a); e != nil {
		return nil, e
	}
	if put != (a.Content != nil) {
		return nil, rpcErr(toolproto.CodeInvalidParams, toolproto.TypeInvalidParams, `exchange put takes "name" and "content", get "name" alone`)
	}
	p := toolproto.ExchangeParams{Name: a.Name, CallID: callID, Session: session}
	if a.Content != nil {
		p.Content = *a.Content
	}
	raw, err := json.Marshal(p)
	if err != nil {
		return nil, rpcErr(toolproto.CodeInternal, toolproto.TypeInternal, "%v", err)
	}
	o := who.origin(ctx)
	var out any
	var rerr *toolproto.Error
	if put {
		out, rerr = g.exchangePut(o, raw, g.sb.Load())
	} else {
		out, rerr = g.exchangeGet(o, raw, g.sb.Load())
	}
	if rerr != nil {
		return nil, rerr
	}
	return out.(*toolproto.CallResult), nil
}

func (who Caller) origin(ctx context.Context) *origin {
	return &origin{ctx: ctx, peer: credName(who.Cred), cred: who.Cred, proto: who.Protocol,
		protoSession: who.Session, protoRequest: who.Request, elicit: who.Elicit}
}

// Record records an event of a sandbox's gateway that belongs to no call
// (an MCP client's initialize): kind tool, mechanism gateway.
func (m *Manager) Record(sandbox string, d audit.ToolDetail, message string) {
	m.cfg.Emit(audit.Event{Time: now(), Kind: audit.KindTool, Verdict: audit.VerdictRecorded, Severity: audit.SeverityAlert,
		Mechanism: "gateway", Sandbox: audit.Sandbox{Name: sandbox}, Message: message, Tool: &d})
}

// PeerCred is the credentials of the process at the other end of a Unix
// socket connection (nil for another kind of connection).
func PeerCred(c net.Conn) *unix.Ucred { return peerCred(c) }

// httpConns hands the connections of a sandbox socket that speak HTTP
// (MCP's Streamable HTTP) to an http.Server; the others speak the
// gateway's own protocol. It is a net.Listener fed by accept.
type httpConns struct {
	ch     chan net.Conn
	addr   net.Addr
	once   sync.Once
	closed chan struct{}
}

func newHTTPConns(addr net.Addr) *httpConns {
	return &httpConns{ch: make(chan net.Conn), addr: addr, closed: make(chan struct{})}
}

func (l *httpConns) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *httpConns) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *httpConns) Addr() net.Addr { return l.addr }

// hand gives c to the http.Server; false once it is closed.
func (l *httpConns) hand(c net.Conn) bool {
	select {
	case l.ch <- c:
		return true
	case <-l.closed:
		return false
	}
}

// PolicyFollower is an HTTP handler told when its sandbox's policy was
// reloaded (MCP tells its clients the tool list changed). It is called
// with the manager locked: it must not call back into it.
type PolicyFollower interface{ PolicyChanged(*policy.Sandbox) }

func (g *sandboxGateway) httpHandler() http.Handler {
	if g.http == nil {
		return nil
	}
	return g.http.Handler
}

// HTTPHandler makes the handler of a sandbox's HTTP requests (nil: the
// socket speaks the gateway's protocol only).
type HTTPHandler func(sandbox string) http.Handler
