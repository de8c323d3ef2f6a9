package agent

import (
	"fmt"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/ledger"
	"github.com/watcherhq/watcher/internal/policy"
)

// Record appends an event from a command on the control socket
// (control.Recorder) to the ledger and the live tail. Only the kinds
// commands produce are accepted: a client must not pass off kernel events.
func (a *Agent) Record(e audit.Event) error {
	switch e.Kind {
	case audit.KindWorkspace, audit.KindLimit:
	case audit.KindTool:
		// `watcher mcp wrap`'s relay: its records say they are its own,
		// never the gateway's.
		if e.Mechanism != MechanismMCPWrap || e.Tool == nil {
			return fmt.Errorf("record: tool events from commands are watcher mcp wrap's (mechanism %q, with tool details)", MechanismMCPWrap)
		}
	default:
		return fmt.Errorf("record: kind %q is not recorded from commands (want workspace, limit or an mcp-wrap tool event)", e.Kind)
	}
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	if e.Kind == audit.KindLimit {
		countLimitHit(&e)
	}
	a.emit(e)
	return nil
}

// MechanismMCPWrap marks the tool events of `watcher mcp wrap`.
const MechanismMCPWrap = "mcp-wrap"

// LedgerOptions are the ledger options the agent opens the policy's ledger
// with, for commands that write to it when no agent runs.
func LedgerOptions(p *policy.Policy) ledger.Options { return ledgerOptions(p) }
