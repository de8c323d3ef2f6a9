package agent

import "syscall"

// SignalledBySandbox reports whether a sandboxed process sent sig to the
// agent since the previous call, by any route (kill, process groups,
// kill(-1), SIGIO of a file owner): the kill backstop counts them in the
// kernel before delivery. The agent's caller ignores such a termination
// request instead of stopping (the sender is killed). False when the
// backstop is not loaded. The first call for a signal only sets the
// baseline (counts are pinned and outlive an agent).
func (a *Agent) SignalledBySandbox(sig syscall.Signal) bool {
	if a.backstop == nil {
		return false
	}
	n, err := a.backstop.AgentSignals(sig)
	if err != nil {
		return false
	}
	prev, seen := a.sigSeen.Swap(sig, n)
	return seen && n > prev.(uint64)
}

// watchSignals sets the baseline of SignalledBySandbox at start.
func (a *Agent) watchSignals() {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP} {
		a.SignalledBySandbox(sig)
	}
}
