package gateway

import (
	"context"
	"time"

	"github.com/watcherhq/watcher/pkg/toolproto"
)

// Hold waits for a human to approve or deny p (`watcher approve`, through
// this manager's approvals socket), the timeout (denied) or the end of
// ctx: the gateway's own wait, for callers outside it (`watcher mcp wrap`
// holding a wrapped server's tool call). p.ID and the times are set here.
func (m *Manager) Hold(ctx context.Context, p Pending, timeout time.Duration) toolproto.Answer {
	return m.approvals.wait(ctx, p, timeout, nil) // no client-side answer (elicitation)
}
