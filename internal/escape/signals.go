// Package escape scores each sandbox for signs of an escape attempt over a
// sliding window, and decides when the score crosses the sandbox's
// threshold (the agent then freezes the sandbox and raises an alert).
//
// Events are mapped to signals, each with a weight and a cap:
//
//	signal          weight  cap  what
//	escape_hook       50    100  writes to release_agent, notify_on_release, uevent_helper,
//	                             core_pattern, modprobe, binfmt_misc; open_by_handle_at
//	root_change       40     80  chroot, pivot_root
//	module            40     80  init_module, finit_module, kexec_load, delete_module
//	cgroup_move       40     80  writes to cgroup.procs, cgroup.threads, tasks
//	host_api          35     70  container runtime sockets (docker, containerd, CRI-O,
//	                             podman), the kubelet API, cloud metadata services
//	mount             30     60  mount, umount, move_mount, fsopen, fsmount, open_tree
//	namespace         30     60  another process's /proc/PID/ns/*, setns, unshare
//	proc_mem          30     60  another process's /proc/PID/mem, /proc/kcore
//	agent_kill       100    100  a signal from a sandbox that would end or stop the
//	                             agent (or any file-owner signal, F_SETOWN/F_SETSIG):
//	                             decisive, trips the threshold on its own
//	agent_attack      30     60  other signals or ptrace aimed at the agent, refused
//	ptrace            25     50  ptrace, process_vm_readv/writev, pidfd_getfd
//	bpf               25     50  bpf()
//	credential        20     40  /etc/shadow, gshadow, sudoers, SSH host and user keys,
//	                             cloud and Kubernetes credentials, service-account tokens
//	dev_internal      15     45  block devices, /dev/mem, kmem, port, kmsg; device-cgroup denials
//	procsys_write     15     30  writes under /proc/sys, sysctl-hook writes
//	raw_socket        10     20  raw and packet sockets
//	sys_internal       8     32  writes under /sys; reads of /sys/kernel/{security,debug,
//	                             tracing,config}, /sys/fs/bpf, /sys/firmware
//	proc_internal      5     25  another process's environ, maps, root, cwd, fd, stack,
//	                             syscall...; /proc/kallsyms, kmsg, keys, modules (double for PID 1)
//	connect_denied     5     20  connections and datagrams refused by the egress policy
//	capability         5     20  use of SYS_ADMIN, SYS_MODULE, SYS_PTRACE, SYS_RAWIO,
//	                             DAC_READ_SEARCH, BPF, SYS_BOOT, MAC_ADMIN
//
// A refused (denied) or killed attempt counts 1.5 times its weight: the
// process tried something the policy told it it cannot do. Each signal's
// contribution within the window is capped, so one repeated mistake (a
// script retrying a blocked connection, a tool probing /sys) cannot reach a
// threshold of 100 alone, while an escape — which chains several kinds of
// step (recon in /proc, a namespace or mount attempt, a cgroup or runtime
// socket trick, credential reads) — does within a few events. Routine reads
// that real workloads make (their own /proc/self, /proc/PID/stat of others as
// ps does, /sys CPU topology and cgroup limits, /dev/null and urandom) count
// nothing: see the benign workload traces in the tests.
package escape

import (
	"path"
	"strconv"
	"strings"

	"github.com/watcherhq/watcher/internal/audit"
)

// Signal is a kind of escape sign.
type Signal string

// Signals, see the package documentation for their weights.
const (
	SigEscapeHook    Signal = "escape_hook"
	SigRootChange    Signal = "root_change"
	SigModule        Signal = "module"
	SigCgroupMove    Signal = "cgroup_move"
	SigHostAPI       Signal = "host_api"
	SigMount         Signal = "mount"
	SigNamespace     Signal = "namespace"
	SigProcMem       Signal = "proc_mem"
	SigAgentKill     Signal = "agent_kill"
	SigAgentAttack   Signal = "agent_attack"
	SigPtrace        Signal = "ptrace"
	SigBPF           Signal = "bpf"
	SigCredential    Signal = "credential"
	SigDevInternal   Signal = "dev_internal"
	SigProcSysWrite  Signal = "procsys_write"
	SigRawSocket     Signal = "raw_socket"
	SigSysInternal   Signal = "sys_internal"
	SigProcInternal  Signal = "proc_internal"
	SigConnectDenied Signal = "connect_denied"
	SigCapability    Signal = "capability"
)

// Weight is a signal's score per event and its cap per window.
type Weight struct {
	Per float64
	Cap float64
	// Decisive: one such event takes its sandbox to the threshold,
	// whatever the threshold (an attack on the agent itself: once it
	// lands, the agent may be gone before a second one is scored).
	Decisive bool
}

