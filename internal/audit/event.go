// Package audit defines watcher's single event model (and its redaction
// and burst folding); internal/pipeline carries events to their sinks.
//
// Every producer (kernel programs, the DNS proxy, the agent itself) builds an
// Event; every consumer takes an Event. Kind-specific details live in typed,
// optional sub-structs so JSON output stays compact and self-describing.
package audit

import "time"

// Kind says what sort of operation or record an event describes.
type Kind string

// Kinds of events. Kernel kinds mirror the hook groups in bpf/.
const (
	KindFileOpen      Kind = "file_open"
	KindPtrace        Kind = "ptrace"
	KindMount         Kind = "mount"
	KindModule        Kind = "module"
	KindBPF           Kind = "bpf"
	KindCapability    Kind = "capability"
	KindSignal        Kind = "signal"
	KindExec          Kind = "exec"
	KindExit          Kind = "exit"
	KindSyscall       Kind = "syscall"
	KindDevice        Kind = "device"
	KindSysctl        Kind = "sysctl"
	KindSocket        Kind = "socket"
	KindNet           Kind = "net"
	KindDNS           Kind = "dns"
	KindEscape        Kind = "escape"
	KindAgent         Kind = "agent"
	KindLoss          Kind = "loss"
	KindSampleSummary Kind = "sample_summary"
	KindRecovery      Kind = "recovery"
	// KindTool is one step of a tool call through the gateway (request,
	// decision, approval, result); see ToolDetail.
	KindTool Kind = "tool"
	// KindFileOp: a change to a file without opening it for write
	// (truncate, create, link, rename, unlink, chmod, chown, xattr).
	KindFileOp Kind = "file_op"
	// KindOperation: an operation judged as a whole (perf_event_open,
	// clone into another cgroup, user namespaces, keys).
	KindOperation Kind = "operation"
)

// Kinds recorded by commands and the resource monitor.
const (
	// KindWorkspace records a commit, rollback or snapshot of an overlay
	// workspace.
	KindWorkspace Kind = "workspace"
	// KindLimit records a resource limit hit: an OOM kill, forks refused
	// at the pids limit.
	KindLimit Kind = "limit"
	// KindCanary records a self-test run of a sandbox and each check that
	// failed (internal/canary).
	KindCanary Kind = "canary"
)

// Kinds lists every event kind, for validating names (export filters).
func Kinds() []Kind {
	return []Kind{KindFileOpen, KindPtrace, KindMount, KindModule, KindBPF, KindCapability, KindSignal,
		KindExec, KindExit, KindSyscall, KindDevice, KindSysctl, KindSocket, KindNet, KindDNS, KindEscape,
		KindAgent, KindLoss, KindSampleSummary, KindRecovery, KindTool, KindFileOp, KindOperation,
		KindWorkspace, KindLimit, KindCanary, KindPosture}
}

// LabelCanary is the sandbox label that marks the events of the canary's
// probes (its value names the check): they prove the cage works, are never
// an attack, and never count toward the escape score.
const LabelCanary = "canary"

// Verdict is what watcher did about the operation.
type Verdict string

// Verdicts, weakest first.
const (
	// VerdictAllowed: the operation happened and no rule asked to record it
	// specifically (routine telemetry, allowed DNS answers).
	VerdictAllowed Verdict = "allowed"
	// VerdictRecorded: a rule in record mode matched; the operation happened.
	VerdictRecorded Verdict = "recorded"
	// VerdictDenied: the kernel (or the proxy) refused the operation before
	// it happened.
	VerdictDenied Verdict = "denied"
	// VerdictKilled: the process was killed; the operation may already have
	// happened (kill backstop where no blocking hook exists).
	VerdictKilled Verdict = "killed"
)

// Severity decides sampling: alerts are never sampled out.
type Severity string

// Severities.
const (
	SeverityRoutine Severity = "routine"
	SeverityAlert   Severity = "alert"
)

// Sandbox identifies the sandbox cgroup an event came from.
type Sandbox struct {
	// CgroupID is the cgroup v2 id (inode number) of the sandbox root.
	CgroupID uint64 `json:"cgroup_id,omitempty"`
	// Name is the sandbox's name from the policy.
	Name string `json:"name,omitempty"`
	// Labels are caller-supplied labels (e.g. a tool-call id for watcher exec).
	Labels map[string]string `json:"labels,omitempty"`
	// ID is the kernel's sandbox id (0: none), as decoded; the pipeline's
	// enrich stage names it (Name). Not recorded: ids mean something only
	// to the agent that planned them.
	ID uint32 `json:"-"`
}

// Process identifies the task that performed the operation.
type Process struct {
	PID  uint32   `json:"pid,omitempty"`  // thread id
	TGID uint32   `json:"tgid,omitempty"` // process id
	PPID uint32   `json:"ppid,omitempty"`
	UID  uint32   `json:"uid"`
	Comm string   `json:"comm,omitempty"`
	Exe  string   `json:"exe,omitempty"`
	Args []string `json:"args,omitempty"`
	// CgroupID is the task's own cgroup (may be below the sandbox root).
	CgroupID uint64 `json:"cgroup_id,omitempty"`
}

