// Package policy defines watcher's policy file: agent settings and the
// sandboxes it cages, each with its enforcement rules, DNS and egress
// policy, audit depth, timeouts and escape watch.
//
// A policy is YAML decoded strictly: unknown fields and bad values are
// errors naming the file, line and field. Sandboxes usually start from one of
// four presets (read-only, restricted, dev, ops; see presets/*.yaml), all
// built on the baseline that blocks the dangerous operations (a sandbox
// without a preset gets the baseline), and override fields: scalars and nested settings given in the sandbox replace
// the preset's, rule lists (files, exec rules, capability rules, DNS
// allow/deny, high-cardinality domains, egress allow and loopback) extend
// the preset's, and for file rules a later rule on the same path wins.
//
//	version: 1
//	agent:
//	  ledger_dir: /var/lib/watcher/ledger
//	sandboxes:
//	  - name: agents
//	    select:
//	      globs: ["/kubepods.slice/**/cri-containerd-*.scope"]
//	    preset: restricted
//	    workspace: [/srv/agent]
//	    dns:
//	      allow: ["pypi.org", "*.pypi.org"]
package policy

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Version is the policy file format this package reads.
const Version = 1

// Policy is a whole policy file.
type Policy struct {
	// Version of the policy format; must be 1.
	Version int `yaml:"version"`
	// Agent holds settings of the watcher agent itself.
	Agent Agent `yaml:"agent"`
	// Sandboxes lists the cgroups watcher cages and how. A cgroup selected
	// by several sandboxes belongs to the first.
	Sandboxes []Sandbox `yaml:"sandboxes"`

	// Source is the file the policy was read from ("" when built in code or
	// the built-in default). Not part of the YAML.
	Source string `yaml:"-"`
	// Hash is the SHA-256 of the bytes the policy was read from, hex.
	Hash string `yaml:"-"`
}

// Agent configures the agent process.
type Agent struct {
	// LedgerDir is where the hash-chained ledger is written.
	LedgerDir string `yaml:"ledger_dir"`
	// SocketDir holds the live-event socket (root-only, 0600).
	SocketDir string `yaml:"socket_dir"`
	// PinDir is the bpffs directory where programs, links and maps are
	// pinned so enforcement outlives agent restarts.
	PinDir string `yaml:"pin_dir"`
	// MetricsAddr is the host:port of the Prometheus endpoint. Loopback by
	// default; "" disables the endpoint.
	MetricsAddr string `yaml:"metrics_addr"`
	// ExecCgroup is the cgroup (relative to the cgroup2 root) under which
	// `watcher exec` creates one leaf per command.
	ExecCgroup string `yaml:"exec_cgroup"`
	// RequireLSM refuses to start when a blocking rule has no BPF LSM
	// program to enforce it, instead of falling back to weaker layers.
	RequireLSM bool `yaml:"require_lsm"`
	// Sampling sets the default sampling of routine events.
	Sampling Sampling `yaml:"sampling"`
	// DNS configures the DNS proxy shared by all sandboxes.
	DNS AgentDNS `yaml:"dns"`
	// Witnesses are C2SP tlog-witness services (litewitness, for one) the
	// agent submits every new ledger checkpoint to. Their cosignatures,
	// stored with the checkpoint, let `watcher verify --witness KEY`
	// reject a history the host rewrote and re-signed. Empty: none.
	Witnesses []Witness `yaml:"witnesses"`
	// Export sends the ledger's records, as OpenTelemetry log records, to
	// OTLP endpoints (an OpenTelemetry Collector); see docs/operations/otlp.md.
	// Read at agent start (a reload does not change it). Empty: none.
	Export []Export `yaml:"export,omitempty"`
	// DockerSocket is dockerd's API socket, read for sandboxes that select
	// containers by labels. Default /var/run/docker.sock.
	DockerSocket string `yaml:"docker_socket,omitempty"`
	// ContainerdSocket is containerd's API socket, read likewise (the
	// CRI's containers: kubelet's labels and the pod's labels). Default
	// /run/containerd/containerd.sock.
	ContainerdSocket string `yaml:"containerd_socket,omitempty"`
}

