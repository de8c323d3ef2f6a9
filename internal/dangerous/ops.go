// Package dangerous is the one list of dangerous system calls: every entry
// names the syscall, its number in the x86_64 and the i386 table (a 64-bit
// process reaches the i386 table with int 0x80), the policy group that
// decides it, and the LSM hook that refuses it before the fact: its own,
// or the capable or key_permission hook judging what the syscall asks for
// first while the task is in it. Entries no hook judges (AtEntry) are
// killed at their own entry points by fentry programs where BPF
// trampolines run, else by the kill backstop's host-wide sys_enter;
// seccomp refuses every entry under `watcher exec`.
//
// watcher exec's seccomp filter (internal/launch) and the kill backstop
// (internal/enforce/backstop) both read this list, so an entry added here
// is enforced by both; test/adversarial walks it on both paths.
//
// FixedMappings (lowmap.go) are the syscalls that place a mapping at an
// address of the caller's choosing: below vm.mmap_min_addr that is a use
// of CAP_SYS_RAWIO the capable hook never sees (the mmap_addr hook and
// watcher exec's seccomp filter judge it).
package dangerous

// Group names the policy setting that decides an entry.
type Group string

// Groups.
const (
	// GroupPtrace: operations.ptrace.
	GroupPtrace Group = "ptrace"
	// GroupMount: operations.mount.
	GroupMount Group = "mount"
	// GroupModule: operations.module (kernel code loading, kexec).
	GroupModule Group = "module"
	// GroupBPF: operations.bpf.
	GroupBPF Group = "bpf"
	// GroupIOUring: operations.io_uring.
	GroupIOUring Group = "io_uring"
	// GroupKernel: host-wide kernel state no sandboxed process needs
	// (perf, keyrings, userfaultfd, port I/O, accounting, swap, reboot,
	// file handles, personality). Refused whatever the policy says.
	GroupKernel Group = "kernel"
)

// None marks a syscall missing from one table.
const None = -1

// Op is one dangerous syscall.
type Op struct {
	// Name is the syscall's name (the x86_64 one where the tables differ).
	Name string
	// NR64 and NR32 are its numbers in the x86_64 and i386 tables (None
	// when the table lacks it).
	NR64, NR32 int
	// Group is the policy setting deciding it.
	Group Group
	// Hook is the BPF LSM hook that refuses it with EPERM ("" for none).
	// HookCapable and HookKeyPermission are judged while the task is in
	// this syscall (Caps, Hooks).
	Hook string
}

// Hooks judged while the task is in the entry's syscall (the number the
// kernel dispatched, read from the task's saved registers).
const (
	// HookCapable: the capable hook refuses the capabilities Caps lists,
	// which the syscall checks before it has any effect.
	HookCapable = "capable"
	// HookKeyPermission: every key or keyring the syscall touches asks
	// key_permission first; the keys it creates pass key_alloc.
	HookKeyPermission = "key_permission"
)

// syscallCaps are the capabilities each HookCapable entry asks for before
// any effect (6.1-6.18 sources): CAP_SYS_RAWIO (17) for iopl raising the
// level and ioperm turning ports on (lowering either needs none and stays
// allowed), CAP_SYS_PACCT (20) for acct, CAP_SYS_ADMIN (21) for swapon,
// swapoff and mount_setattr (may_mount), CAP_SYS_BOOT (22) for reboot,
// CAP_SYS_MODULE (16) for delete_module, CAP_DAC_READ_SEARCH (2) for
// open_by_handle_at (6.10+ also accepts CAP_SYS_ADMIN over the mount's
// namespace: both refused).
var syscallCaps = map[string][]int{
	"iopl": {17}, "ioperm": {17}, "acct": {20}, "swapon": {21}, "swapoff": {21},
	"mount_setattr": {21}, "reboot": {22}, "delete_module": {16}, "open_by_handle_at": {2, 21},
}

// Caps returns the capabilities a HookCapable entry is refused by.
func (o Op) Caps() []int { return syscallCaps[o.Name] }

// AtEntry reports whether no LSM hook judges the entry at all: where BPF
// trampolines run, an fentry program on the syscall's own entry points
// (EntryFuncs) kills the caller, as the backstop does, without putting
// every syscall of the host on the slow path. io_uring_setup is here
// too: its ring gets an inode the LSM can refuse on some kernels only
// (there the refusal is EPERM, elsewhere the caller is killed on return).
func (o Op) AtEntry() bool {
	return o.Hook == "" && (o.Group == GroupKernel || o.Group == GroupIOUring)
}

// entryFuncs replace the entry points where they are no attach target:
// Debian 6.1's BTF lists the name_to_handle_at wrappers twice; both call
// do_sys_name_to_handle before the handle is encoded.
var entryFuncs = map[string][]string{"name_to_handle_at": {"do_sys_name_to_handle"}}

