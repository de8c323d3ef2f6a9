// Package mcpserve serves a sandbox's tool gateway over the Model Context
// Protocol (MCP), with the official Go SDK: Streamable HTTP on the
// sandbox's gateway socket (SOCKET_DIR/sandboxes/NAME/tools.sock, which
// tells HTTP from the gateway's own protocol by the first byte), and, in
// `watcher mcp serve`, a relay from stdio or a loopback port to it.
//
// There is one decision path: tools/call goes to gateway.Manager.Call,
// which is tool.request's (policy rule, approval, tool, ledger records).
// tools/list shows the tools the policy allows or asks for, with their
// argument schemas. A refusal is a tool result with isError set whose text
// says what was refused, by which rule and layer, and which policy lines
// would allow it. `ask` rules ask the client's user by elicitation when
// the client declares it, racing `watcher approve`.
package mcpserve

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/gateway"
	"github.com/watcherhq/watcher/internal/policy"
	"github.com/watcherhq/watcher/pkg/toolproto"
)

// Keys of a tools/call result's _meta: the call's id and session in the
// gateway and the ledger.
const (
	MetaCallID  = "watcher/call_id"
	MetaSession = "watcher/session"
)

// Path is where the MCP endpoint is served on the socket.
const Path = "/mcp"

// sessionTimeout ends an MCP session idle this long.
const sessionTimeout = time.Hour

// maxBody caps one HTTP request body, below the sandbox's
// max_request_bytes; max_argument_bytes then applies to the call.
const maxBody = 16 << 20

// Headers the handler sets on each request for the MCP layer (any a client
// sends are dropped first): the kernel's credentials of the caller and the
// JSON-RPC id of the message.
const (
	hdrCred    = "X-Watcher-Peer-Cred"
	hdrRequest = "X-Watcher-Request-Id"
)

// Handler serves MCP for one sandbox of m. version is watcher's, shown to
// clients as the server's. It follows the sandbox's policy: after a reload
// (gateway.PolicyFollower) its clients are told the tool list changed.
func Handler(m *gateway.Manager, sandbox, version string) http.Handler {
	s := &server{m: m, sandbox: sandbox, version: version}
	s.srv = s.newServer()
	s.h = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s.srv }, &mcp.StreamableHTTPOptions{
		// A client that leaves without ending its session does not keep
		// it (and its memory) for ever.
		SessionTimeout: sessionTimeout})
	return s
}

func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// The tools are registered at the first request: the handler is made
	// while the manager starts the sandbox's gateway.
	s.once.Do(func() {
		if sb, err := s.m.Sandbox(s.sandbox); err == nil {
			s.PolicyChanged(sb)
		}
	})
	r.Header.Del(hdrCred)
	r.Header.Del(hdrRequest)
	if c := gateway.RequestCred(r); c != nil {
		r.Header.Set(hdrCred, fmt.Sprintf("%d:%d:%d", c.Pid, c.Uid, c.Gid))
	}
	if r.Method == http.MethodPost && r.Body != nil {
		// A message is capped like a frame of the gateway's own
		// protocol (tools.max_request_bytes).
		limit := maxBody
		if sb, err := s.m.Sandbox(s.sandbox); err == nil && sb.Tools.MaxRequestBytes > 0 {
			limit = min(limit, sb.Tools.MaxRequestBytes)
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, int64(limit)+1))
		if err != nil || len(body) > limit {
			http.Error(w, fmt.Sprintf("request body over %d bytes (tools.max_request_bytes)", limit), http.StatusRequestEntityTooLarge)
			return
		}
		var msg struct {
			ID json.RawMessage `json:"id"`
		}
		if json.Unmarshal(body, &msg) == nil && len(msg.ID) > 0 {
			r.Header.Set(hdrRequest, string(msg.ID))
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	s.h.ServeHTTP(w, r)
}

type server struct {
	m       *gateway.Manager
	sandbox string
	version string
	srv     *mcp.Server
	h       http.Handler
	// calls numbers the calls served, for their call ids.
	calls atomic.Uint64
	// mu guards shown: the tools registered with the SDK (names and
	// their JSON), which mirror the policy so that a change notifies the
	// clients.
	mu    sync.Mutex
	shown map[string]string
	once  sync.Once
}

func (s *server) newServer() *mcp.Server {
	srv := mcp.NewServer(&mcp.Implementation{Name: "watcher", Title: "watcher gateway for sandbox " + s.sandbox, Version: s.version},
		&mcp.ServerOptions{
			Instructions: "Tools of the watcher sandbox " + s.sandbox + ". Every call is decided by the sandbox's policy " +
				"and recorded; a refused call returns isError with what was refused and the policy lines that would allow it.",
			InitializedHandler: s.initialized,
			Capabilities:       &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{ListChanged: true}},
		})
	srv.AddReceivingMiddleware(s.middleware)
	return srv
}

// PolicyChanged mirrors the policy's tools in the SDK's registry; the SDK
// sends notifications/tools/list_changed to every session when they
// change. tools/list and tools/call themselves are answered by the
// middleware from the policy as it is at each request.
func (s *server) PolicyChanged(sb *policy.Sandbox) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := map[string]string{}
	var changed []*mcp.Tool
	for _, t := range listTools(sb) {
		b, _ := json.Marshal(t)
		now[t.Name] = string(b)
		if s.shown[t.Name] != string(b) {
			changed = append(changed, t)
		}
	}
	var gone []string
	for name := range s.shown {
		if _, ok := now[name]; !ok {
			gone = append(gone, name)
		}
	}
	s.shown = now
	if len(gone) > 0 {
		s.srv.RemoveTools(gone...)
	}
	for _, t := range changed {
		s.srv.AddTool(t, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return nil, fmt.Errorf("not reached: calls go through the gateway")
		})
	}
}