// Export is one OTLP destination for the ledger's records.
type Export struct {
	// Name identifies the exporter in loss records and metrics.
	Name string `yaml:"name"`
	// Protocol is grpc (default) or http (OTLP/HTTP, protobuf).
	Protocol string `yaml:"protocol"`
	// Endpoint is host:port for grpc, a URL for http (/v1/logs is added
	// when it has no path).
	Endpoint string `yaml:"endpoint"`
	// Insecure sends gRPC in plaintext (for http the URL's scheme says).
	Insecure bool `yaml:"insecure"`
	// TLS configures the client side of TLS; empty uses the system roots.
	TLS ExportTLS `yaml:"tls"`
	// Headers are sent with every request (authorization, tenant ids).
	Headers map[string]string `yaml:"headers"`
	// Filter selects what is sent; what it leaves out is covered by gap
	// records so the central copy can still be proven.
	Filter ExportFilter `yaml:"filter"`
	// BatchRecords is the most records per request (default 512).
	BatchRecords int `yaml:"batch_records"`
	// BatchInterval is how long a partial batch waits (default 1s).
	BatchInterval Duration `yaml:"batch_interval"`
	// BufferRecords bounds what is held while the endpoint is away
	// (default 65536); beyond it records are dropped and the drop is a
	// ledger loss record.
	BufferRecords int `yaml:"buffer_records"`
	// RateLimit is records per second per sandbox (0: none); RateBurst is
	// how many may go at once (default twice the rate).
	RateLimit float64 `yaml:"rate_limit"`
	RateBurst int     `yaml:"rate_burst"`
	// MetricsInterval sends the agent's metrics (those on /metrics) as
	// OTLP metrics this often, cumulative; 0 (default) sends none.
	MetricsInterval Duration `yaml:"metrics_interval"`
}

// ExportTLS names the files of an exporter's TLS client.
type ExportTLS struct {
	CAFile     string `yaml:"ca_file"`
	CertFile   string `yaml:"cert_file"`
	KeyFile    string `yaml:"key_file"`
	ServerName string `yaml:"server_name"`
}

// ExportFilter selects records; empty lists match everything. Loss
// records always pass.
type ExportFilter struct {
	Sandboxes []string `yaml:"sandboxes"`
	Kinds     []string `yaml:"kinds"`
	Verdicts  []string `yaml:"verdicts"`
	// MinSeverity is routine (default: everything) or alert.
	MinSeverity string `yaml:"min_severity"`
}

// Witness is one tlog-witness the ledger's checkpoints are submitted to.
// It must know the ledger's origin (watcher-ledger/<id>, printed by
// `watcher ledger checkpoint`) and key (`watcher ledger pubkey`).
type Witness struct {
	// URL is the witness's base URL (http or https); checkpoints are
	// POSTed to URL/add-checkpoint.
	URL string `yaml:"url"`
	// Key is the witness's verifier key, a C2SP signed-note vkey of type
	// cosignature/v1 (name+hash+base64), as the witness prints it.
	Key string `yaml:"key"`
}

// Sampling decides how many routine (non-alert) events travel to the
// ledger. Alerts (denials, kills, losses) are never sampled.
type Sampling struct {
	// Rate is the fraction of routine events kept, in (0, 1]. Exact counts
	// per sandbox and kind are always kept in summaries.
	Rate float64 `yaml:"rate"`
	// SummaryInterval is how often counts of seen and kept events are
	// written as a sample_summary event.
	SummaryInterval Duration `yaml:"summary_interval"`
}

// AgentDNS configures the DNS proxy.
type AgentDNS struct {
	// Listen is the proxy's host:port; sandbox DNS traffic is redirected to
	// it in the kernel.
	Listen string `yaml:"listen"`
	// Upstreams are the resolvers (host:port) allowed names are forwarded
	// to. Empty means the nameservers in /etc/resolv.conf.
	Upstreams []string `yaml:"upstreams"`
}

// Mode says whether a sandbox's blocking rules block.
type Mode string

// Sandbox modes.
const (
	// ModeEnforce blocks (or kills) what the rules say.
	ModeEnforce Mode = "enforce"
	// ModeRecord lets everything happen and records what enforce mode would
	// have refused, to try a policy before enforcing it.
	ModeRecord Mode = "record"
)

// Action is what to do when a rule matches.
type Action string

// Rule actions, in increasing severity.
const (
	// ActionAllow lets the operation happen without recording it specially.
	ActionAllow Action = "allow"
	// ActionRecord lets it happen and records an event.
	ActionRecord Action = "record"
	// ActionBlock refuses it with EPERM before it happens.
	ActionBlock Action = "block"
	// ActionKill kills the process (used where no hook can refuse, or as a
	// harsher response).
	ActionKill Action = "kill"
)

