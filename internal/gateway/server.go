package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/policy"
	"github.com/watcherhq/watcher/pkg/toolproto"
)

// maxConns caps the connections of one sandbox gateway.
const maxConns = 64

// writeTimeout bounds how long a response may wait for a client that does
// not read.
const writeTimeout = 10 * time.Second

// sandboxGateway serves one sandbox's socket.
type sandboxGateway struct {
	m    *Manager
	name string
	sb   atomic.Pointer[policy.Sandbox]
	// fileRules are the sandbox's file rules as the kernel enforces them.
	fileRules atomic.Pointer[[]policy.FileRule]
	ln        net.Listener
	path      string

	limiter  *limiter
	fold     *rateFold
	sessions *sessions
	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    map[net.Conn]struct{}
	// http serves the socket's connections that speak HTTP (MCP), when
	// the manager has an HTTP handler.
	http      *http.Server
	httpConns *httpConns
}

func (m *Manager) startSandbox(pol *policy.Policy, sb *policy.Sandbox) (*sandboxGateway, error) {
	mode, err := sb.Tools.Socket.FileMode()
	if err != nil {
		return nil, err
	}
	path := SocketPath(m.cfg.SocketDir, sb.Name)
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	// A socket for someone other than root needs its parents traversable
	// (execute only: nothing in them can be listed).
	if mode&0o077 != 0 || sb.Tools.Socket.UID != 0 {
		for _, d := range []string{m.cfg.SocketDir, filepath.Dir(dir)} {
			st, err := os.Stat(d)
			if err != nil {
				return nil, err
			}
			if st.Mode().Perm()&0o001 == 0 {
				if err := os.Chmod(d, st.Mode().Perm()|0o001); err != nil {
					return nil, err
				}
			}
		}
	}
	// The directory opens to exactly whom the socket does.
	dirMode := os.FileMode(0o700)
	if mode&0o070 != 0 {
		dirMode |= 0o050
	}
	if mode&0o007 != 0 {
		dirMode |= 0o005
	}
	if err := os.Chmod(dir, dirMode); err != nil {
		return nil, err
	}
	if err := os.Chown(dir, sb.Tools.Socket.UID, sb.Tools.Socket.GID); err != nil {
		return nil, err
	}
	ln, err := listenUnix(path, mode, sb.Tools.Socket.UID, sb.Tools.Socket.GID)
	if err != nil {
		return nil, err
	}
	g := &sandboxGateway{m: m, name: sb.Name, ln: ln, path: path, conns: map[net.Conn]struct{}{},
		limiter: newLimiter(), sessions: newSessions(m.stateDir(sb.Name))}
	g.fold = &rateFold{g: g}
	g.ctx, g.cancel = context.WithCancel(context.Background())
	g.setPolicy(pol, sb)
	if m.cfg.HTTP != nil {
		g.httpConns = newHTTPConns(ln.Addr())
		g.http = &http.Server{Handler: m.cfg.HTTP(sb.Name), ReadHeaderTimeout: writeTimeout,
			ConnContext: func(ctx context.Context, c net.Conn) context.Context {
				if bc, ok := c.(*bufConn); ok {
					ctx = context.WithValue(ctx, credKey{}, peerCred(bc.Conn))
				}
				return ctx
			}}
		g.wg.Add(1)
		go func() { defer g.wg.Done(); g.http.Serve(g.httpConns) }()
	}
	g.wg.Add(1)
	go func() { defer g.wg.Done(); g.accept() }()
	return g, nil
}

func (g *sandboxGateway) setPolicy(pol *policy.Policy, sb *policy.Sandbox) {
	rules := pol.FileRules(sb)
	g.fileRules.Store(&rules)
	if d := sb.Tools.Exchange.Dir; d != "" {
		os.MkdirAll(d, 0o755) // an error shows at the first exchange call
	}
	// A workspace that does not exist yet (the default policy's, on a new
	// host) is made, so the file tools have somewhere to work; an error
	// shows at the first call.
	for _, w := range sb.Workspace {
		if _, err := os.Lstat(w); errors.Is(err, os.ErrNotExist) {
			os.MkdirAll(w, 0o755)
		}
	}
	g.sb.Store(withDefaults(sb))
	g.limiter.set(sb.Tools.Rate, sb.Tools.Burst)
}

