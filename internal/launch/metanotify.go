package launch

// Metadata changes Landlock has no right for: chmod, chown, extended
// attributes and timestamps. Landlock lets a confined command change the
// mode, owner, xattrs and times of any file it can reach, writable or not,
// and where no BPF LSM hook runs the kill backstop only kills after the
// change (and not at all on overlay filesystems). So the child installs a
// seccomp filter that hands these syscalls to the launcher (seccomp user
// notification), and the launcher's supervisor (metasuper.go) decides on
// the file the kernel resolves, refusing with EPERM before anything
// changes outside the writable paths, and performing the change itself on
// that very file inside them (never letting the kernel re-read the
// command's memory after the decision).

import (
	"fmt"
	"unsafe"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// metaSyscalls are the syscalls the supervisor judges. Names missing from
// this kernel's or the library's table are skipped (the arch guard and the
// kernel's ENOSYS cover them).
var metaSyscalls = []string{
	"chmod", "fchmod", "fchmodat", "fchmodat2",
	"chown", "fchown", "lchown", "fchownat",
	"setxattr", "lsetxattr", "fsetxattr", "removexattr", "lremovexattr", "fremovexattr",
	"setxattrat", "removexattrat",
	"utime", "utimes", "utimensat", "futimesat",
	// A file-notification mark tells when a file is opened, read or
	// written and the names made in a directory: the sandbox's own
	// subtree only (the writable paths). fanotify needs CAP_SYS_ADMIN,
	// which commands do not hold.
	"inotify_add_watch",
}

// metaNR maps this ABI's numbers of metaSyscalls to their names.
func metaNR() (map[int]string, []string, error) {
	native, err := arch.GetInfo("")
	if err != nil {
		return nil, nil, fmt.Errorf("seccomp: %w", err)
	}
	out := map[int]string{}
	var names []string
	for _, n := range metaSyscalls {
		if nr, ok := native.SyscallNames[n]; ok {
			out[nr] = n
			names = append(names, n)
		}
	}
	return out, names, nil
}

// installMetaNotify loads the notifying filter on the calling thread and
// returns its listener. The caller must close the listener before exec:
// a command holding it could answer its own notifications.
func installMetaNotify() (int, []string, error) {
	_, names, err := metaNR()
	if err != nil {
		return -1, nil, err
	}
	pol := seccomp.Policy{
		DefaultAction: seccomp.ActionAllow,
		Syscalls:      []seccomp.SyscallGroup{{Names: names, Action: seccomp.ActionUserNotify}},
	}
	insns, err := pol.Assemble()
	if err != nil {
		return -1, nil, fmt.Errorf("assemble metadata filter: %w", err)
	}
	raw, err := bpf.Assemble(insns)
	if err != nil {
		return -1, nil, fmt.Errorf("assemble metadata filter: %w", err)
	}
	filter := make([]unix.SockFilter, len(raw))
	for i, r := range raw {
		filter[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	fd, _, errno := unix.RawSyscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER,
		unix.SECCOMP_FILTER_FLAG_NEW_LISTENER, uintptr(unsafe.Pointer(&prog)))
	if errno != 0 {
		return -1, nil, fmt.Errorf("load metadata filter (seccomp user notification): %w", errno)
	}
	return int(fd), names, nil
}