// Sandbox is one set of cgroups and the policy applied to them.
type Sandbox struct {
	// Name identifies the sandbox in events, metrics and the ledger.
	// Letters, digits, '-', '_' and '.', at most 63 characters.
	Name string `yaml:"name"`
	// Select says which cgroups belong to the sandbox (each with its
	// descendants).
	Select Selector `yaml:"select"`
	// Preset names the preset the sandbox starts from: read-only,
	// restricted, dev or ops. Empty means baseline, which blocks the
	// dangerous operations and restricts nothing else.
	Preset string `yaml:"preset"`
	// Mode is enforce or record.
	Mode Mode `yaml:"mode"`
	// Workspace lists the directories the sandboxed agent works in. File
	// rules whose path is "$workspace" (or starts with "$workspace/") apply
	// to each of them; without a workspace such rules are dropped.
	Workspace []string `yaml:"workspace"`
	// Files are path rules judged on the resolved path of every open.
	Files []FileRule `yaml:"files"`
	// Operations sets the actions for dangerous operations.
	Operations Operations `yaml:"operations"`
	// Exec rules the commands the sandbox may execute and the timeouts of
	// commands run with `watcher exec`.
	Exec Exec `yaml:"exec"`
	// DNS is the sandbox's name policy, enforced by the DNS proxy.
	DNS DNS `yaml:"dns"`
	// Egress rules the connections the sandbox may make.
	Egress Egress `yaml:"egress"`
	// Listen rules the ports the sandbox may accept connections on from
	// other hosts (see Listen).
	Listen Listen `yaml:"listen"`
	// Audit sets how much routine activity is recorded.
	Audit Audit `yaml:"audit"`
	// Escape configures the escape watch.
	Escape Escape `yaml:"escape"`
	// WorkspaceOptions says how commands see the workspace directories
	// (directly, or through an overlay that can be diffed, committed and
	// rolled back).
	WorkspaceOptions WorkspaceOptions `yaml:"workspace_options"`
	// Limits caps the resources of the sandbox's cgroups and of each
	// `watcher exec` leaf.
	Limits Limits `yaml:"limits"`
	// Tools configures the sandbox's tool-call gateway (see tools.go).
	Tools Tools `yaml:"tools"`
	// Require lists the hardening every container or cgroup of the sandbox
	// must have (no_new_privs, cap_drop_all, readonly_root, ...; see
	// require.go); one that lacks an item raises an alert. Empty: none.
	Require []Requirement `yaml:"require"`
	// Canary configures the self-test that proves the sandbox's layers
	// still refuse what the policy forbids (internal/canary).
	Canary Canary `yaml:"canary"`
	// OnCanaryFailure is what a failed self-test does: alert (the
	// default: an alert event, the metric, `watcher status` non-zero) or
	// freeze (the same, and every cgroup of the sandbox is frozen until
	// `watcher thaw`: fail closed).
	OnCanaryFailure CanaryAction `yaml:"on_canary_failure"`
}

// Canary configures a sandbox's self-test: short-lived probe processes in
// fresh leaf cgroups of the sandbox try one forbidden and one allowed
// operation per rule class, and the agent checks the outcome and the
// ledger event.
type Canary struct {
	// Enabled runs the self-test at start, after every policy reload and
	// every Interval. The presets turn it on.
	Enabled bool `yaml:"enabled"`
	// Interval is the time between periodic runs; 0 means
	// DefaultCanaryInterval. A run costs about two dozen short processes
	// per sandbox.
	Interval Duration `yaml:"interval"`
}

// DefaultCanaryInterval is the canary's period when the policy sets none.
const DefaultCanaryInterval = 5 * time.Minute

// MinCanaryInterval is the shortest period a policy may ask for.
const MinCanaryInterval = 5 * time.Second

// CanaryAction is what a failed self-test does.
type CanaryAction string

// Canary failure actions.
const (
	// CanaryAlert raises the alert only.
	CanaryAlert CanaryAction = "alert"
	// CanaryFreeze raises the alert and freezes the sandbox.
	CanaryFreeze CanaryAction = "freeze"
)

// WorkspaceMode says how sandboxed commands see the workspace.
type WorkspaceMode string

// Workspace modes.
const (
	// WorkspaceDirect lets commands change the workspace directories
	// themselves (the default).
	WorkspaceDirect WorkspaceMode = "direct"
	// WorkspaceOverlay shows commands each workspace directory through an
	// overlayfs whose upper layer the agent keeps: the real directory is
	// unchanged until `watcher workspace commit`.
	WorkspaceOverlay WorkspaceMode = "overlay"
)

// WorkspaceOptions configures overlay workspaces and their snapshots.
type WorkspaceOptions struct {
	// Mode is direct (default) or overlay.
	Mode WorkspaceMode `yaml:"mode"`
	// StateDir holds each workspace's upper, work and snapshot layers
	// (upper and work must be on one filesystem). Empty means
	// "workspaces" beside the agent's ledger directory.
	StateDir string `yaml:"state_dir"`
	// MaxSnapshots keeps at most this many snapshots per sandbox, pruning
	// the oldest; 0 means no count limit.
	MaxSnapshots int `yaml:"max_snapshots"`
	// MaxSnapshotBytes caps the total size of a sandbox's snapshots,
	// pruning the oldest; 0 means no size limit.
	MaxSnapshotBytes ByteSize `yaml:"max_snapshot_bytes"`
}