func (g *sandboxGateway) sameSocket(sb *policy.Sandbox) bool {
	return g.sb.Load().Tools.Socket == sb.Tools.Socket
}

func (g *sandboxGateway) close() {
	g.cancel()
	g.ln.Close()
	if g.http != nil {
		g.httpConns.Close()
		g.http.Close()
	}
	g.mu.Lock()
	for c := range g.conns {
		c.Close()
	}
	g.mu.Unlock()
	g.wg.Wait()
	g.fold.flush()
	g.sessions.closeAll()
}

func (g *sandboxGateway) accept() {
	for {
		c, err := g.ln.Accept()
		if err != nil {
			return
		}
		g.mu.Lock()
		if len(g.conns) >= maxConns {
			g.mu.Unlock()
			writeFrame(c, &toolproto.Response{JSONRPC: "2.0", Error: rpcErr(toolproto.CodeRateLimited, toolproto.TypeBusy, "too many connections to this gateway (%d)", maxConns)})
			c.Close()
			continue
		}
		g.conns[c] = struct{}{}
		g.mu.Unlock()
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			g.serveConn(c)
			g.mu.Lock()
			delete(g.conns, c)
			g.mu.Unlock()
		}()
	}
}

// conn is one client connection.
type conn struct {
	origin
	c        net.Conn
	wmu      sync.Mutex
	inflight atomic.Int32
}

// origin is where a call comes from: the connection's context and the
// kernel's credentials of its process, and for a call over MCP the
// protocol's session and request id and a way to ask the client's user.
type origin struct {
	ctx  context.Context
	peer string
	cred *unix.Ucred
	// proto is "mcp" for calls over MCP ("" for the gateway's own
	// protocol); protoSession and protoRequest are MCP's session and
	// JSON-RPC request id, recorded with each step of the call.
	proto, protoSession, protoRequest string
	// elicit, when set, asks the client's user about a call the policy
	// holds for approval (MCP elicitation); its answer and `watcher
	// approve` race, the first decides.
	elicit func(context.Context, Pending) (toolproto.Answer, error)
}