func (s *server) middleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		switch r := req.(type) {
		case *mcp.ListToolsRequest:
			sb, err := s.m.Sandbox(s.sandbox)
			if err != nil {
				return nil, err
			}
			return &mcp.ListToolsResult{Tools: listTools(sb)}, nil
		case *mcp.CallToolRequest:
			return s.call(ctx, r), nil
		}
		return next(ctx, method, req)
	}
}

// initialized records the client's name and version.
func (s *server) initialized(ctx context.Context, req *mcp.InitializedRequest) {
	p := req.Session.InitializeParams()
	name, version, proto, elicit := "", "", "", false
	if p != nil {
		if p.ClientInfo != nil {
			name, version = p.ClientInfo.Name, p.ClientInfo.Version
		}
		proto = p.ProtocolVersion
		elicit = p.Capabilities != nil && p.Capabilities.Elicitation != nil
	}
	s.m.Record(s.sandbox, audit.ToolDetail{CallID: "-", Tool: "initialize", Stage: "initialize", By: name + " " + version,
		Reason:   fmt.Sprintf("MCP client %q version %q, protocol %s, elicitation %v", name, version, proto, elicit),
		Protocol: "mcp", ProtocolSession: req.Session.ID()},
		"MCP client initialized")
}

var unsafeID = regexp.MustCompile(`[^A-Za-z0-9_.-]`)

// callName is the gateway session and call id of an MCP call: the MCP
// session's id (shortened), and for the call a number unique in this
// agent (a new agent gets new session ids, so new prefixes).
func (s *server) callName(sessionID string) (session, callID string) {
	short := unsafeID.ReplaceAllString(sessionID, "")
	if len(short) > 16 {
		short = short[:16]
	}
	if short == "" {
		short = "stateless"
	}
	session = "mcp-" + short
	return session, fmt.Sprintf("%s-%d", session, s.calls.Add(1))
}

func (s *server) call(ctx context.Context, req *mcp.CallToolRequest) *mcp.CallToolResult {
	var hdr http.Header
	if req.Extra != nil {
		hdr = req.Extra.Header
	}
	ss := req.Session
	session, callID := s.callName(ss.ID())
	who := gateway.Caller{Cred: credFromHeader(hdr.Get(hdrCred)), Protocol: "mcp", Session: ss.ID(), Request: hdr.Get(hdrRequest)}
	if p := ss.InitializeParams(); p != nil && p.Capabilities != nil && p.Capabilities.Elicitation != nil {
		who.Elicit = func(ctx context.Context, pend gateway.Pending) (toolproto.Answer, error) {
			return elicit(ctx, ss, pend)
		}
	}
	args := json.RawMessage(nil)
	name := ""
	if req.Params != nil {
		args, name = req.Params.Arguments, req.Params.Name
	}
	var res *toolproto.CallResult
	var rerr *toolproto.Error
	switch name {
	case toolExchangePut, toolExchangeGet:
		res, rerr = s.m.Exchange(ctx, s.sandbox, who, name == toolExchangePut, callID, session, args)
	default:
		res, rerr = s.m.Call(ctx, s.sandbox, who, toolproto.ToolParams{CallID: callID, Session: session, Tool: name, Arguments: args})
	}
	var out *mcp.CallToolResult
	if rerr != nil {
		sb, _ := s.m.Sandbox(s.sandbox)
		out = refusal(sb, s.sandbox, name, args, rerr)
	} else {
		out = result(name, res)
	}
	// The call's id in the ledger: `watcher replay --call ID` shows it
	// from request to syscall.
	out.Meta = mcp.Meta{MetaCallID: callID, MetaSession: session}
	return out
}

// elicit asks the client's user whether the held call may run.
func elicit(ctx context.Context, ss *mcp.ServerSession, p gateway.Pending) (toolproto.Answer, error) {
	args := p.Arguments
	if len(args) > 2000 {
		args = args[:2000] + "... (" + strconv.Itoa(p.ArgumentsBytes) + " bytes; `watcher approvals --show " + p.ID + "` shows them all)"
	}
	res, err := ss.Elicit(ctx, &mcp.ElicitParams{Mode: "form",
		Message: fmt.Sprintf("watcher: the sandbox %s asks to run %s (rule %s: %s) with arguments %s (sha256 %s). Approve?",
			p.Sandbox, p.Tool, p.Rule, p.Why, args, p.ArgumentsSHA256),
		RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{
			"reason": map[string]any{"type": "string", "description": "why (recorded in the ledger)"}}}})
	if err != nil {
		return toolproto.Answer{}, err
	}
	by := "mcp client user (elicitation"
	if ip := ss.InitializeParams(); ip != nil && ip.ClientInfo != nil {
		by += ", " + ip.ClientInfo.Name
	}
	by += ")"
	reason, _ := res.Content["reason"].(string)
	switch res.Action {
	case "accept":
		return toolproto.Answer{Approved: true, By: by, Reason: reason}, nil
	case "decline":
		return toolproto.Answer{By: by, Reason: orText(reason, "declined")}, nil
	default:
		return toolproto.Answer{By: by, Reason: orText(reason, "cancelled: "+res.Action)}, nil
	}
}

func orText(s, alt string) string {
	if strings.TrimSpace(s) == "" {
		return alt
	}
	return s
}

func credFromHeader(v string) *unix.Ucred {
	var pid, uid, gid int64
	if n, _ := fmt.Sscanf(v, "%d:%d:%d", &pid, &uid, &gid); n != 3 {
		return nil
	}
	return &unix.Ucred{Pid: int32(pid), Uid: uint32(uid), Gid: uint32(gid)}
}