// Limits caps a sandbox's resources. Zero values mean no limit.
type Limits struct {
	// CPU is the CPU bandwidth in cores (1.5 = one and a half cores).
	CPU float64 `yaml:"cpu"`
	// Memory is the hard memory limit; above it the kernel OOM-kills a
	// process of the sandbox.
	Memory ByteSize `yaml:"memory"`
	// MemoryHigh is the throttling threshold below Memory: above it the
	// kernel reclaims hard and slows the sandbox (cgroup v2 only; v1 has
	// a soft limit that applies only under host memory pressure).
	MemoryHigh ByteSize `yaml:"memory_high"`
	// PIDs is the most tasks (processes and threads) alive at once; fork
	// and clone fail with EAGAIN above it.
	PIDs int `yaml:"pids"`
	// IO throttles block devices.
	IO []IOLimit `yaml:"io"`
}

// IOLimit throttles one block device. Zero fields mean unlimited.
type IOLimit struct {
	// Device is a block device path ("/dev/vda") or "MAJOR:MINOR".
	Device string `yaml:"device"`
	// ReadBPS is the read bandwidth in bytes per second.
	ReadBPS ByteSize `yaml:"read_bps"`
	// WriteBPS is the write bandwidth in bytes per second.
	WriteBPS ByteSize `yaml:"write_bps"`
	// ReadIOPS is the read operations per second.
	ReadIOPS int `yaml:"read_iops"`
	// WriteIOPS is the write operations per second.
	WriteIOPS int `yaml:"write_iops"`
}

// Selector picks cgroups. A sandbox may combine several kinds; a cgroup
// matching any of them belongs to the sandbox.
type Selector struct {
	// Cgroups are exact cgroup paths relative to the cgroup2 root
	// ("/watcher/exec").
	Cgroups []string `yaml:"cgroups"`
	// Globs are cgroup path patterns ("/kubepods.slice/**/crio-*.scope"):
	// "*" within a component, "**" across components. Cgroups created later
	// that match are picked up without restart.
	Globs []string `yaml:"globs"`
	// Containers are runtime-qualified container ids (docker://ID,
	// containerd://ID, cri-o://ID; 12 to 64 hex digits) or pod://UID.
	Containers []string `yaml:"containers"`
	// Labels select containers by the labels their runtime holds (Docker
	// labels; for a Kubernetes container the ones kubelet sets:
	// io.kubernetes.pod.namespace, io.kubernetes.pod.name,
	// io.kubernetes.container.name). Every key must be present with the
	// value given ("*": any value). Read from dockerd's API
	// (agent.docker_socket) as each container's cgroup appears.
	Labels map[string]string `yaml:"labels,omitempty"`
}

// Match says how a file rule's path is compared with the resolved path.
type Match string

// File rule matching.
const (
	// MatchExact matches the path only.
	MatchExact Match = "exact"
	// MatchPrefix matches the path and everything below it; a path not
	// ending in "/" also matches names that extend it ("/etc/sudoers"
	// covers /etc/sudoers.d/x).
	MatchPrefix Match = "prefix"
)

// Access says which opens a file rule applies to.
type Access string

// File accesses.
const (
	AccessRead  Access = "read"
	AccessWrite Access = "write"
	AccessAny   Access = "any"
)

// FileRule judges opens of a path. Among the rules matching an open, the
// most specific path wins (exact beats prefix, longer beats shorter); on a
// tie the later rule wins, so a sandbox's own rules override its preset's.
type FileRule struct {
	// Path is absolute. A component that is exactly "*" matches any one
	// component ("/proc/*/mem"); "$workspace" stands for each workspace
	// directory.
	Path string `yaml:"path"`
	// Match is exact or prefix.
	Match Match `yaml:"match"`
	// Access is read, write or any (write includes create and truncate).
	Access Access `yaml:"access"`
	// Action is allow, record, block or kill.
	Action Action `yaml:"action"`
	// Name labels the rule in events; defaults to "file:<path>".
	Name string `yaml:"name"`
}

