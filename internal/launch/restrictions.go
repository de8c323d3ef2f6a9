// Package launch runs a command in a fresh leaf cgroup of a sandbox under
// a seccomp filter and a Landlock ruleset that the command and every
// descendant inherit and cannot lift: the second enforcement layer of
// `watcher exec`, for commands watcher starts itself.
//
// Go cannot run code between fork and exec, so the launcher re-executes the
// current binary (or Config.Executable) with the serialized restrictions in
// an environment variable. In that child, Init (called first thing in
// main, and in TestMain of tests) sets no_new_privs, enforces the Landlock
// ruleset and the seccomp filters on its thread and reports what it applied
// on a pipe, so the verdict says what was in force, not what was asked for.
// The child starts outside the sandbox, because the binary's package
// initialisers run before Init (cilium/ebpf calls bpf() there, which the
// kill backstop would punish); once the report arrives the launcher moves
// it into a fresh leaf cgroup of the sandbox and lets it exec the target,
// which is therefore confined from its first instruction.
package launch

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/policy"
)

// Restrictions are what the child applies before exec.
type Restrictions struct {
	// Seccomp selects the syscalls refused with EPERM.
	Seccomp SeccompPolicy `json:"seccomp"`
	// Files is the Landlock file access policy; nil applies no Landlock
	// file ruleset.
	Files *FileRules `json:"files,omitempty"`
	// Capabilities, when set, are the only capabilities the command
	// holds, in every set (bounding, permitted, effective, inheritable;
	// ambient is cleared): GrantedCapabilities of its sandbox. Nil leaves
	// the launcher's own.
	Capabilities *CapSet `json:"capabilities,omitempty"`
	// NoIPCScope turns off Landlock's IPC scoping (ABI 6), which is on
	// by default where the kernel has it, with or without Files: signals
	// to, and abstract unix socket connections with, processes outside
	// the command's Landlock domain are refused. Record mode turns it
	// off (nothing is refused there).
	NoIPCScope bool `json:"no_ipc_scope,omitempty"`
}

// SeccompPolicy selects the syscalls the filter refuses. The fixed part is
// always refused: every entry of internal/dangerous (ptrace and its kin,
// the mount family, module loading, kexec, bpf, perf_event_open, keyrings,
// userfaultfd, port I/O, acct, swap, reboot, personality, file handles),
// io_uring unless AllowIOUring.
type SeccompPolicy struct {
	// AllowIOUring leaves io_uring_setup/enter/register usable. io_uring
	// operations bypass per-syscall checks, so they are refused by
	// default.
	AllowIOUring bool `json:"allow_io_uring,omitempty"`
	// AllowedNamespaces are the CLONE_NEW* flags the command may use with
	// clone, unshare and setns. Every other namespace flag is refused;
	// clone3 (whose flags seccomp cannot read) then fails with ENOSYS so
	// libc falls back to clone. setns with nstype 0 (any type) is refused
	// unless every namespace is allowed.
	AllowedNamespaces uint64 `json:"allowed_namespaces,omitempty"`
	// DeniedSocketFamilies are address families socket(2) refuses
	// entirely (default: AF_PACKET, AF_VSOCK).
	DeniedSocketFamilies []int `json:"denied_socket_families,omitempty"`
	// DeniedNetlinkProtocols are the netlink protocols socket(2) refuses
	// (default: every one except NETLINK_ROUTE and NETLINK_SOCK_DIAG).
	DeniedNetlinkProtocols []int `json:"denied_netlink_protocols,omitempty"`
	// DenyLowMappings refuses mappings placed below vm.mmap_min_addr
	// (read at launch): mmap with MAP_FIXED(_NOREPLACE), mremap with
	// MREMAP_FIXED and shmat at such an address (dangerous.FixedMappings).
	// Set when the sandbox blocks CAP_SYS_RAWIO, which the kernel asks
	// there without the capable hook. The i386 table is refused whole.
	// Not covered: an executable whose ELF segments load below the
	// minimum (the kernel maps them inside execve).
	DenyLowMappings bool `json:"deny_low_mappings,omitempty"`
}

