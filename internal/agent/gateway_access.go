package agent

import (
	"context"
	"errors"

	"github.com/watcherhq/watcher/internal/control"
	"github.com/watcherhq/watcher/internal/gateway"
)

// Gateway is the agent's tool gateway, whose approvals `watcher mcp wrap`
// shares (nil before Start served it).
func (a *Agent) Gateway() *gateway.Manager { return a.gateway }

// Hold holds a tool call of `watcher mcp wrap` for the agent's approvers
// (control.Holder): the same wait as the gateway's own ask rules.
func (a *Agent) Hold(ctx context.Context, req control.HoldRequest) (control.HoldAnswer, error) {
	if a.gateway == nil {
		return control.HoldAnswer{}, errors.New("the agent's tool gateway is not running: no approvals")
	}
	ans := a.gateway.Hold(ctx, gateway.Pending{Sandbox: req.Sandbox, Session: req.Session, CallID: req.CallID, Tool: req.Tool,
		Arguments: req.Arguments, ArgumentsBytes: len(req.Arguments), ArgumentsSHA256: req.ArgumentsSHA256,
		Rule: req.Rule, Why: req.Why, Peer: req.Peer}, req.Timeout)
	return control.HoldAnswer{Approved: ans.Approved, TimedOut: ans.TimedOut, By: ans.By, Reason: ans.Reason}, nil
}
