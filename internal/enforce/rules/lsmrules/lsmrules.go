// Package lsmrules is the BPF LSM layer's rules per sandbox
// (internal/enforce/lsm loads them). No BPF here, so the planner can
// build them.
package lsmrules

import "fmt"

// Mechanisms a hook's program can run under (see bpf/include/lsm_hook.h).
const (
	// MechLSM: a BPF LSM program (lsm/<hook>), where `bpf` is an active LSM.
	MechLSM = "lsm"
	// MechFmodRet: a BPF_MODIFY_RETURN program on the kernel's
	// security_<hook> function, where BPF LSM is built but not enabled
	// (it needs BPF trampolines, not the LSM list). Same decision code,
	// same EPERM before the operation.
	MechFmodRet = "fmod_ret"
	// MechFentry: an fentry program on a syscall's own entry point
	// (__x64_sys_NAME, __ia32_sys_NAME) for the dangerous syscalls no LSM
	// hook judges: it kills the caller at entry, like the backstop, but
	// only that syscall pays for it (io_uring_setup: fexit, killed on the
	// way out when no hook refused the ring). Its "hook" is the function
	// name.
	MechFentry = "fentry"
)

// Op is an operation judged as a whole, not by path (enum lsm_op in
// bpf/include/lsm_rules.h).
type Op uint32

// Operations.
const (
	// OpPtraceAttach: ptrace attach and everything that needs the same
	// access to another process's memory: /proc/PID/mem of another
	// process, process_vm_readv/writev, pidfd_getfd.
	OpPtraceAttach Op = 1
	// OpPtraceRead: read-mode access checks on another process
	// (/proc/PID/environ, maps, kcmp). Denials of the kernel's silent
	// probes (e.g. ps reading /proc/PID/stat) hide fields, not files.
	OpPtraceRead Op = 2
	// OpPtraceTraceme: PTRACE_TRACEME, offering oneself to the parent.
	OpPtraceTraceme Op = 3
	// OpMount: mount(2), including remount, bind, MS_MOVE, propagation.
	OpMount Op = 4
	// OpUmount: umount(2).
	OpUmount Op = 5
	// OpMoveMount: move_mount(2), the only way to attach an fsmount(2) result.
	OpMoveMount Op = 6
	// OpPivotRoot: pivot_root(2).
	OpPivotRoot Op = 7
	// OpChroot: chroot(2).
	OpChroot Op = 8
	// OpFSConfig: new mount API, every fsconfig(2) parameter (fsopen itself
	// has no LSM hook).
	OpFSConfig Op = 9
	// OpKernelReadFile: the kernel reading a file as code or policy:
	// finit_module, kexec_file_load, firmware.
	OpKernelReadFile Op = 10
	// OpKernelLoadData: init_module and kexec_load from a buffer.
	OpKernelLoadData Op = 11
	// OpBPF: the bpf(2) syscall, any command.
	OpBPF Op = 12
	// OpProcMem: opening /proc/PID/mem for any PID, including self.
	OpProcMem Op = 13
	// OpAgentSignal: any signal to the agent's process. Blocked when no
	// rule says otherwise.
	OpAgentSignal Op = 14
	// OpAgentPtrace: any ptrace access check on the agent (attach and
	// read modes). Blocked when no rule says otherwise.
	OpAgentPtrace Op = 15
	// OpCloneIntoCgroup: clone3 with CLONE_INTO_CGROUP, a child started
	// straight into a cgroup chosen by directory fd (judged on the flag
	// the kernel copied; a plain fork or clone stays allowed).
	OpCloneIntoCgroup Op = 16
	// OpPerfEvent: perf_event_open(2).
	OpPerfEvent Op = 17
	// OpUserNS: creating a user namespace (clone or unshare CLONE_NEWUSER).
	OpUserNS Op = 18
	// OpKeyring: creating a key or keyring (add_key, keyctl).
	OpKeyring Op = 19
	// OpUserfaultfd: creating a userfaultfd (the kernel's anon inode).
	OpUserfaultfd Op = 20
	// OpIOUring: creating an io_uring instance, on kernels whose rings get
	// a secure anonymous inode (others: io_uring has no LSM hook).
	OpIOUring Op = 21
	// OpCloneFiles: clone or clone3 with CLONE_FILES and without
	// CLONE_THREAD, a second process sharing the file table (judged on
	// the flags the kernel copied at task_alloc; threads stay allowed).
	OpCloneFiles Op = 22
	// OpUnixConnect: the decision for a unix connect or datagram send
	// whose peer is bound outside Rules.UnixPaths (judged on the peer the
	// kernel found, by its bound path; abstract peers too). Without this
	// op, unix peers are not judged.
	OpUnixConnect Op = 23
	// OpExecFileless: exec, or a PROT_EXEC mapping, of a file with no name
	// (memfd_create + execveat, a file deleted after it was opened,
	// O_TMPFILE): no exec rule can name it.
	OpExecFileless Op = 24
	// OpKernelIface: the kernel group of the one dangerous list
	// (internal/dangerous) where no hook of its own judges it: the
	// capability the syscall checks first (iopl, ioperm, acct, swapon,
	// swapoff, reboot, open_by_handle_at), its key permissions (keyctl,
	// add_key, request_key use OpKeyring), or its entry point (fentry:
	// personality, name_to_handle_at, killed at entry).
	OpKernelIface Op = 25
	// OpOtherTask: an operation on a process outside the sandbox's own
	// subtree (policy operations.other_processes): signals by any route,
	// prlimit, priority and scheduling, ioprio, page migration,
	// ptrace-mode reads, kcmp.
	OpOtherTask Op = 26
	// OpOtherIPC: a System V IPC object or POSIX message queue the
	// sandbox did not create (operations.other_ipc).
	OpOtherIPC Op = 27
	// OpTTYInject: TIOCSTI or TIOCLINUX on any terminal
	// (operations.terminals).
	OpTTYInject Op = 28
	// OpNotifyMark: a fanotify or inotify mark on a file outside the
	// workspaces (operations.notify_marks).
	OpNotifyMark Op = 29
)