// Operations holds the actions for operations other than file opens.
type Operations struct {
	// Ptrace covers ptrace, process_vm_readv/writev, pidfd_getfd and
	// /proc/PID/mem access to other processes.
	Ptrace Action `yaml:"ptrace"`
	// Mount covers mount, umount, move_mount, pivot_root, fsopen/fsmount and
	// chroot.
	Mount Action `yaml:"mount"`
	// Module covers loading kernel code: init_module, finit_module,
	// kexec_load and firmware loads.
	Module Action `yaml:"module"`
	// BPF covers the bpf() syscall.
	BPF Action `yaml:"bpf"`
	// KillAgent covers signals and ptrace aimed at the agent's processes.
	KillAgent Action `yaml:"kill_agent"`
	// AgentFiles covers opens of the agent's own files (ledger, socket and
	// pin directories, the policy file).
	AgentFiles Action `yaml:"agent_files"`
	// CgroupWrite covers write-opens in the cgroup filesystem, through which
	// a process could move itself out of its sandbox.
	CgroupWrite Action `yaml:"cgroup_write"`
	// IOUring covers io_uring_setup (its operations bypass syscall-based
	// checks in the fallback layers).
	IOUring Action `yaml:"io_uring"`
	// RawSockets covers AF_PACKET and SOCK_RAW sockets.
	RawSockets Action `yaml:"raw_sockets"`
	// Devices covers opening block devices and /dev/mem, /dev/kmem,
	// /dev/port, /dev/kmsg.
	Devices Action `yaml:"devices"`
	// IA32Syscalls covers 32-bit system calls (int 0x80). allow (the
	// default): they are judged by every rule like 64-bit calls, since the
	// LSM and cgroup hooks judge kernel state whatever the entry; where this
	// host's kill backstop enforces some rule by x86_64 syscall number they
	// are killed at entry anyway (the layer table says why). block or kill:
	// every 32-bit syscall is killed at entry, on every host (a sandbox with
	// no use for 32-bit code). watcher exec refuses them whatever this says.
	IA32Syscalls Action `yaml:"ia32_syscalls"`
	// OtherProcesses covers every operation that reaches a process outside
	// the sandbox's own cgroup subtree: signals by any route (the kill
	// family, pidfd, SIGIO/SIGURG owners), prlimit, priority, scheduling,
	// affinity and I/O priority, page migration, ptrace-mode reads of
	// /proc/PID files (environ, maps, fd, ...; cmdline and stat stay
	// readable), kcmp. Processes of the sandbox itself are never affected.
	OtherProcesses Action `yaml:"other_processes"`
	// OtherIPC covers System V IPC objects and POSIX message queues the
	// sandbox did not create (attach, read, write, control).
	OtherIPC Action `yaml:"other_ipc"`
	// Terminals covers injecting input into a terminal (TIOCSTI,
	// TIOCLINUX) on any tty, the sandbox's own included.
	Terminals Action `yaml:"terminals"`
	// NotifyMarks covers fanotify and inotify marks on files outside the
	// sandbox's workspaces (watching what host processes open).
	NotifyMarks Action `yaml:"notify_marks"`
	// Capabilities rules the use of capabilities.
	Capabilities Capabilities `yaml:"capabilities"`
}

// Capabilities rules capability use (the capable hook).
type Capabilities struct {
	// Default applies to capabilities without a rule.
	Default Action `yaml:"default"`
	// Rules set the action per capability.
	Rules []CapabilityRule `yaml:"rules"`
}

// CapabilityRule sets the action for one capability.
type CapabilityRule struct {
	// Cap is the capability name, e.g. CAP_SYS_ADMIN (the CAP_ prefix and
	// case are optional).
	Cap string `yaml:"cap"`
	// Action is allow, record, block or kill.
	Action Action `yaml:"action"`
}

// Exec rules command execution.
type Exec struct {
	// Default applies to executables no rule matches.
	Default Action `yaml:"default"`
	// Rules judge the resolved path of each executed file, like file rules
	// (access is ignored).
	Rules []FileRule `yaml:"rules"`
	// Timeouts are the graded timeouts of `watcher exec`.
	Timeouts Timeouts `yaml:"timeouts"`
	// CircuitBreaker refuses further runs in the sandbox after this many
	// consecutive hard timeouts (kills at Timeouts.Kill); 0 disables it.
	CircuitBreaker int `yaml:"circuit_breaker"`
}

// Timeouts grade how a long-running command is stopped. Zero disables a
// stage; the enabled stages must be increasing.
type Timeouts struct {
	// Warn records a warning event.
	Warn Duration `yaml:"warn"`
	// Term sends SIGTERM to the command.
	Term Duration `yaml:"term"`
	// Kill kills the whole cgroup (cgroup.kill).
	Kill Duration `yaml:"kill"`
}

// DNSDefault is what happens to names on neither list.
type DNSDefault string

// DNS defaults.
const (
	DNSAllow DNSDefault = "allow"
	DNSDeny  DNSDefault = "deny"
)

// DNS is a sandbox's name policy.
type DNS struct {
	// Default applies to names on neither list: allow or deny.
	Default DNSDefault `yaml:"default"`
	// Allow lists names: "example.com" (exactly), "*.example.com" (names
	// below it), ".example.com" (the name and below).
	Allow []string `yaml:"allow"`
	// Deny lists names in the same syntax; deny wins over allow.
	Deny []string `yaml:"deny"`
	// Detection configures the encoded-name and tunnel detection.
	Detection Detection `yaml:"detection"`
}