// Event is one thing watcher saw or did.
type Event struct {
	Time     time.Time `json:"time"`
	Kind     Kind      `json:"kind"`
	Verdict  Verdict   `json:"verdict"`
	Severity Severity  `json:"severity"`
	// Rule names the policy rule that matched, empty when none did.
	Rule string `json:"rule,omitempty"`
	// RuleID is the kernel's rule id (0: none), as decoded; until the
	// pipeline's enrich stage names it, Rule is "rule-<id>". Not recorded.
	RuleID uint32 `json:"-"`
	// Mechanism names the layer that produced the verdict: lsm, cgroup_bpf,
	// seccomp, landlock, kill, tracepoint, dnsproxy, agent.
	Mechanism string  `json:"mechanism,omitempty"`
	Sandbox   Sandbox `json:"sandbox,omitzero"`
	Process   Process `json:"process,omitzero"`

	// Kind-specific details; at most a few are set.
	File    *FileDetail    `json:"file,omitempty"`
	Target  *TargetDetail  `json:"target,omitempty"`
	Mount   *MountDetail   `json:"mount,omitempty"`
	Syscall *SyscallDetail `json:"syscall,omitempty"`
	DNS     *DNSDetail     `json:"dns,omitempty"`
	Net     *NetDetail     `json:"net,omitempty"`
	Loss    *LossDetail    `json:"loss,omitempty"`
	Summary *SampleSummary `json:"summary,omitempty"`

	// Workspace is set on workspace events, Limit on limit events.
	Workspace *WorkspaceDetail `json:"workspace,omitempty"`
	Limit     *LimitDetail     `json:"limit,omitempty"`
	// Repeat, when set, says this record stands for a burst of identical
	// operations (see RepeatDetail); Count() is how many.
	Repeat *RepeatDetail `json:"repeat,omitempty"`
	Tool   *ToolDetail   `json:"tool,omitempty"`
	// Posture is set on posture events (KindPosture).
	Posture *Posture `json:"posture,omitempty"`
	// Canary is set on the record of a whole canary run (KindCanary,
	// label canary=run): the metrics sink counts runs and failures from it.
	Canary *CanaryDetail `json:"canary,omitempty"`
	// Message is free text for agent, recovery and escape events.
	Message string `json:"message,omitempty"`
	// Redacted lists the fields whose values were replaced by "***".
	Redacted []string `json:"redacted,omitempty"`
}

// FileDetail describes a file operation judged on the resolved path.
type FileDetail struct {
	Path  string `json:"path"`
	Flags uint32 `json:"flags,omitempty"` // open flags
	Mode  uint32 `json:"mode,omitempty"`  // inode mode (type bits)
	Dev   uint32 `json:"dev,omitempty"`   // kernel dev_t of the inode (MAJOR<<20|MINOR)
	Write bool   `json:"write,omitempty"`
	// Op is the path operation for KindFileOp (unlink, rename_from...).
	Op string `json:"op,omitempty"`
}

// TargetDetail describes the other party of ptrace, signals and capabilities.
type TargetDetail struct {
	PID        uint32 `json:"pid,omitempty"`
	Comm       string `json:"comm,omitempty"`
	Mode       uint32 `json:"mode,omitempty"`       // ptrace mode or signal number
	Capability int32  `json:"capability,omitempty"` // for KindCapability
}

// MountDetail describes mount-family operations.
type MountDetail struct {
	Op     string `json:"op"` // mount, umount, move_mount, pivot_root, fsopen, fsmount, chroot
	Source string `json:"source,omitempty"`
	Target string `json:"target,omitempty"`
	FSType string `json:"fstype,omitempty"`
	Flags  uint64 `json:"flags,omitempty"`
}

// SyscallDetail describes a raw syscall record.
type SyscallDetail struct {
	Nr    int64  `json:"nr"`
	Name  string `json:"name,omitempty"`
	Ret   int64  `json:"ret,omitempty"`
	Count uint64 `json:"count,omitempty"` // for sampled streams: events this one stands for
}

// DNSDetail describes a DNS decision.
type DNSDetail struct {
	Name    string   `json:"name"`
	QType   string   `json:"qtype,omitempty"`
	Rcode   string   `json:"rcode,omitempty"`
	Reason  string   `json:"reason,omitempty"` // why it was blocked
	Answers []string `json:"answers,omitempty"`
	Client  string   `json:"client,omitempty"`
}

// NetDetail describes a connection, datagram or socket creation.
type NetDetail struct {
	Op       string `json:"op"` // connect, sendmsg, sock_create
	Family   uint16 `json:"family,omitempty"`
	Type     uint16 `json:"type,omitempty"`
	Protocol uint16 `json:"protocol,omitempty"`
	Addr     string `json:"addr,omitempty"`
	Port     uint16 `json:"port,omitempty"`
	Reason   string `json:"reason,omitempty"`
	// Name is the name the connection carried (TLS SNI, HTTP Host),
	// escaped, where name binding judged it.
	Name string `json:"name,omitempty"`
}

