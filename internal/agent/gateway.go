package agent

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/gateway"
	"github.com/watcherhq/watcher/internal/mcpserve"
)

// startGateway serves the tool-call gateway of every sandbox whose policy
// enables it (SOCKET_DIR/sandboxes/NAME/tools.sock) and the approvals
// socket. Its shell calls run through this binary's `watcher exec`.
func (a *Agent) startGateway() error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	dir := a.pol.Agent.SocketDir
	var gw *gateway.Manager
	gw, err = gateway.Start(gateway.Config{SocketDir: dir, ExecPath: exe,
		ControlSocket: filepath.Join(dir, "control.sock"), Emit: a.emit,
		// Under the socket directory: root-only, covered by the agent-files
		// rules, kept across agent restarts (not reboots).
		StateDir: filepath.Join(dir, "gateway-state"),
		// The sockets also serve MCP (Streamable HTTP): the same calls
		// through the same decision path. gw is set before Apply starts
		// any sandbox's socket.
		HTTP: func(sandbox string) http.Handler { return mcpserve.Handler(gw, sandbox, Version) }})
	if err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	a.gateway = gw
	return gw.Apply(a.Policy())
}

// applyGateway follows a policy reload; an error is recorded, the other
// sandboxes' gateways keep serving.
func (a *Agent) applyGateway() {
	if a.gateway == nil {
		return
	}
	if err := a.gateway.Apply(a.Policy()); err != nil {
		a.emit(audit.Event{Kind: audit.KindAgent, Verdict: audit.VerdictRecorded, Severity: audit.SeverityAlert,
			Message: "tool gateway after reload: " + err.Error()})
	}
}

func (a *Agent) stopGateway() {
	if a.gateway != nil {
		a.gateway.Close()
	}
}