// DefaultWeights are the weights documented in the package comment.
func DefaultWeights() map[Signal]Weight {
	return map[Signal]Weight{
		SigEscapeHook:    {Per: 50, Cap: 100},
		SigRootChange:    {Per: 40, Cap: 80},
		SigModule:        {Per: 40, Cap: 80},
		SigCgroupMove:    {Per: 40, Cap: 80},
		SigHostAPI:       {Per: 35, Cap: 70},
		SigMount:         {Per: 30, Cap: 60},
		SigNamespace:     {Per: 30, Cap: 60},
		SigProcMem:       {Per: 30, Cap: 60},
		SigAgentKill:     {Per: 100, Cap: 100, Decisive: true},
		SigAgentAttack:   {Per: 30, Cap: 60},
		SigPtrace:        {Per: 25, Cap: 50},
		SigBPF:           {Per: 25, Cap: 50},
		SigCredential:    {Per: 20, Cap: 40},
		SigDevInternal:   {Per: 15, Cap: 45},
		SigProcSysWrite:  {Per: 15, Cap: 30},
		SigRawSocket:     {Per: 10, Cap: 20},
		SigSysInternal:   {Per: 8, Cap: 32},
		SigProcInternal:  {Per: 5, Cap: 25},
		SigConnectDenied: {Per: 5, Cap: 20},
		SigCapability:    {Per: 5, Cap: 20},
	}
}

// RefusedFactor multiplies the weight of denied and killed attempts.
const RefusedFactor = 1.5

// Classify maps an event to an escape signal and a weight multiplier (1,
// or 2 for the same step aimed at PID 1). ok is false for events that are
// no sign of escape.
func Classify(ev *audit.Event) (sig Signal, mult float64, ok bool) {
	switch ev.Kind {
	case audit.KindFileOpen:
		if ev.File == nil {
			return "", 0, false
		}
		return classifyPath(ev.File.Path, ev.File.Write, ev.File.Mode, ev.Process)
	case audit.KindMount:
		if ev.Mount != nil && (ev.Mount.Op == "pivot_root" || ev.Mount.Op == "chroot") {
			return SigRootChange, 1, true
		}
		return SigMount, 1, true
	case audit.KindPtrace:
		if ev.Verdict == audit.VerdictDenied && ev.Rule == "kill_agent" {
			return SigAgentAttack, 1, true
		}
		return SigPtrace, 1, true
	case audit.KindModule:
		return SigModule, 1, true
	case audit.KindBPF:
		return SigBPF, 1, true
	case audit.KindSignal:
		// Signals within the sandbox are routine; refused ones were aimed
		// at the agent (the only signals the policy refuses).
		if ev.Verdict == audit.VerdictDenied || ev.Verdict == audit.VerdictKilled {
			if ev.Target != nil && endsAgent[ev.Target.Mode] {
				return SigAgentKill, 1, true
			}
			return SigAgentAttack, 1, true
		}
	case audit.KindCapability:
		if ev.Target != nil && riskyCaps[ev.Target.Capability] {
			return SigCapability, 1, true
		}
	case audit.KindDevice:
		if ev.Verdict != audit.VerdictAllowed {
			return SigDevInternal, 1, true
		}
	case audit.KindSysctl:
		if ev.File != nil && !ev.File.Write && ev.Verdict == audit.VerdictAllowed {
			return "", 0, false
		}
		if ev.File != nil {
			if s, m, ok := classifyPath(ev.File.Path, true, 0, ev.Process); ok {
				return s, m, true
			}
		}
		return SigProcSysWrite, 1, true
	case audit.KindSocket:
		if ev.Verdict != audit.VerdictAllowed {
			return SigRawSocket, 1, true
		}
	case audit.KindNet:
		if ev.Net == nil {
			return "", 0, false
		}
		if hostAPI(ev.Net.Addr, ev.Net.Port) {
			return SigHostAPI, 1, true
		}
		if ev.Verdict == audit.VerdictDenied || ev.Verdict == audit.VerdictKilled {
			if ev.Net.Op == "sock_create" {
				return SigRawSocket, 1, true
			}
			return SigConnectDenied, 1, true
		}
	case audit.KindSyscall:
		if ev.Syscall == nil {
			return "", 0, false
		}
		if SignalledAgent(ev) {
			return SigAgentKill, 1, true
		}
		if s, ok := syscallSignals[ev.Syscall.Name]; ok {
			return s, 1, true
		}
	}
	return "", 0, false
}