func (c *conn) reply(id json.RawMessage, result any, rerr *toolproto.Error) {
	resp := &toolproto.Response{JSONRPC: "2.0", ID: id, Error: rerr}
	if id == nil {
		resp.ID = json.RawMessage("null")
	}
	if rerr == nil {
		b, err := json.Marshal(result)
		if err != nil {
			resp.Error = rpcErr(toolproto.CodeInternal, toolproto.TypeInternal, "encode result: %v", err)
		} else {
			resp.Result = b
		}
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.c.SetWriteDeadline(time.Now().Add(writeTimeout))
	if err := writeFrame(c.c, resp); err != nil {
		c.c.Close()
	}
}

func writeFrame(w io.Writer, resp *toolproto.Response) error {
	b, err := json.Marshal(resp)
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// serveConn reads frames until the client leaves or sends a malformed or
// oversized frame: that frame gets an error, then the connection (only
// this one) is closed, since the stream can no longer be trusted to be in
// step.
func (g *sandboxGateway) serveConn(nc net.Conn) {
	defer func() {
		if nc != nil {
			nc.Close()
		}
	}()
	ctx, cancel := context.WithCancel(g.ctx)
	defer cancel()
	cred := peerCred(nc)
	c := &conn{c: nc, origin: origin{ctx: ctx, peer: credName(cred), cred: cred}}
	r := bufio.NewReaderSize(nc, 64<<10)
	if g.http != nil {
		// A request line (POST /mcp HTTP/1.1) starts with a capital
		// letter, a frame of the gateway's protocol with '{'.
		b, err := r.Peek(1)
		if err != nil {
			return
		}
		if b[0] >= 'A' && b[0] <= 'Z' {
			bc := &bufConn{Conn: nc, r: r, done: make(chan struct{})}
			if g.httpConns.hand(bc) {
				nc = nil // the http.Server closes it
				// It counts against maxConns until then.
				select {
				case <-bc.done:
				case <-g.ctx.Done():
				}
			}
			return
		}
	}
	// Calls in flight finish when the client leaves (an agent that crashed
	// reads their results with session.resume); the connection counts
	// against maxConns until they do.
	var calls sync.WaitGroup
	defer calls.Wait()
	for {
		sb := g.sb.Load()
		frame, err := readFrame(r, sb.Tools.MaxRequestBytes)
		if errors.Is(err, errFrameTooLarge) {
			e := rpcErr(toolproto.CodeTooLarge, toolproto.TypeFrameTooLarge, "request frame over %d bytes: closing the connection", sb.Tools.MaxRequestBytes)
			e.Data.Limit = int64(sb.Tools.MaxRequestBytes)
			c.reply(nil, nil, e)
			return
		}
		if err != nil {
			return
		}
		req, rerr := decodeRequest(frame)
		if rerr != nil {
			rerr.Message += ": closing the connection"
			c.reply(nil, nil, rerr)
			return
		}
		if req.ID == nil {
			c.reply(nil, nil, rpcErr(toolproto.CodeInvalidRequest, toolproto.TypeInvalidRequest, "notifications are not served: give every request an id"))
			continue
		}
		if max := sb.Tools.MaxInFlight; max > 0 && int(c.inflight.Load()) >= max {
			c.reply(req.ID, nil, rpcErr(toolproto.CodeRateLimited, toolproto.TypeBusy, "%d calls already running on this connection", max))
			continue
		}
		c.inflight.Add(1)
		calls.Add(1)
		go func() {
			defer calls.Done()
			defer c.inflight.Add(-1)
			res, rerr := g.dispatch(c, req, sb)
			c.reply(req.ID, res, rerr)
		}()
	}
}

// bufConn is a connection whose first bytes were read ahead into r; done
// is closed when it is closed.
type bufConn struct {
	net.Conn
	r    *bufio.Reader
	once sync.Once
	done chan struct{}
}

func (c *bufConn) Read(b []byte) (int, error) { return c.r.Read(b) }

func (c *bufConn) Close() error {
	c.once.Do(func() { close(c.done) })
	return c.Conn.Close()
}

type credKey struct{}

// RequestCred is the credentials of the process that sent an HTTP request
// on a sandbox socket, from the kernel (nil when unknown).
func RequestCred(r *http.Request) *unix.Ucred {
	c, _ := r.Context().Value(credKey{}).(*unix.Ucred)
	return c
}

func (g *sandboxGateway) dispatch(c *conn, req *toolproto.Request, sb *policy.Sandbox) (any, *toolproto.Error) {
	switch req.Method {
	case "tool.list":
		return g.toolList(sb), nil
	case "tool.request":
		return g.toolRequest(&c.origin, req.Params, sb)
	case "session.resume":
		return g.resume(req.Params)
	case "exchange.put":
		return g.exchangePut(&c.origin, req.Params, sb)
	case "exchange.get":
		return g.exchangeGet(&c.origin, req.Params, sb)
	}
	return nil, rpcErr(toolproto.CodeMethodNotFound, toolproto.TypeMethodNotFound, "no method %q (tool.list, tool.request, session.resume, exchange.put, exchange.get)", req.Method)
}

func (g *sandboxGateway) toolList(sb *policy.Sandbox) *toolproto.ToolList {
	out := &toolproto.ToolList{Sandbox: sb.Name, Tools: []toolproto.ToolInfo{}, Workspace: sb.Workspace, Exchange: sb.Tools.Exchange.Dir != "",
		Limits: toolproto.Limits{MaxRequestBytes: sb.Tools.MaxRequestBytes, MaxArgumentBytes: sb.Tools.MaxArgumentBytes,
			MaxOutputBytes: sb.Tools.MaxOutputBytes, Rate: sb.Tools.Rate, Burst: sb.Tools.Burst,
			MaxInFlight: sb.Tools.MaxInFlight, AskTimeoutSec: sb.Tools.AskTimeout.Seconds()}}
	for _, t := range policy.ToolNames() {
		if r := sb.Tools.Tool(t); r != nil && r.Action != policy.ToolDeny {
			out.Tools = append(out.Tools, toolproto.ToolInfo{Tool: t, Action: string(r.Action), Rule: r.RuleName()})
		}
	}
	return out
}
