package audit

// CanaryDetail is one canary run of a sandbox (internal/canary): every
// probe's outcome, so what counts the runs (the metrics sink) needs
// nothing but the event.
type CanaryDetail struct {
	// Reason says what started the run: start, reload, interval, check.
	Reason string `json:"reason"`
	// Checks are the run's probes, in the order they ran.
	Checks []CanaryCheck `json:"checks"`
}

// CanaryCheck is the outcome of one probe.
type CanaryCheck struct {
	// Name is PATH/CHECK: how the probe was placed (runtime, exec) and
	// the operation ("runtime/mount").
	Name string `json:"name"`
	// OK is true when what happened is what the policy says.
	OK bool `json:"ok"`
}

// Failed counts the checks whose outcome differed from the policy.
func (d *CanaryDetail) Failed() int {
	n := 0
	for _, c := range d.Checks {
		if !c.OK {
			n++
		}
	}
	return n
}