// Detection configures encoded-name detection in the DNS proxy.
type Detection struct {
	// Enabled turns detection on; it applies to allowed names too.
	Enabled bool `yaml:"enabled"`
	// Action is block (NXDOMAIN) or record.
	Action Action `yaml:"action"`
	// HighCardinality lists registrable domains (CDNs, clouds) that
	// legitimately have many distinct machine-made names: their
	// information budget is 16 times larger.
	HighCardinality []string `yaml:"high_cardinality"`
	// Window is the window of the per-domain stream counters (encoded
	// names, record types, nonexistent names).
	Window Duration `yaml:"window"`
	// InfoBudgetBits is the information budget: the new bits name heads
	// may carry under one registrable domain in 10 minutes before the
	// domain is cut off for the sandbox. 0 means 4800 (600 bytes, so a
	// sustained byte per second is cut within 10 minutes).
	InfoBudgetBits int `yaml:"info_budget_bits"`
	// MaxDistinctNames is accepted for old policies and ignored: the
	// information budget replaced the distinct-name cut.
	MaxDistinctNames int `yaml:"max_distinct_names"`
	// RateLimit is the sandbox's query budget in queries per second; 0
	// means unlimited.
	RateLimit int `yaml:"rate_limit"`
}

// EgressDefault is what happens to connections no rule covers.
type EgressDefault string

// Egress defaults.
const (
	// EgressResolved allows only addresses the DNS proxy answered for an
	// allowed name (for their TTL plus GraceSeconds) and the listed rules.
	EgressResolved EgressDefault = "resolved"
	// EgressDeny allows only the listed rules.
	EgressDeny EgressDefault = "deny"
	// EgressAllow allows every connection (still recorded per Audit).
	EgressAllow EgressDefault = "allow"
)

// Egress rules outgoing connections and datagrams.
type Egress struct {
	// Default is resolved, deny or allow.
	Default EgressDefault `yaml:"default"`
	// GraceSeconds keeps a resolved address allowed this long after its
	// DNS TTL expires (clients cache a little past the TTL).
	GraceSeconds int `yaml:"grace_seconds"`
	// AdmissionTTLCap caps the TTL for which an answer admits its
	// addresses (the grace comes on top): min(TTL, cap). 0 means 5m; at
	// most 24h. The answer's TTL is the answering server's choice.
	AdmissionTTLCap Duration `yaml:"admission_ttl_cap"`
	// NamePorts open more ports at the addresses answered for some names;
	// every answered address is open on TCP 80 and 443 only, and UDP or
	// another port needs an entry here (or an allow rule).
	//
	//	name_ports:
	//	  - {name: github.com, ports: ["22"]}            # git over ssh
	//	  - {name: .stun.example, ports: ["3478"], protocol: udp}
	NamePorts []EgressName `yaml:"name_ports"`
	// Allow lists networks and ports always allowed.
	Allow []EgressRule `yaml:"allow"`
	// Loopback lists local services (on 127.0.0.0/8 and ::1) the sandbox
	// may reach; other loopback ports are refused.
	Loopback []LoopbackService `yaml:"loopback"`
	// Unix lists unix socket paths the sandbox may connect or send to
	// besides those inside its workspace ("/run/app.sock" that socket,
	// "/run/app/" everything below). Unless default is allow, other unix
	// sockets (the D-Bus system bus, systemd-resolved, nscd, docker.sock)
	// and abstract ones are refused, judged on the path as passed.
	Unix []string `yaml:"unix"`
	// Names binds TCP connections to names (docs/concepts/egress-names.md).
	Names EgressNames `yaml:"names"`
}

// EgressNames binds a sandbox's TCP connections to the names the DNS proxy
// answered: with Bind, a connection to an answered address passes only
// when the name it carries (the TLS ClientHello's server name, or the
// Host header of plain HTTP) was answered with that address to the
// sandbox, or is on its DNS allow list. Another name on a shared front end
// (domain fronting), TLS without a name, and anything that carries no
// name are refused and recorded. Only with egress default resolved.
//
//	names:
//	  bind: true
//	  read_only: [".docs.example.com"]  # GET, HEAD, OPTIONS only (plain HTTP)
//	  inspect: [".cdn.example.net"]     # TLS terminated: every request's Host judged
//	  ech: ["cloudflare-ech.com"]       # outer names Encrypted Client Hello may use
//	  unnamed_ports: ["22"]             # SSH: passes without a name
//	  quic: false                       # UDP 443 to answered addresses refused
type EgressNames struct {
	// Bind turns name binding on.
	Bind bool `yaml:"bind"`
	// ReadOnly lists names (DNS syntax) limited to GET, HEAD and OPTIONS
	// on plain HTTP; other methods get a 403 that says why.
	ReadOnly []string `yaml:"read_only"`
	// Inspect lists names (DNS syntax) the relay terminates TLS for with
	// the sandbox's CA, as for a secret's hosts: every request's Host
	// (HTTP/2 :authority) and method is judged, so a Host of another site
	// inside TLS (domain fronting past the server name) is refused and
	// read_only applies. Clients must trust the sandbox CA (watcher exec
	// points SSL_CERT_FILE and friends at it); one that does not fails
	// its handshake.
	Inspect []string `yaml:"inspect"`
	// ECH lists the outer names for which a ClientHello with Encrypted
	// Client Hello passes (its real name is hidden); others are refused.
	ECH []string `yaml:"ech"`
	// UnnamedPorts are ports where connections to answered addresses pass
	// without a name (protocols where the server speaks first: SSH).
	UnnamedPorts []PortRange `yaml:"unnamed_ports"`
	// QUIC allows UDP 443 to answered addresses. Off, clients fall back
	// to TCP, where the name is judged.
	QUIC bool `yaml:"quic"`
	// Secrets are credentials the sandbox holds only placeholders for
	// (credential brokering, docs/concepts/egress-names.md).
	Secrets []EgressSecret `yaml:"secrets"`
}

