package adversarial

import (
	"encoding/binary"
	"fmt"
	"os"
	"strings"
	"syscall"
	"unsafe"

	"github.com/watcherhq/watcher/internal/dangerous"
)

// probeArgs are arguments for each entry of the dangerous list that make
// the call harmless even where nothing refuses it (a missing path, a bad
// descriptor, an invalid command), so walking the list cannot hurt the
// host. s is a path that does not exist, z a zeroed buffer.
func probeArgs(name string, s, z uintptr) [5]uintptr {
	bad := ^uintptr(0) // fd -1
	switch name {
	case "ptrace":
		return [5]uintptr{0x4206 /* PTRACE_SEIZE */, 0x7ffffff0 /* no such pid */}
	case "pidfd_getfd", "fsconfig", "fsmount", "finit_module", "kexec_file_load", "setns":
		return [5]uintptr{bad}
	case "mount":
		return [5]uintptr{s, s, s}
	case "umount", "umount2", "chroot", "acct", "swapon", "swapoff", "fsopen":
		return [5]uintptr{s}
	case "pivot_root":
		return [5]uintptr{s, s}
	case "move_mount":
		return [5]uintptr{bad, s, bad, s}
	case "open_tree", "open_tree_attr", "fspick", "mount_setattr", "name_to_handle_at":
		return [5]uintptr{bad, s}
	case "init_module":
		return [5]uintptr{z, 0, z}
	case "delete_module":
		return [5]uintptr{s, 0x800 /* O_NONBLOCK */}
	case "kexec_load":
		return [5]uintptr{0, 0, 0, 0x7fff0000 /* bad arch flags */}
	case "bpf":
		return [5]uintptr{0x7fff}
	case "io_uring_setup":
		return [5]uintptr{0, z}
	case "io_uring_enter", "io_uring_register", "open_by_handle_at":
		return [5]uintptr{bad}
	case "perf_event_open":
		return [5]uintptr{0, 0, bad, bad, 0x7fff0000}
	case "keyctl":
		return [5]uintptr{0x7fff}
	case "add_key", "request_key":
		return [5]uintptr{s, s}
	case "userfaultfd":
		return [5]uintptr{0x7fff0000}
	case "iopl":
		// Level 3 reaches the CAP_SYS_RAWIO check (a lower level needs
		// none); where nothing refuses it the probe uses no port.
		return [5]uintptr{3}
	case "ioperm":
		return [5]uintptr{0x80, 1, 1} // likewise: port 0x80 on, never used
	case "reboot":
		return [5]uintptr{0, 0, 0} // bad magic: EINVAL
	case "personality":
		return [5]uintptr{0xffffffff} // query only
	}
	return [5]uintptr{}
}

// dangerousCall is the attacker side of the list walk: technique
// "syscall64:NAME" or "syscall32:NAME".
func dangerousCall(_ attackEnv, tech string) error {
	abi, name, _ := strings.Cut(tech, ":")
	op, ok := dangerous.Lookup(name)
	if !ok {
		return fmt.Errorf("not in the list: %s", name)
	}
	m := newMem32()
	s := m.str("/nonexistent-watcher-adversarial")
	z, _ := m.buf(512)
	a := probeArgs(name, s, z)
	if name == "process_vm_readv" || name == "process_vm_writev" {
		a = vmProbeArgs(m, abi == "syscall32")
	}
	var r int64
	switch abi {
	case "syscall64":
		if op.NR64 == dangerous.None {
			return fmt.Errorf("no x86_64 number: %w", errNotApplicable)
		}
		r1, _, e := syscall.Syscall6(uintptr(op.NR64), a[0], a[1], a[2], a[3], a[4], 0)
		if e != 0 {
			return e
		}
		r = int64(r1)
	case "syscall32":
		if op.NR32 == dangerous.None {
			return fmt.Errorf("no i386 number: %w", errNotApplicable)
		}
		v := Int80(uintptr(op.NR32), a[0], a[1], a[2], a[3], a[4])
		if v < 0 {
			return syscall.Errno(-v)
		}
		r = int64(v)
	default:
		return fmt.Errorf("bad technique %q", tech)
	}
	fmt.Printf("RETURNED %d\n", r)
	_ = unsafe.Pointer(nil)
	return nil
}

// vmProbeArgs are process_vm_readv/writev arguments that reach the
// kernel's access check (mm_access calls the ptrace hook) yet cannot
// change anything where nothing refuses them: one byte to or from an
// unmapped address of the parent (the test or the launcher), which fails
// with EFAULT after the check. A zero-length or missing iovec would
// return 0 before the check and prove nothing.
func vmProbeArgs(m *mem32, compat bool) [5]uintptr {
	lp, local := m.buf(16)
	rp, remote := m.buf(16)
	bp, _ := m.buf(8)
	if compat { // struct compat_iovec: two u32
		binary.LittleEndian.PutUint32(local[0:], uint32(bp))
		binary.LittleEndian.PutUint32(local[4:], 1)
		binary.LittleEndian.PutUint32(remote[0:], 0x1000)
		binary.LittleEndian.PutUint32(remote[4:], 1)
	} else {
		binary.LittleEndian.PutUint64(local[0:], uint64(bp))
		binary.LittleEndian.PutUint64(local[8:], 1)
		binary.LittleEndian.PutUint64(remote[0:], 0x1000)
		binary.LittleEndian.PutUint64(remote[8:], 1)
	}
	return [5]uintptr{uintptr(os.Getppid()), lp, 1, rp, 1}
}