// endsAgent are the signals that end or stop the agent (a Go program):
// SIGKILL and SIGSTOP, those the Go runtime exits on (HUP, INT, TERM,
// QUIT, ILL, TRAP, ABRT, BUS, FPE, SEGV, STKFLT, SYS) and the job-control
// stops it leaves to the kernel (TSTP, TTIN, TTOU).
var endsAgent = map[uint32]bool{1: true, 2: true, 3: true, 4: true, 5: true, 6: true, 7: true, 8: true, 9: true,
	11: true, 15: true, 16: true, 19: true, 20: true, 21: true, 22: true, 31: true}

// SignalledAgent reports whether ev is the kill backstop's record of a
// signal a sandboxed process made the kernel queue for the agent by a
// route other than a kill-family syscall (those decode as KindSignal): a
// file owner's signal (F_SETOWN plus F_SETSIG, sent by a write to a pipe
// or socket). The agent never asks for such signals, and the record comes
// from the kernel's signal_generate tracepoint, which cannot refuse: the
// signal was delivered (a SIGKILL killed the agent).
func SignalledAgent(ev *audit.Event) bool {
	return ev.Kind == audit.KindSyscall && ev.Target != nil && ev.Target.PID != 0 &&
		strings.Contains(ev.Message, "category=signal_agent")
}

var riskyCaps = map[int32]bool{
	2:  true, // DAC_READ_SEARCH (open_by_handle_at: the "shocker" escape)
	16: true, // SYS_MODULE
	17: true, // SYS_RAWIO
	19: true, // SYS_PTRACE
	21: true, // SYS_ADMIN
	22: true, // SYS_BOOT
	33: true, // MAC_ADMIN
	39: true, // BPF
}

var syscallSignals = map[string]Signal{
	"setns": SigNamespace, "unshare": SigNamespace,
	"mount": SigMount, "umount2": SigMount, "move_mount": SigMount, "fsopen": SigMount,
	"fsmount": SigMount, "fsconfig": SigMount, "open_tree": SigMount, "mount_setattr": SigMount,
	"pivot_root": SigRootChange, "chroot": SigRootChange,
	"init_module": SigModule, "finit_module": SigModule, "delete_module": SigModule,
	"kexec_load": SigModule, "kexec_file_load": SigModule,
	"ptrace": SigPtrace, "process_vm_readv": SigPtrace, "process_vm_writev": SigPtrace, "pidfd_getfd": SigPtrace,
	"bpf":               SigBPF,
	"open_by_handle_at": SigEscapeHook,
}

// hostAPI reports addresses that lead out of the sandbox to the host's
// control planes: runtime sockets, the kubelet, cloud metadata.
func hostAPI(addr string, port uint16) bool {
	if strings.HasPrefix(addr, "/") || strings.HasPrefix(addr, "@") {
		return runtimeSocket(addr)
	}
	switch addr {
	case "169.254.169.254", "fd00:ec2::254", "169.254.170.2":
		return true
	}
	return port == 10250 || port == 10255 // kubelet API
}

func runtimeSocket(p string) bool {
	switch path.Base(p) {
	case "docker.sock", "containerd.sock", "crio.sock", "cri-dockerd.sock", "podman.sock", "dockershim.sock":
		return true
	}
	return strings.HasPrefix(p, "/var/lib/kubelet/pod-resources/") || strings.HasSuffix(p, "/kubelet.sock")
}

// classifyPath maps an open of a resolved path.
func classifyPath(p string, write bool, mode uint32, proc audit.Process) (Signal, float64, bool) {
	const sIFMT, sIFBLK = 0o170000, 0o060000
	base := path.Base(p)
	if write {
		switch {
		case base == "release_agent" || base == "notify_on_release" ||
			p == "/sys/kernel/uevent_helper" || p == "/proc/sys/kernel/core_pattern" ||
			p == "/proc/sys/kernel/modprobe" || strings.HasPrefix(p, "/proc/sys/fs/binfmt_misc/") ||
			p == "/proc/sysrq-trigger":
			return SigEscapeHook, 1, true
		case base == "cgroup.procs" || base == "cgroup.threads" || (base == "tasks" && strings.HasPrefix(p, "/sys/fs/cgroup/")):
			return SigCgroupMove, 1, true
		}
	}
	if mode&sIFMT == sIFBLK {
		return SigDevInternal, 1, true
	}
	if credential(p) {
		return SigCredential, 1, true
	}
	if runtimeSocket(p) {
		return SigHostAPI, 1, true
	}
	switch {
	case strings.HasPrefix(p, "/proc/"):
		return classifyProc(p[len("/proc/"):], write, proc)
	case strings.HasPrefix(p, "/sys/"):
		if write {
			return SigSysInternal, 1, true
		}
		for _, pre := range sysSensitive {
			if strings.HasPrefix(p, pre) {
				return SigSysInternal, 1, true
			}
		}
	case strings.HasPrefix(p, "/dev/"):
		if devInternal(p[len("/dev/"):]) {
			return SigDevInternal, 1, true
		}
	}
	return "", 0, false
}