// EgressSecret is a credential kept outside the sandbox: commands started
// with watcher exec see Env set to a placeholder, and the agent's relay
// swaps the placeholder for the real value in requests to Hosts only
// (terminating TLS there with a per-sandbox CA the sandbox trusts).
//
//	secrets:
//	  - name: openai
//	    env: OPENAI_API_KEY              # the sandbox's variable: the placeholder
//	    from_env: WATCHER_OPENAI_KEY     # the value, from the agent's environment
//	    hosts: [api.openai.com]
type EgressSecret struct {
	// Name names the secret in events (letters, digits, - and _).
	Name string `yaml:"name"`
	// Env is the environment variable that holds the placeholder.
	Env string `yaml:"env"`
	// FromEnv names the agent's environment variable with the value.
	FromEnv string `yaml:"from_env"`
	// FromFile is a file (only the agent reads) with the value.
	FromFile string `yaml:"from_file"`
	// Hosts are the names (DNS syntax) the value may be sent to.
	Hosts []string `yaml:"hosts"`
}

// Listen rules inbound servers: where a sandboxed process may bind and
// listen. A bind to a loopback address (127.0.0.0/8, ::1 and v4-mapped
// ::ffff:127.0.0.0/104) is allowed on any port, so the sandbox's own
// local servers and clients keep working; a bind to any other address,
// the wildcards 0.0.0.0 and :: (dual-stack) included, only on a listed
// port. TCP and UDP alike; binds to port 0 (the kernel picks a port) and
// UDP sockets bound implicitly by sendto are clients and pass. A TCP
// socket that listens without a bind (the kernel binds it to an
// ephemeral port on the wildcard address) gets no connection from
// another host unless its port is listed. A bind onto an address and
// port a socket outside the sandbox already holds is refused as well
// (SO_REUSEPORT would share that service's connections).
//
//	listen:
//	  ports: ["8080", "9000-9100"]   # at most 16 entries
//	  action: block                  # or record; allow lifts the rule
//
// Every preset lists no ports and blocks.
type Listen struct {
	// Ports are ports ("8080") or inclusive ranges ("9000-9100"), 1-65535,
	// the sandbox may bind on non-loopback addresses.
	Ports []PortRange `yaml:"ports"`
	// Action for a bind or listener outside Ports: block (refused with
	// EPERM, recorded), record (allowed, recorded) or allow (no rule).
	// Empty means block.
	Action Action `yaml:"action"`
}

// MaxListenPorts is how many entries listen.ports may hold (the kernel
// map's room per sandbox).
const MaxListenPorts = 16

// Protocol names a transport protocol.
type Protocol string

// Protocols.
const (
	ProtoTCP Protocol = "tcp"
	ProtoUDP Protocol = "udp"
	ProtoAny Protocol = "any"
)

// EgressRule allows a network.
type EgressRule struct {
	// CIDR is an IPv4 or IPv6 network ("10.0.0.0/8", "2001:db8::/32"); a
	// bare address means that host.
	CIDR string `yaml:"cidr"`
	// Ports are ports ("443") or inclusive ranges ("8000-8100"), 1-65535.
	// Empty means all ports.
	Ports []PortRange `yaml:"ports"`
	// Protocol is tcp, udp or any (default any).
	Protocol Protocol `yaml:"protocol"`
}

// EgressName opens ports at the addresses answered for a name.
type EgressName struct {
	// Name is a name in dns.allow's syntax: "example.com" (exactly),
	// "*.example.com" (names below it), ".example.com" (both).
	Name string `yaml:"name"`
	// Ports are ports ("22") or inclusive ranges ("8000-8100"), 1-65535;
	// at least one, and at most 6 per entry.
	Ports []PortRange `yaml:"ports"`
	// Protocol is tcp (default), udp or any.
	Protocol Protocol `yaml:"protocol"`
}

// MaxEgressNamePorts bounds the ports of one egress.name_ports entry: an
// answered address carries at most 8 port spans, two of them the web
// ports.
const MaxEgressNamePorts = 6

// LoopbackService is a local service a sandbox may reach.
type LoopbackService struct {
	// Name describes the service (for events).
	Name string `yaml:"name"`
	// Port is the service's port, 1-65535.
	Port int `yaml:"port"`
	// Protocol is tcp, udp or any (default tcp).
	Protocol Protocol `yaml:"protocol"`
}