// EntryFuncs are the kernel functions an AtEntry entry's fentry programs
// attach to: the x86_64 and the i386 entry points.
func (o Op) EntryFuncs() []string {
	if f, ok := entryFuncs[o.Name]; ok {
		return f
	}
	var out []string
	if o.NR64 != None {
		out = append(out, "__x64_sys_"+o.Name)
	}
	if o.NR32 != None {
		out = append(out, "__ia32_sys_"+o.Name)
	}
	return out
}

// Hooks lists the LSM hooks (or, for AtEntry entries, the fentry
// functions) that must all run for the entry to be enforced without the
// backstop.
func (o Op) Hooks() []string {
	switch {
	case o.AtEntry():
		return o.EntryFuncs()
	case o.Hook == HookKeyPermission:
		return []string{HookKeyPermission, "key_alloc"}
	case o.Hook != "":
		return []string{o.Hook}
	}
	return nil
}

// Ops is the list. Conditional checks (namespace flags of clone, unshare
// and setns; CLONE_FILES; signals aimed at the agent) are argument checks
// of their own and not listed here.
var Ops = []Op{
	{"ptrace", 101, 26, GroupPtrace, "ptrace_access_check"},
	{"process_vm_readv", 310, 347, GroupPtrace, "ptrace_access_check"},
	{"process_vm_writev", 311, 348, GroupPtrace, "ptrace_access_check"},
	{"pidfd_getfd", 438, 438, GroupPtrace, "ptrace_access_check"},

	{"mount", 165, 21, GroupMount, "sb_mount"},
	{"umount", None, 22, GroupMount, "sb_umount"},
	{"umount2", 166, 52, GroupMount, "sb_umount"},
	{"move_mount", 429, 429, GroupMount, "move_mount"},
	{"open_tree", 428, 428, GroupMount, "move_mount"},
	{"open_tree_attr", 467, 467, GroupMount, "move_mount"},
	{"fsopen", 430, 430, GroupMount, "fs_context_parse_param"},
	{"fsconfig", 431, 431, GroupMount, "fs_context_parse_param"},
	{"fsmount", 432, 432, GroupMount, "fs_context_parse_param"},
	{"fspick", 433, 433, GroupMount, "fs_context_parse_param"},
	{"mount_setattr", 442, 442, GroupMount, HookCapable},
	{"pivot_root", 155, 217, GroupMount, "sb_pivotroot"},
	{"chroot", 161, 61, GroupMount, "path_chroot"},

	{"init_module", 175, 128, GroupModule, "kernel_load_data"},
	{"finit_module", 313, 350, GroupModule, "kernel_read_file"},
	{"delete_module", 176, 129, GroupModule, HookCapable},
	{"kexec_load", 246, 283, GroupModule, "kernel_load_data"},
	{"kexec_file_load", 320, None, GroupModule, "kernel_read_file"},

	{"bpf", 321, 357, GroupBPF, "bpf"},

	{"io_uring_setup", 425, 425, GroupIOUring, ""},
	{"io_uring_enter", 426, 426, GroupIOUring, ""},
	{"io_uring_register", 427, 427, GroupIOUring, ""},

	{"perf_event_open", 298, 336, GroupKernel, "perf_event_open"},
	{"keyctl", 250, 288, GroupKernel, HookKeyPermission},
	{"add_key", 248, 286, GroupKernel, HookKeyPermission},
	{"request_key", 249, 287, GroupKernel, HookKeyPermission},
	{"userfaultfd", 323, 374, GroupKernel, "inode_init_security_anon"},
	{"iopl", 172, 110, GroupKernel, HookCapable},
	{"ioperm", 173, 101, GroupKernel, HookCapable},
	{"acct", 163, 51, GroupKernel, HookCapable},
	{"swapon", 167, 87, GroupKernel, HookCapable},
	{"swapoff", 168, 115, GroupKernel, HookCapable},
	{"reboot", 169, 88, GroupKernel, HookCapable},
	{"personality", 135, 136, GroupKernel, ""},
	{"open_by_handle_at", 304, 342, GroupKernel, HookCapable},
	{"name_to_handle_at", 303, 341, GroupKernel, ""},
}

// ByGroup returns the entries of g, in list order.
func ByGroup(g Group) []Op {
	var out []Op
	for _, o := range Ops {
		if o.Group == g {
			out = append(out, o)
		}
	}
	return out
}

// Names returns the entries' names in list order.
func Names(ops []Op) []string {
	out := make([]string, 0, len(ops))
	for _, o := range ops {
		out = append(out, o.Name)
	}
	return out
}

// Lookup returns the entry called name.
func Lookup(name string) (Op, bool) {
	for _, o := range Ops {
		if o.Name == name {
			return o, true
		}
	}
	return Op{}, false
}