var sysSensitive = []string{
	"/sys/kernel/security/", "/sys/kernel/debug/", "/sys/kernel/tracing/", "/sys/kernel/config/",
	"/sys/fs/bpf/", "/sys/firmware/",
}

func credential(p string) bool {
	switch p {
	case "/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/master.passwd":
		return true
	}
	if strings.HasPrefix(p, "/etc/sudoers") || strings.HasPrefix(p, "/root/.ssh/") ||
		strings.HasPrefix(p, "/var/run/secrets/kubernetes.io/") || strings.HasPrefix(p, "/run/secrets/kubernetes.io/") {
		return true
	}
	if strings.HasPrefix(p, "/etc/ssh/ssh_host_") && strings.HasSuffix(p, "_key") {
		return true
	}
	// Per-user secrets: ~/.ssh private keys, cloud and cluster credentials.
	if strings.HasPrefix(p, "/home/") {
		for _, s := range []string{"/.ssh/id_", "/.aws/credentials", "/.kube/config", "/.config/gcloud/", "/.docker/config.json", "/.git-credentials", "/.netrc"} {
			if strings.Contains(p, s) && !strings.HasSuffix(p, ".pub") {
				return true
			}
		}
	}
	for _, s := range []string{"/root/.aws/credentials", "/root/.kube/config", "/root/.config/gcloud/", "/root/.docker/config.json", "/root/.git-credentials", "/root/.netrc"} {
		if strings.HasPrefix(p, s) {
			return true
		}
	}
	return false
}

// devInternal reports raw hardware and kernel devices; terminals, null,
// random and shared memory are routine.
func devInternal(name string) bool {
	switch name {
	case "mem", "kmem", "port", "kmsg", "root", "fuse", "vhost-net", "vhost-vsock":
		return true
	}
	for _, pre := range []string{"sd", "hd", "vd", "xvd", "nvme", "dm-", "mapper/", "loop", "disk/", "md", "sr", "mmcblk", "cpu/", "bus/", "nbd"} {
		if strings.HasPrefix(name, pre) && name != "mapper/control" {
			return true
		}
	}
	return false
}

// classifyProc maps an open below /proc/ (rest is the path after it).
func classifyProc(rest string, write bool, proc audit.Process) (Signal, float64, bool) {
	first, sub, _ := strings.Cut(rest, "/")
	pid, err := strconv.ParseUint(first, 10, 32)
	if err != nil {
		switch first {
		case "self", "thread-self":
			return "", 0, false
		case "sys":
			if write {
				return SigProcSysWrite, 1, true
			}
			return "", 0, false
		case "kcore":
			return SigProcMem, 1, true
		case "kallsyms", "kmsg", "keys", "key-users", "modules", "timer_list", "sched_debug", "config.gz", "sysrq-trigger", "kpagecount", "kpageflags", "vmallocinfo", "iomem", "ioports":
			return SigProcInternal, 1, true
		}
		return "", 0, false
	}
	if uint32(pid) == proc.TGID || uint32(pid) == proc.PID {
		return "", 0, false // the process's own entries
	}
	mult := 1.0
	if pid == 1 {
		mult = 2
	}
	// Strip a task/<tid>/ level: /proc/PID/task/TID/mem is the same door.
	if t, after, ok := strings.Cut(sub, "/"); ok && t == "task" {
		if _, s, ok := strings.Cut(after, "/"); ok {
			sub = s
		}
	}
	entry, _, _ := strings.Cut(sub, "/")
	switch entry {
	case "ns":
		return SigNamespace, mult, true
	case "mem":
		return SigProcMem, mult, true
	case "environ", "maps", "smaps", "smaps_rollup", "map_files", "pagemap", "root", "cwd", "fd", "fdinfo",
		"stack", "syscall", "auxv", "personality", "mountinfo", "mounts", "setgroups", "uid_map", "gid_map",
		"attr", "timers", "exe", "wchan", "io", "coredump_filter", "oom_score_adj":
		return SigProcInternal, mult, true
	}
	// stat, status, cmdline, comm, statm, cgroup, limits...: what ps, top and
	// pgrep read for every process.
	return "", 0, false
}
