package agent

import (
	"os"
	"syscall"
)

// SignalledBySandbox reports whether sig, just received, must be
// ignored: it did not come the way the agent's operator sends it. The
// kill backstop counts, in the kernel before delivery, the signals to the
// agent sent by user processes outside every sandbox or by the kernel
// itself (a terminal's ^C); a sandboxed sender by any route (kill, process
// groups, kill(-1), a file owner's SIGIO from whatever context) never
// moves that count, so its request is ignored (and the sender killed).
// Comparing the operator's count rather than the sandbox's keeps two
// sandbox signals, one delivered after the other was counted, from looking
// like the operator's. False when the backstop is not loaded; the first
// call for a signal only sets the baseline (counts are pinned and outlive
// an agent).
func (a *Agent) SignalledBySandbox(sig syscall.Signal) bool {
	if a.backstop.Backstop == nil || !a.sigCounted.Load() {
		return false
	}
	n, err := a.backstop.OperatorSignals(sig)
	if err != nil {
		return false
	}
	prev, seen := a.sigSeen.Swap(sig, n)
	return seen && n == prev.(uint64)
}

// watchSignals sets the baseline of SignalledBySandbox at start.
//
// It first checks that the kernel counts the operator's signals: the agent
// sends itself a SIGWINCH (ignored) and the count must move. Where it does
// not (the signal tracepoint is not attached), SignalledBySandbox stays
// false and every termination request stops the agent, as without a
// backstop, rather than none.
func (a *Agent) watchSignals() {
	before, err := a.backstop.OperatorSignals(syscall.SIGWINCH)
	if err == nil && syscall.Kill(os.Getpid(), syscall.SIGWINCH) == nil {
		after, err := a.backstop.OperatorSignals(syscall.SIGWINCH)
		a.sigCounted.Store(err == nil && after > before)
	}
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP} {
		a.SignalledBySandbox(sig)
	}
}
