// Package gateway is watcher's tool-call gateway: a JSON-RPC 2.0 server
// (one request per line) on a Unix socket per sandbox through which an AI
// agent asks to run tools. The policy decides each call (allow, deny, or
// ask a human); file tools resolve paths in the kernel beneath the
// workspace; shell runs through `watcher exec` with the call id as label;
// every step (request, decision, approval, result) becomes a ledger event
// carrying the call id, like the kernel events of the command it ran.
//
// Methods on SOCKET_DIR/sandboxes/NAME/tools.sock:
//
//	tool.list                                     the tools this sandbox may call
//	tool.request   {call_id, tool, arguments, session}
//	session.resume {session, after_seq}           the calls after a point
//	exchange.put   {name, content, call_id, session}
//	exchange.get   {name, call_id, session}
//
// Methods on SOCKET_DIR/gateway.sock (root only): approvals.list,
// approvals.decide {id, approve, reason, by, arguments_sha256}.
//
// A call's arguments are checked before the policy is consulted: JSON that
// two decoders could read differently (a key twice, invalid UTF-8, ...) is
// refused (TypeAmbiguousArguments). What the request record holds, what an
// approver is shown and what the tool decodes are the same bytes; a call
// held for approval with more than MaxApprovalArgumentBytes is refused
// (TypeTooLargeForApproval), never shown cut.
package gateway

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/policy"
)

// Config configures the gateways of an agent.
type Config struct {
	// SocketDir is the agent's socket directory: sandbox sockets go to
	// SocketDir/sandboxes/NAME/tools.sock, the approvals socket to
	// SocketDir/gateway.sock.
	SocketDir string
	// ExecPath is the watcher binary that runs shell calls (`watcher exec`).
	ExecPath string
	// ControlSocket is the agent's control socket, passed to watcher exec.
	ControlSocket string
	// StateDir keeps each session's calls (STATE_DIR/SANDBOX/SESSION.jsonl)
	// so call numbers and session.resume survive an agent restart; empty
	// keeps them in memory only.
	StateDir string
	// Emit records an event (the agent's fan-out to ledger and tail).
	Emit func(audit.Event)
	// HTTP, when set, serves the HTTP requests that come on a sandbox's
	// socket (MCP's Streamable HTTP, internal/mcpserve); the socket tells
	// them from the gateway's own protocol by their first byte.
	HTTP HTTPHandler
}

// Manager runs one gateway per sandbox whose policy enables it, and the
// approvals socket.
type Manager struct {
	cfg       Config
	mu        sync.Mutex
	gateways  map[string]*sandboxGateway
	approvals *approvals
	admin     net.Listener
	wg        sync.WaitGroup
	closed    bool
}

// Start serves the approvals socket; Apply then starts the sandboxes'.
func Start(cfg Config) (*Manager, error) {
	if cfg.Emit == nil {
		cfg.Emit = func(audit.Event) {}
	}
	m := &Manager{cfg: cfg, gateways: map[string]*sandboxGateway{}}
	m.approvals = newApprovals()
	ln, err := listenUnix(filepath.Join(cfg.SocketDir, "gateway.sock"), 0o600, 0, 0)
	if err != nil {
		return nil, err
	}
	m.admin = ln
	m.wg.Add(1)
	go func() { defer m.wg.Done(); m.serveAdmin(ln) }()
	return m, nil
}

// Apply starts, updates and stops sandbox gateways to match pol. Calls in
// progress finish under the policy they started with.
func (m *Manager) Apply(pol *policy.Policy) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return errors.New("gateway closed")
	}
	want := map[string]bool{}
	var errs []error
	for i := range pol.Sandboxes {
		sb := pol.Sandboxes[i]
		if !sb.Tools.Enabled {
			continue
		}
		want[sb.Name] = true
		if g := m.gateways[sb.Name]; g != nil {
			if g.sameSocket(&sb) {
				g.setPolicy(pol, &sb)
				if n, ok := g.httpHandler().(PolicyFollower); ok {
					n.PolicyChanged(g.sb.Load())
				}
				continue
			}
			g.close()
			delete(m.gateways, sb.Name)
		}
		g, err := m.startSandbox(pol, &sb)
		if err != nil {
			errs = append(errs, fmt.Errorf("gateway for sandbox %s: %w", sb.Name, err))
			continue
		}
		m.gateways[sb.Name] = g
	}
	for name, g := range m.gateways {
		if !want[name] {
			g.close()
			delete(m.gateways, name)
		}
	}
	return errors.Join(errs...)
}

func (m *Manager) stateDir(sandbox string) string {
	if m.cfg.StateDir == "" {
		return ""
	}
	return filepath.Join(m.cfg.StateDir, sandbox)
}

// SocketPath is where the gateway of a sandbox listens.
func SocketPath(socketDir, sandbox string) string {
	return filepath.Join(socketDir, "sandboxes", sandbox, "tools.sock")
}

// Close stops every gateway; pending approvals are denied.
func (m *Manager) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	for name, g := range m.gateways {
		g.close()
		delete(m.gateways, name)
	}
	m.mu.Unlock()
	m.approvals.closeAll()
	err := m.admin.Close()
	os.Remove(filepath.Join(m.cfg.SocketDir, "gateway.sock"))
	m.wg.Wait()
	return err
}

// listenUnix listens on path with the given mode and owner; its directory
// gets the same owner and the execute bits matching the mode.
func listenUnix(path string, mode uint32, uid, gid int) (net.Listener, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("socket dir: %w", err)
	}
	os.Remove(path)
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(true)
	if err := os.Chmod(path, os.FileMode(mode)); err != nil {
		ln.Close()
		return nil, fmt.Errorf("chmod %s: %w", path, err)
	}
	if err := os.Chown(path, uid, gid); err != nil {
		ln.Close()
		return nil, fmt.Errorf("chown %s: %w", path, err)
	}
	return ln, nil
}

// callID and session names: they become cgroup names and labels.
var idPattern = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$`)

// now is the clock (one place, for records).
func now() time.Time { return time.Now() }
