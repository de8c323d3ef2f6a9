// Package backstoprules is the kill backstop's rule set
// (internal/enforce/backstop loads it). No BPF here, so the planner can
// build it.
package backstoprules

import "github.com/watcherhq/watcher/internal/enforce/rules"

// Mechanism is the audit mechanism name of the backstop's events.
const Mechanism = "kill"

// Op is the set of file operations a path rule applies to.
type Op uint32

// File operations (OP_* in bpf/include/backstop_maps.h).
const (
	OpRead  Op = 1
	OpWrite Op = 2
	OpExec  Op = 4
)

// Rule is an action with the policy rule id reported in events.
type Rule struct {
	// Action is rules.ActionAllow, ActionRecord or ActionKill
	// (ActionBlock is carried out as a kill: the backstop cannot block).
	Action uint32
	// ID is the policy rule id reported in events (0: none).
	ID uint32
}

// SyscallRule applies an action to every call of a syscall in a sandbox.
type SyscallRule struct {
	// Name is the syscall's name (x86_64), e.g. "mount".
	Name string
	Rule
}

// PathRule matches opens (and execs) by resolved path.
type PathRule struct {
	// Path is absolute; with Prefix it matches everything starting with it
	// (give "/etc/sudoers.d/" for a directory's contents).
	Path string
	// Prefix selects prefix matching instead of exact matching.
	Prefix bool
	// Ops are the operations the rule applies to (OpRead|OpWrite for both).
	Ops Op
	// SandboxID limits the rule to one sandbox; 0 applies to every sandbox.
	SandboxID uint32
	Rule
}

// Rules is the backstop's whole rule set.
type Rules struct {
	// SandboxRules are the syscall and category rules of every sandbox
	// that has no set of its own in Sandboxes.
	SandboxRules
	// Sandboxes are the syscall and category rules per sandbox id (> 0).
	// A sandbox listed gets exactly its own set (the every-sandbox set
	// above does not apply to it), so a sandbox whose policy allows an
	// operation is never killed because another sandbox blocks it.
	Sandboxes map[uint32]SandboxRules
	// Paths lists path rules. Exact rules on existing files also match the
	// file's inode, so hard links match; call SetRules again when such a
	// file is replaced (a new inode). An inode entry matches the file it
	// was written for, not a later file given the same inode number
	// (enforce.FileID).
	Paths []PathRule
	// UnixPaths are the socket paths each sandbox whose egress restricts
	// unix sockets may connect to ("/dir/" for everything below a
	// directory). A sandbox not listed is not restricted.
	UnixPaths []UnixPaths
	// Dirs judge changes made without a write-open (truncate, chmod,
	// chown, xattrs, times, link, unlink, rename, symlink, mknod, mkdir,
	// O_TRUNC), by inode: nil derives them from Paths (protected exact and
	// prefix rules only).
	Dirs []DirRule
}

// For returns the syscall and category rules sandbox id gets: its own set
// when Sandboxes has one, else the every-sandbox set.
func (r Rules) For(id uint32) SandboxRules {
	if s, ok := r.Sandboxes[id]; ok {
		return s
	}
	return r.SandboxRules
}

