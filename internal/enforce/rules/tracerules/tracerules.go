// Package tracerules is what the recording tracepoints
// (internal/enforce/recorder) are told to record. No BPF here, so the
// planner can build it.
package tracerules

// Mechanisms of the recorded refusals.
const (
	MechanismSeccomp  = "seccomp"
	MechanismLandlock = "landlock"
)

// Config selects what is recorded.
type Config struct {
	// SampleEvery turns on the syscall stream: 1 in SampleEvery syscalls of
	// each sandbox (per CPU) is sent as an event; totals are counted exactly
	// (Counts). 0 disables it, 1 sends every syscall.
	SampleEvery uint32
	// ModuleAlerts records init_module, finit_module, kexec_load and
	// kexec_file_load attempts as alerts.
	ModuleAlerts bool
	// ModuleRuleID is the policy rule id reported with module alerts.
	ModuleRuleID uint32
	// RecordDenials records, for sandboxed tasks running under a seccomp
	// filter with no_new_privs (what `watcher exec` applies), the watched
	// syscalls that returned EPERM without reaching sys_enter (refused by
	// seccomp), every i386 syscall refused that way (the launcher's arch
	// guard), and opens and execs refused with EACCES (Landlock) or
	// EPERM, as DENIED alerts. Needs recorder.AttachOptions.Denials.
	RecordDenials bool
	// SeccompSyscalls are the syscalls watched for seccomp refusals; nil
	// means recorder.DefaultSeccompSyscalls.
	SeccompSyscalls []string
}
