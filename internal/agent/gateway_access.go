package agent

import "github.com/watcherhq/watcher/internal/gateway"

// Gateway is the agent's tool gateway, whose approvals `watcher mcp wrap`
// shares (nil before Start served it).
func (a *Agent) Gateway() *gateway.Manager { return a.gateway }