var opNames = map[Op]string{
	OpPtraceAttach: "ptrace_attach", OpPtraceRead: "ptrace_read", OpPtraceTraceme: "ptrace_traceme",
	OpMount: "mount", OpUmount: "umount", OpMoveMount: "move_mount", OpPivotRoot: "pivot_root",
	OpChroot: "chroot", OpFSConfig: "fsconfig", OpKernelReadFile: "kernel_read_file",
	OpKernelLoadData: "kernel_load_data", OpBPF: "bpf", OpProcMem: "proc_mem",
	OpAgentSignal: "agent_signal", OpAgentPtrace: "agent_ptrace",
	OpCloneIntoCgroup: "clone_into_cgroup", OpPerfEvent: "perf_event_open", OpUserNS: "userns_create",
	OpKeyring: "key_alloc", OpUserfaultfd: "userfaultfd", OpIOUring: "io_uring_setup",
	OpCloneFiles: "clone_files", OpUnixConnect: "unix_connect", OpExecFileless: "exec_fileless",
	OpKernelIface: "kernel_interface", OpOtherTask: "other_process", OpOtherIPC: "other_ipc",
	OpTTYInject: "tty_inject", OpNotifyMark: "notify_mark",
}

func (o Op) String() string {
	if n, ok := opNames[o]; ok {
		return n
	}
	return fmt.Sprintf("op(%d)", uint32(o))
}

// Decision is what a rule does (rules.ActionAllow/Record/Block/Kill) and
// the policy rule id reported in events.
type Decision struct {
	Action uint32
	RuleID uint32
}

// Access selects which opens a file rule applies to.
type Access uint8

// Access bits; zero means both.
const (
	AccessRead  Access = 1
	AccessWrite Access = 2 // FMODE_WRITE, O_TRUNC or O_APPEND
	AccessAll   Access = AccessRead | AccessWrite
)