// SandboxRules are syscall and category rules: the backstop keeps them per
// sandbox (bs_sb_rules), behind host-wide arrays that only say whether any
// sandbox has a rule (the fast path for everything else).
type SandboxRules struct {
	// Syscalls lists syscalls killed or recorded whatever their arguments.
	Syscalls []SyscallRule
	// CgroupWrite applies to write-opens of cgroupfs files (cgroup.procs of
	// a parent: leaving the sandbox).
	CgroupWrite Rule
	// ProcMem applies to opens of another process's /proc/PID/mem.
	ProcMem Rule
	// CloneFiles applies to clone/clone3 sharing the file table with a new
	// process (CLONE_FILES without CLONE_THREAD).
	CloneFiles Rule
	// IOUring applies to io_uring_setup.
	IOUring Rule
	// IOUringOpen applies to open requests submitted to an io_uring (only
	// reachable when IOUring allows rings).
	IOUringOpen Rule
	// SignalAgent applies to kill-family syscalls aimed at the agent (the
	// signal itself is still delivered: only an LSM can refuse it).
	SignalAgent Rule
	// CgroupEscape applies when a sandbox task is moved out of its sandbox,
	// or a child of a sandboxed process starts outside it (clone3
	// CLONE_INTO_CGROUP); always at least recorded.
	CgroupEscape Rule
	// Compat applies to every 32-bit system call (int 0x80, x32) of a
	// sandboxed process, killed before it runs. When it allows them, the
	// i386 numbers of Syscalls (internal/dangerous) are checked instead.
	Compat Rule
	// ExecFileless applies to execs of a file with no name a rule could
	// match (memfd_create + execveat, a deleted file): set where a sandbox
	// has exec rules that refuse something.
	ExecFileless Rule
	// MmapExec turns on the exec rules for mmap PROT_EXEC of a file (the
	// dynamic loader's `ld.so FILE`): its action only enables the check,
	// the exec rule matching the file decides.
	MmapExec Rule
	// PacketSocket applies to socket(AF_PACKET, ...): cgroup/sock_create
	// never runs for packet sockets, which reach the wire past every
	// connect and sendmsg hook.
	PacketSocket Rule
	// UnixPeer applies when connect(2) of a unix socket returns connected
	// to a peer bound outside the sandbox's UnixPaths (symlinks and bind
	// mounts resolved by the kernel), for the sandboxes UnixPaths lists;
	// killed after the connect, before the thread returns to user space.
	UnixPeer Rule
	// LowMapping applies when a sandbox member ends up with a mapping
	// below vm.mmap_min_addr (page 0), which needs CAP_SYS_RAWIO but is
	// checked by the kernel without the capable hook: mmap, mremap or shmat
	// returning such an address, an exec whose ELF loader mapped one (a low
	// ELF, the MMAP_PAGE_ZERO personality), an i386 mapping call leaving
	// one. Killed when the syscall returns (the mapping exists until the
	// kill lands; another thread of the process could use it in between),
	// before the exec'd program runs.
	LowMapping Rule
	// OtherTask applies to calls reaching a process outside the
	// sandbox's cgroup subtree (issue 25), judged at sys_enter on the
	// target the registers and kernel state name: the kill family and
	// pidfd_send_signal (the agent keeps SignalAgent), pidfd_open,
	// prlimit64 setting a limit, setpriority and ioprio_set (process
	// groups and users always), sched_set*, migrate_pages, move_pages,
	// process_madvise, kcmp, SIGIO/SIGURG owners (fcntl F_SETOWN,
	// F_SETOWN_EX, ioctl FIOSETOWN, SIOCSPGRP: group owners always); and
	// at signal_generate every signal a sandboxed process queues for a
	// task outside (process groups, kill(-1)). The call runs before the
	// kill lands.
	OtherTask Rule
	// TTYInject applies to ioctl TIOCSTI and TIOCLINUX on any terminal.
	TTYInject Rule
	// NetConfig applies to the socket ioctls that set interfaces,
	// addresses, routes, ARP (CAP_NET_ADMIN; reads stay allowed).
	NetConfig Rule
	// ClockAdjust applies to adjtimex and clock_adjtime with modes set
	// (read from user memory at entry).
	ClockAdjust Rule
	// Namespaces applies to setns to a namespace the caller is not in (or
	// a pidfd outside the subtree), and unshare/clone of namespaces that
	// ask for CAP_SYS_ADMIN.
	Namespaces Rule
	// Syslog applies to syslog actions other than reading.
	Syslog Rule
	// Quota applies to quotactl and quotactl_fd commands other than reads.
	Quota Rule
	// OtherIPC applies to System V objects and POSIX message queues the
	// sandbox did not create (bpf/ipc.c records creations;
	// Rules.NeedsIPCCreators): shmat, semop, semtimedop, msgsnd, msgrcv,
	// the *ctl commands that remove or change one, mq_timedsend,
	// mq_timedreceive and mq_notify, at entry (the call completes first).
	OtherIPC Rule
	// NotifyMark applies to inotify marks outside the sandbox's writable
	// places, judged when inotify_add_watch returns (the mark exists until
	// the kill: it dies with the descriptor).
	NotifyMark Rule
	// CapUse are capabilities whose successful check kills, by number
	// (cap_capable tracepoint, after the check and before the process
	// returns: the change is made). Only capabilities the kernel checks
	// right before a change belong here (dangerous.CapsJudgedOnUse):
	// CAP_NET_ADMIN is judged in netlink sends only.
	CapUse map[int]Rule
	// NoI386 says the kernel runs no 32-bit system calls (ia32.Available
	// failed): Compat is not needed and no rule is keyed by i386 number,
	// so the syscall tracepoints are not attached for them.
	NoI386 bool
}