// LossDetail reports events the agent knows it did not record.
type LossDetail struct {
	// Stage names where events were lost: ringbuf_alert, ringbuf_routine,
	// queue, sink:<name>, ledger_write.
	Stage string `json:"stage"`
	Count uint64 `json:"count"`
}

// WorkspaceDetail describes an operation on an overlay workspace.
type WorkspaceDetail struct {
	// Op is commit, rollback, snapshot or prepare.
	Op string `json:"op"`
	// Snapshot names the snapshot taken or rolled back to.
	Snapshot string `json:"snapshot,omitempty"`
	// Added, Changed and Deleted are the paths the operation applied or
	// threw away.
	Added   []string `json:"added,omitempty"`
	Changed []string `json:"changed,omitempty"`
	Deleted []string `json:"deleted,omitempty"`
	// Bytes is the size of the upper layers involved.
	Bytes uint64 `json:"bytes,omitempty"`
	// Hash is the SHA-256 tree hash of the result.
	Hash string `json:"hash,omitempty"`
	// IPC lists the System V IPC objects and /dev/shm files the sandbox
	// had created that a rollback removed.
	IPC []string `json:"ipc,omitempty"`
}

// LimitDetail describes a resource limit that was hit.
type LimitDetail struct {
	// Resource is memory, pids or cpu.
	Resource string `json:"resource"`
	// Limit and Usage are in bytes (memory), tasks (pids) or
	// microseconds of throttling (cpu).
	Limit uint64 `json:"limit,omitempty"`
	Usage uint64 `json:"usage,omitempty"`
	// Count is how many times it was hit (OOM kills, refused forks) since
	// the previous event.
	Count uint64 `json:"count,omitempty"`
	// Mechanism is the cgroup interface that enforced it: cgroup2 or
	// cgroup1.
	Mechanism string `json:"mechanism,omitempty"`
}

// ToolDetail is one step of a tool call through the gateway. Every step of
// a call, and every kernel event of the command a shell call runs (as its
// sandbox label "label"), carries the call's id.
type ToolDetail struct {
	// CallID is the caller's id of the call.
	CallID string `json:"call_id"`
	// Session groups the calls of one agent run (for replay and resume).
	Session string `json:"session,omitempty"`
	// Seq numbers the calls of a session from 1, in request order.
	Seq uint64 `json:"seq,omitempty"`
	// Tool is the tool or method called (read_file, shell, exchange.put).
	Tool string `json:"tool"`
	// Stage is request, decision, approval or result.
	Stage string `json:"stage"`
	// Decision is allow, deny or ask (decision), approved, denied or
	// timeout (approval), ok or error (result).
	Decision string `json:"decision,omitempty"`
	// By is who decided: "policy", or the approver (uid and name).
	By string `json:"by,omitempty"`
	// Reason says why (the approver's reason, the refusal, the error).
	Reason string `json:"reason,omitempty"`
	// Arguments are the call's arguments as JSON (request records): the
	// exact bytes the tool decodes, cut only past 256 KiB (Reason then
	// says so; SHA256 is of them all).
	Arguments string `json:"arguments,omitempty"`
	// Result summarises the outcome (exit code, sizes, refusals).
	Result string `json:"result,omitempty"`
	// SHA256 is the hash of the content written or read, hex; in a
	// request record, of the exact argument bytes.
	SHA256 string `json:"sha256,omitempty"`
	// Protocol is "mcp" for a call that came over the Model Context
	// Protocol (empty: the gateway's own); ProtocolSession is then the MCP
	// session id and ProtocolRequest the JSON-RPC id of the tools/call.
	Protocol        string `json:"protocol,omitempty"`
	ProtocolSession string `json:"protocol_session,omitempty"`
	ProtocolRequest string `json:"protocol_request,omitempty"`
}

// SampleSummary says how many routine events were seen and kept per sandbox
// and kind since the previous summary.
type SampleSummary struct {
	Rows []SampleRow `json:"rows"`
}

// SampleRow is one sandbox and kind of a SampleSummary.
type SampleRow struct {
	Sandbox string `json:"sandbox"`
	Kind    Kind   `json:"kind"`
	Seen    uint64 `json:"seen"`
	Kept    uint64 `json:"kept"`
}

// IsAlert reports whether the event must never be sampled out. Denials and
// kills are alerts regardless of the severity the producer set.
func (e *Event) IsAlert() bool {
	return e.Severity == SeverityAlert || e.Verdict == VerdictDenied || e.Verdict == VerdictKilled ||
		e.Kind == KindLoss || e.Kind == KindRecovery || e.Kind == KindEscape ||
		e.Kind == KindPosture || // rare, and a change of hardening must never be sampled out
		// A record-mode sandbox's would-refuse DNS record stands for a
		// refusal, and refusals are never sampled out.
		e.Kind == KindDNS && e.Verdict == VerdictRecorded
}