// PathRule judges opens by the path the kernel resolved (bpf_d_path of the
// opened file, relative to the opening task's root).
type PathRule struct {
	// Path is absolute, at most 251 bytes.
	Path string
	// Prefix matches every path that starts with Path byte for byte
	// ("/etc/sudoers" covers /etc/sudoers.d/x). A Path ending in "/" also
	// matches the directory itself. False: exactly Path; an exact rule
	// also matches the file's inode (as it is when the rules are set), so
	// hard links to it are judged the same; that file only, not a later
	// one given its inode number (enforce.FileID).
	Prefix bool
	// Access is what the rule judges; the other access inherits from the
	// longest enclosing prefix rule. Zero means both.
	Access Access
	// Decision for the matched access.
	Decision
}

// FSRule judges every open on a filesystem type, by superblock magic
// (unix.CGROUP2_SUPER_MAGIC, unix.SYSFS_MAGIC, unix.BPF_FS_MAGIC...).
type FSRule struct {
	Magic  uint64
	Access Access // zero: both
	Decision
}

// AnyDevice is a wildcard for DeviceRule.Major and Minor.
const AnyDevice = ^uint32(0)

// DeviceRule judges opens of device nodes by type and number (the node's
// i_rdev), wherever the node lives (/dev/mem is char 1:1; a copy made
// with mknod elsewhere is the same device).
type DeviceRule struct {
	Block        bool   // block device; false: character device
	Major, Minor uint32 // or AnyDevice
	Access       Access // zero: both
	Decision
}

// CapRule records or blocks the use of one capability (CAP_*), as
// checked by the capable LSM hook after the capability module granted it.
type CapRule struct {
	Cap int
	Decision
}

// ExecRule judges the files that supply code to a process, by the path
// the kernel resolved: the executable, a script's interpreter (each
// binary of an execve chain passes bprm_check_security), and files mapped
// executable (mmap_file, file_mprotect with PROT_EXEC: `ld.so /tmp/x`, a
// preloaded library). What a noexec mount means, per path.
type ExecRule struct {
	// Path is absolute, at most 251 bytes.
	Path string
	// Prefix matches every path starting with Path; false: exactly Path.
	Prefix bool
	Decision
}

// Rules are one sandbox's LSM rules. File tables are all consulted and the
// strictest match wins; when none of the sandbox's file tables match, the
// defaults (sandbox id 0) are consulted. Ops missing here fall back to the
// defaults, then to allow (block for OpAgentSignal and OpAgentPtrace).
type Rules struct {
	Ops     map[Op]Decision
	Paths   []PathRule
	FS      []FSRule
	Devices []DeviceRule
	Caps    []CapRule
	// Exec rules: the longest matching prefix decides; none: allowed.
	Exec []ExecRule
	// Sockets judge socket creation by family, type and protocol, for
	// every family (socket_create).
	Sockets []SocketRule
	// UnixPaths are the unix socket paths a connect or datagram send may
	// reach when Ops has OpUnixConnect: a path ending in "/" covers
	// everything below it, others exactly that path. Judged on the bound
	// path of the socket the kernel found (symlinks resolved).
	UnixPaths []string
	// NotifyPaths are where inotify and fanotify marks may go when Ops
	// has OpNotifyMark (the sandbox's workspaces): a path ending in "/"
	// covers everything below it, others exactly that path. Judged on the
	// path the kernel resolved for the mark.
	NotifyPaths []string
}

// AnySocket is a wildcard for SocketRule's Family, Type and Protocol.
const AnySocket = -1

// SocketRule judges socket(2) and socketpair(2) from a sandbox. Lookups go
// from the most specific pattern to the least: (family, type, protocol),
// (family, any, protocol), (family, type, any), (family, any, any), (any,
// type, any), like cgroupbpf.SocketRule, whose rules it can carry over
// to families cgroup/sock_create never sees (AF_PACKET, AF_NETLINK...).
type SocketRule struct {
	Family, Type, Protocol int // AF_*, SOCK_*, IPPROTO_*, or AnySocket
	Decision
}