// FileOpens says which routine file opens are recorded.
type FileOpens string

// File-open recording levels.
const (
	FileOpensNone   FileOpens = "none"
	FileOpensWrites FileOpens = "writes"
	FileOpensAll    FileOpens = "all"
)

// Audit sets the depth of routine recording (alerts are always recorded).
type Audit struct {
	// SampleRate is the fraction of routine events kept, in (0, 1]; 0 means
	// the agent's default.
	SampleRate float64 `yaml:"sample_rate"`
	// FileOpens is none, writes or all.
	FileOpens FileOpens `yaml:"file_opens"`
	// Exec records every exec with its arguments.
	Exec bool `yaml:"exec"`
	// Connections records every connection, allowed or not.
	Connections bool `yaml:"connections"`
	// Syscalls turns on the sampled stream of all syscalls.
	Syscalls bool `yaml:"syscalls"`
}

// EscapeAction is what the escape watch does over the threshold.
type EscapeAction string

// Escape actions.
const (
	// EscapeFreeze freezes the sandbox (cgroup.freeze) until an operator
	// thaws or kills it, and raises an alert.
	EscapeFreeze EscapeAction = "freeze"
	// EscapeAlert only raises the alert.
	EscapeAlert EscapeAction = "alert"
)

// Escape configures the escape watch for a sandbox.
type Escape struct {
	// Enabled turns the escape watch on.
	Enabled bool `yaml:"enabled"`
	// Threshold is the score that triggers the action (see
	// internal/escape for the weights).
	Threshold float64 `yaml:"threshold"`
	// Window is how far back signals count.
	Window Duration `yaml:"window"`
	// Action is freeze or alert.
	Action EscapeAction `yaml:"action"`
	// Scope is what is scored and frozen: leaf (the default: each
	// `watcher exec` run or container on its own, so one command's
	// refusals never freeze another) or sandbox (every cgroup of the
	// sandbox shares one score and is frozen together).
	Scope EscapeScope `yaml:"scope"`
}

// EscapeScope is what the escape watch scores and freezes.
type EscapeScope string

// Escape scopes.
const (
	EscapeScopeLeaf    EscapeScope = "leaf"
	EscapeScopeSandbox EscapeScope = "sandbox"
)

// Duration is a time span written as "30s", "5m", "1h30m", or a number of
// seconds.
type Duration struct {
	time.Duration
	// invalid holds text that did not parse; Validate reports it with its
	// line (go-yaml's own duration errors carry no position).
	invalid string
}

// D returns a Duration of d.
func D(d time.Duration) Duration { return Duration{Duration: d} }

// UnmarshalYAML accepts a duration string or a number of seconds.
func (d *Duration) UnmarshalYAML(unmarshal func(any) error) error {
	var v any
	if err := unmarshal(&v); err != nil {
		return err
	}
	*d = Duration{}
	switch x := v.(type) {
	case string:
		t, err := time.ParseDuration(strings.TrimSpace(x))
		if err != nil {
			d.invalid = fmt.Sprintf("%q is not a duration (want e.g. 30s, 5m, 1h30m)", x)
			return nil
		}
		d.Duration = t
	case uint64:
		d.Duration = time.Duration(x) * time.Second
	case int64:
		d.Duration = time.Duration(x) * time.Second
	case int:
		d.Duration = time.Duration(x) * time.Second
	case float64:
		d.Duration = time.Duration(x * float64(time.Second))
	case nil:
	default:
		d.invalid = fmt.Sprintf("%v is not a duration (want e.g. 30s, 5m, 1h30m)", v)
	}
	return nil
}

// MarshalYAML writes the duration as a string.
func (d Duration) MarshalYAML() (any, error) { return d.Duration.String(), nil }

// PortRange is a port ("443") or an inclusive range ("8000-8100"). YAML
// integers are accepted too.
type PortRange string

// Bounds parses the range.
func (r PortRange) Bounds() (lo, hi uint16, err error) {
	s := strings.TrimSpace(string(r))
	a, b, isRange := strings.Cut(s, "-")
	l, err := parsePort(a)
	if err != nil {
		return 0, 0, fmt.Errorf("port range %q: %w", s, err)
	}
	h := l
	if isRange {
		if h, err = parsePort(b); err != nil {
			return 0, 0, fmt.Errorf("port range %q: %w", s, err)
		}
		if h < l {
			return 0, 0, fmt.Errorf("port range %q: start above end", s)
		}
	}
	return l, h, nil
}

func parsePort(s string) (uint16, error) {
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil {
		return 0, fmt.Errorf("%q is not a port number", s)
	}
	if n < 1 || n > 65535 {
		return 0, fmt.Errorf("port %d out of range 1-65535", n)
	}
	return uint16(n), nil
}
