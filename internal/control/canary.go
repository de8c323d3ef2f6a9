package control

import "time"

// CanaryReport is one self-test run of a sandbox (internal/canary): what
// each probe tried, what the policy expects and what happened.
type CanaryReport struct {
	Sandbox string    `json:"sandbox"`
	Time    time.Time `json:"time"`
	// Reason says what started the run: start, reload, interval, check.
	Reason  string         `json:"reason"`
	Results []CanaryResult `json:"results"`
	// Failures counts the results that differ from the policy.
	Failures int `json:"failures"`
	// Skipped, when set, says why nothing ran (the sandbox is frozen).
	Skipped string `json:"skipped,omitempty"`
	// Frozen lists the cgroups frozen for on_canary_failure: freeze.
	Frozen []string `json:"frozen,omitempty"`
}

// CanaryResult is one probe of a canary run.
type CanaryResult struct {
	// Check names the operation ("file_read_blocked", "mount", ...).
	Check string `json:"check"`
	// Path is how the probe was placed: runtime (a leaf cgroup, as a
	// container runtime places a process) or exec (through watcher exec's
	// launcher, with its seccomp filter and Landlock ruleset).
	Path string `json:"path"`
	// Target is what the operation was aimed at (a file, an address, a
	// name).
	Target string `json:"target,omitempty"`
	// Expected is what the policy says should happen: denied, killed or
	// allowed.
	Expected string `json:"expected"`
	// Got is what happened: denied (with the errno), killed, allowed, or
	// an error.
	Got string `json:"got"`
	// Layer is the mechanism that acted (from the event), or the one the
	// layer table names when no event arrived.
	Layer string `json:"layer"`
	// Event is yes when the matching event reached the ledger, no when it
	// did not, "-" when none is expected (allowed operations).
	Event string `json:"event"`
	// OK says the result matches the policy.
	OK bool `json:"ok"`
	// Detail says more (the DNS answer, the error).
	Detail string `json:"detail,omitempty"`
}