// AllNamespaces are the CLONE_NEW* flags.
const AllNamespaces uint64 = unix.CLONE_NEWNS | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC |
	unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET | unix.CLONE_NEWCGROUP | unix.CLONE_NEWTIME

// DefaultSeccomp refuses every namespace, io_uring, packet and vsock
// sockets and netlink other than routing and socket diagnostics.
func DefaultSeccomp() SeccompPolicy {
	p := SeccompPolicy{DeniedSocketFamilies: []int{unix.AF_PACKET, unix.AF_VSOCK}}
	for proto := 0; proto < 32; proto++ {
		if proto != unix.NETLINK_ROUTE && proto != unix.NETLINK_SOCK_DIAG {
			p.DeniedNetlinkProtocols = append(p.DeniedNetlinkProtocols, proto)
		}
	}
	return p
}

// FileRules is the Landlock policy: read-only paths, read-write paths and
// nothing else. A path may be a directory (the rule covers what is below
// it) or a file.
type FileRules struct {
	// ReadOnly paths may be read and executed.
	ReadOnly []string `json:"read_only,omitempty"`
	// ReadWrite paths may be read, written, created, removed and
	// executed (the workspace).
	ReadWrite []string `json:"read_write,omitempty"`
	// Devices are device files the command may read, write and ioctl
	// (terminals, /dev/null).
	Devices []string `json:"devices,omitempty"`
	// IgnoreMissing skips listed paths that do not exist instead of
	// failing (for defaults meant for many hosts).
	IgnoreMissing bool `json:"ignore_missing,omitempty"`

	// Derive plans the ruleset from the policy's rules below (PlanFiles):
	// reads and execs allowed wherever no rule blocks them, writes
	// wherever no rule blocks them (a blocking write rule on "/" confines
	// writes to what the allow rules name). ReadOnly, ReadWrite and
	// Devices are granted in addition.
	Derive bool `json:"derive,omitempty"`
	// Files are the sandbox's file rules (policy.DecideFile semantics).
	Files []policy.FileRule `json:"files,omitempty"`
	// Exec are the sandbox's exec rules; ExecDefault applies where none
	// matches ("" is allow).
	Exec        []policy.FileRule `json:"exec,omitempty"`
	ExecDefault policy.Action     `json:"exec_default,omitempty"`
}

// DefaultFileRules grants read-only access to the system's programs and
// libraries, the few files under /etc that programs read to start
// (not /etc/shadow, /etc/sudoers, SSH keys), non-process /proc entries, the
// launched process's own /proc/self and /proc/sys (read only), the usual
// devices, and read-write access to the workspace directories.
func DefaultFileRules(workspace ...string) FileRules {
	return FileRules{
		ReadOnly: []string{
			"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt",
			"/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/ld.so.preload",
			"/etc/passwd", "/etc/group", "/etc/nsswitch.conf", "/etc/hosts", "/etc/host.conf",
			"/etc/resolv.conf", "/etc/gai.conf", "/etc/localtime", "/etc/timezone",
			"/etc/ssl", "/etc/ca-certificates", "/etc/pki", "/etc/alternatives",
			"/etc/os-release", "/etc/mime.types", "/etc/magic", "/etc/terminfo", "/etc/inputrc",
			"/etc/bash.bashrc", "/etc/profile", "/etc/profile.d", "/etc/environment",
			"/etc/python3", "/etc/gitconfig", "/etc/locale.alias", "/etc/default/locale",
			"/proc/self", "/proc/sys", "/proc/meminfo", "/proc/cpuinfo", "/proc/stat",
			"/proc/loadavg", "/proc/uptime", "/proc/version", "/proc/filesystems",
			"/sys/devices/system/cpu",
		},
		ReadWrite: workspace,
		Devices: []string{
			"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom",
			"/dev/tty", "/dev/ptmx", "/dev/pts",
		},
		IgnoreMissing: true,
	}
}