// DirKind says what a DirRule's place is.
type DirKind uint32

// Dir kinds (DIR_* in bpf/include/backstop_maps.h).
const (
	// DirDefault is a sandbox's write default (Path is ignored).
	DirDefault DirKind = 0
	// DirWritable: changes below Path are allowed.
	DirWritable DirKind = 1
	// DirProtected: Path's files may not be read, so neither linked nor
	// renamed; changes below it are refused.
	DirProtected DirKind = 2
)

// DirRule is one place of Rules.Dirs. The deepest place above a changed
// inode decides; none: the sandbox's DirDefault.
type DirRule struct {
	// Path is a directory (everything below it) or a file.
	Path string
	// Kind says what the place is.
	Kind DirKind
	// SandboxID limits the rule to one sandbox; 0 applies to every sandbox.
	SandboxID uint32
	Rule
}

// UnixPaths are the unix socket paths one sandbox may connect to.
type UnixPaths struct {
	// SandboxID is the sandbox (never 0: the restriction is per sandbox).
	SandboxID uint32
	// Paths are absolute: "/dir/" allows every socket below dir, any
	// other path exactly that socket.
	Paths []string
	// Rule is the policy rule reported when a connect is refused.
	Rule uint32
}

// NeedsSyscallTracepoints reports whether r has a rule only the raw
// syscall tracepoints judge: a syscall rule, a check of syscall arguments
// (clone flags, io_uring_setup, signals aimed at the agent, 32-bit entry,
// mmap PROT_EXEC, AF_PACKET) or of return values (unix peers, addresses
// below vm.mmap_min_addr), or a file rule judged at open (sys_exit: path
// rules, cgroupfs write-opens, /proc/PID/mem; an interpreter's open of its
// script). The other checks (fork, cgroup moves, exec, inode changes,
// signals by any route) run on event tracepoints that cost nothing to the
// rest of the host.
func (r Rules) NeedsSyscallTracepoints() bool {
	if r.SandboxRules.needsSyscallTracepoints() {
		return true
	}
	for _, s := range r.Sandboxes {
		if s.needsSyscallTracepoints() {
			return true
		}
	}
	for _, p := range r.Paths {
		if p.Action != rules.ActionAllow && p.Ops != 0 {
			return true
		}
	}
	return false
}

// NeedsIPCCreators reports whether some sandbox's OtherIPC rule judges
// System V objects by their creator: bpf/ipc.c must record creations.
func (r Rules) NeedsIPCCreators() bool {
	if r.SandboxRules.OtherIPC.Action != rules.ActionAllow {
		return true
	}
	for _, s := range r.Sandboxes {
		if s.OtherIPC.Action != rules.ActionAllow {
			return true
		}
	}
	return false
}

func (r SandboxRules) needsSyscallTracepoints() bool {
	for _, c := range []Rule{r.CgroupWrite, r.ProcMem, r.CloneFiles, r.IOUring, r.SignalAgent, r.Compat,
		r.MmapExec, r.PacketSocket, r.UnixPeer, r.LowMapping, r.OtherTask, r.TTYInject, r.NetConfig,
		r.ClockAdjust, r.Namespaces, r.Syslog, r.Quota, r.OtherIPC, r.NotifyMark} {
		if c.Action != rules.ActionAllow {
			return true
		}
	}
	for _, s := range r.Syscalls {
		if s.Action != rules.ActionAllow {
			return true
		}
	}
	return false
}
