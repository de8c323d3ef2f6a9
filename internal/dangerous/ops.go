// Package dangerous is the one list of dangerous system calls: every entry
// names the syscall, its number in the x86_64 and the i386 table (a 64-bit
// process reaches the i386 table with int 0x80), the policy group that
// decides it, and the LSM hook that refuses it before the fact (empty when
// no hook does: then only seccomp under `watcher exec` refuses it, and the
// kill backstop stops it on every host).
//
// watcher exec's seccomp filter (internal/launch) and the kill backstop
// (internal/enforce/backstop) both read this list, so an entry added here
// is enforced by both; test/adversarial walks it on both paths.
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
	Hook string
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
	{"mount_setattr", 442, 442, GroupMount, ""},
	{"pivot_root", 155, 217, GroupMount, "sb_pivotroot"},
	{"chroot", 161, 61, GroupMount, "path_chroot"},

	{"init_module", 175, 128, GroupModule, "kernel_load_data"},
	{"finit_module", 313, 350, GroupModule, "kernel_read_file"},
	{"delete_module", 176, 129, GroupModule, ""},
	{"kexec_load", 246, 283, GroupModule, "kernel_load_data"},
	{"kexec_file_load", 320, None, GroupModule, "kernel_read_file"},

	{"bpf", 321, 357, GroupBPF, "bpf"},

	{"io_uring_setup", 425, 425, GroupIOUring, ""},
	{"io_uring_enter", 426, 426, GroupIOUring, ""},
	{"io_uring_register", 427, 427, GroupIOUring, ""},

	{"perf_event_open", 298, 336, GroupKernel, "perf_event_open"},
	{"keyctl", 250, 288, GroupKernel, ""},
	{"add_key", 248, 286, GroupKernel, ""},
	{"request_key", 249, 287, GroupKernel, ""},
	{"userfaultfd", 323, 374, GroupKernel, ""},
	{"iopl", 172, 110, GroupKernel, ""},
	{"ioperm", 173, 101, GroupKernel, ""},
	{"acct", 163, 51, GroupKernel, ""},
	{"swapon", 167, 87, GroupKernel, ""},
	{"swapoff", 168, 115, GroupKernel, ""},
	{"reboot", 169, 88, GroupKernel, ""},
	{"personality", 135, 136, GroupKernel, ""},
	{"open_by_handle_at", 304, 342, GroupKernel, ""},
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