// Applied is what the child actually put in force before exec.
type Applied struct {
	// NoNewPrivs is true once PR_SET_NO_NEW_PRIVS is set.
	NoNewPrivs bool `json:"no_new_privs"`
	// LandlockABI is the kernel's Landlock ABI version (0: none).
	LandlockABI int `json:"landlock_abi"`
	// Landlock describes the enforced ruleset, empty when none.
	Landlock string `json:"landlock,omitempty"`
	// LandlockRules counts the paths granted.
	LandlockRules int `json:"landlock_rules"`
	// LandlockNotes say where the derived ruleset grants more than the
	// policy (left to the kernel hooks) or cannot grant what it allows.
	LandlockNotes []string `json:"landlock_notes,omitempty"`
	// SeccompDenied lists the syscalls the filter refuses (some only for
	// certain arguments).
	SeccompDenied []string `json:"seccomp_denied"`
	// ArchGuard is true when syscalls of other ABIs (i386 int 0x80) are
	// refused by a second filter.
	ArchGuard bool `json:"arch_guard"`
	// MetaNotify lists the metadata syscalls (chmod, chown, xattrs,
	// times) the child hands to the launcher's supervisor; MetaNotifyFD
	// is the listener's number in the child until it execs.
	MetaNotify   []string `json:"meta_notify,omitempty"`
	MetaNotifyFD int      `json:"meta_notify_fd,omitempty"`
	// Scoped lists the Landlock IPC scopes in force (signal,
	// abstract_unix_socket); empty when none.
	Scoped []string `json:"scoped,omitempty"`
	// CapsReduced is true when the capability sets were reduced;
	// Capabilities is then what the command holds.
	CapsReduced  bool   `json:"caps_reduced"`
	Capabilities CapSet `json:"capabilities"`
	// Namespaces are the command's own namespaces (mnt, pid, uts, ipc).
	Namespaces []string `json:"namespaces,omitempty"`
	// Error is set when the child could not apply the restrictions.
	Error string `json:"error,omitempty"`
}

// Summary is a short description for verdict lines.
func (a Applied) Summary() string {
	ll := "landlock=off"
	if a.Landlock != "" {
		ll = fmt.Sprintf("landlock=abi%d/%d-paths", a.LandlockABI, a.LandlockRules)
	}
	scope := "off"
	if len(a.Scoped) > 0 {
		scope = strings.Join(a.Scoped, ",")
	}
	caps := "kept"
	if a.CapsReduced {
		caps = strconv.Itoa(a.Capabilities.Count())
	}
	ns := "none"
	if len(a.Namespaces) > 0 {
		ns = strings.Join(a.Namespaces, ",")
	}
	meta := ""
	if len(a.MetaNotify) > 0 {
		meta = " metadata=supervised"
	}
	return fmt.Sprintf("seccomp=%d-syscalls %s%s scope=%s caps=%s ns=%s nnp=%t", len(a.SeccompDenied), ll, meta, scope, caps, ns, a.NoNewPrivs)
}

// absPaths cleans the rule paths; relative paths are relative to dir.
func absPaths(dir string, paths []string) []string {
	out := make([]string, 0, len(paths))
	for _, p := range paths {
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		out = append(out, filepath.Clean(p))
	}
	return out
}

// Validate checks that the rules name usable paths.
func (r *FileRules) Validate() error {
	if r == nil {
		return nil
	}
	for _, p := range append(append(append([]string{}, r.ReadOnly...), r.ReadWrite...), r.Devices...) {
		if p == "" {
			return fmt.Errorf("file rules: empty path")
		}
		if _, err := os.Stat(p); err != nil && !r.IgnoreMissing {
			return fmt.Errorf("file rules: %w", err)
		}
	}
	return nil
}
