package agent

import (
	"context"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/ledger"
	"github.com/watcherhq/watcher/internal/policy"
	"github.com/watcherhq/watcher/internal/witness"
)

// finalCosignWait bounds how long Stop waits for the witnesses to cosign
// the last checkpoint; what they miss is submitted at the next start.
const finalCosignWait = 5 * time.Second

// startWitnessing starts submitting the ledger's checkpoints to the
// policy's witnesses (none: nil).
func startWitnessing(pol *policy.Policy, l *ledger.Ledger, notify func(audit.Event)) (*witness.Cosigner, error) {
	ws, err := Witnesses(pol)
	if err != nil || len(ws) == 0 {
		return nil, err
	}
	return witness.Start(l, witness.Options{Witnesses: ws, Notify: notify}), nil
}

// Witnesses returns the policy's witnesses.
func Witnesses(pol *policy.Policy) ([]*witness.Witness, error) {
	var ws []*witness.Witness
	for _, pw := range pol.Agent.Witnesses {
		w, err := witness.New(pw.URL, pw.Key)
		if err != nil {
			return nil, err
		}
		ws = append(ws, w)
	}
	return ws, nil
}

// stopWitnessing signs a checkpoint of everything so far, gives the
// witnesses a moment to cosign it, and stops.
func (a *Agent) stopWitnessing() {
	if a.cosigner == nil {
		return
	}
	if c, err := a.ledger.Checkpoint(); err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), finalCosignWait)
		a.cosigner.Wait(ctx, c.Size, len(a.pol.Agent.Witnesses))
		cancel()
	}
	a.cosigner.Stop()
}

// Cosigner returns the witness submitter, nil without witnesses.
func (a *Agent) Cosigner() *witness.Cosigner { return a.cosigner }

// Checkpoint signs a ledger checkpoint of everything so far (for `watcher
// exec --proof` with a running agent); the witnesses get it as usual.
func (a *Agent) Checkpoint() error {
	_, err := a.ledger.Checkpoint()
	return err
}
