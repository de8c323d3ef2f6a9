package lsm

import (
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// doSyscallOp runs the dangerous-list syscalls judged in their own
// context (TestSyscallsJudgedInTheirContext). Arguments reach the
// kernel's first check (the capability, the key permission) and are
// harmless beyond it: missing paths and names, descriptor -1, reboot's
// magic wrong, iopl and ioperm granting ports nobody uses.
func doSyscallOp(op opSpec) (string, bool) {
	missing, _ := unix.BytePtrFromString("/nonexistent-watcher-lsm")
	raw := func(nr uintptr, a ...uintptr) string {
		var v [6]uintptr
		copy(v[:], a)
		_, _, e := unix.Syscall6(nr, v[0], v[1], v[2], v[3], v[4], v[5])
		if e != 0 {
			return errnoResult(e)
		}
		return "OK"
	}
	p := uintptr(unsafe.Pointer(missing))
	switch op.Kind {
	case "iopl":
		return raw(unix.SYS_IOPL, uintptr(op.Num)), true
	case "ioperm":
		return raw(unix.SYS_IOPERM, 0x80, 1, uintptr(op.Num)), true
	case "acct":
		return raw(unix.SYS_ACCT, p), true
	case "swapon":
		return raw(unix.SYS_SWAPON, p, 0), true
	case "swapoff":
		return raw(unix.SYS_SWAPOFF, p), true
	case "reboot":
		return raw(unix.SYS_REBOOT, 0, 0, 0, 0), true // bad magic: EINVAL after the capability
	case "open_by_handle_at":
		h := make([]byte, 128)
		*(*uint32)(unsafe.Pointer(&h[0])) = 8 // handle_bytes
		return raw(unix.SYS_OPEN_BY_HANDLE_AT, ^uintptr(0), uintptr(unsafe.Pointer(&h[0])), unix.O_RDONLY), true
	case "delete_module":
		name, _ := unix.BytePtrFromString("watcher_no_such_module")
		return raw(unix.SYS_DELETE_MODULE, uintptr(unsafe.Pointer(name)), unix.O_NONBLOCK), true
	case "mount_setattr":
		var attr [32]byte // MOUNT_ATTR_SIZE_VER0, nothing set
		empty, _ := unix.BytePtrFromString("")
		return raw(unix.SYS_MOUNT_SETATTR, ^uintptr(0), uintptr(unsafe.Pointer(empty)), unix.AT_EMPTY_PATH,
			uintptr(unsafe.Pointer(&attr[0])), 32), true
	case "keyctl_user_keyring":
		_, err := unix.KeyctlInt(unix.KEYCTL_GET_KEYRING_ID, unix.KEY_SPEC_USER_KEYRING, 1, 0, 0)
		return errnoResult(err), true
	case "add_key_user":
		_, err := unix.AddKey("user", "watcher-lsm-test", []byte("x"), unix.KEY_SPEC_USER_KEYRING)
		return errnoResult(err), true
	case "request_key":
		_, err := unix.RequestKey("user", "watcher-lsm-test-none", "", 0)
		return errnoResult(err), true
	case "sethostname_same":
		// CAP_SYS_ADMIN in another syscall: not judged by these checks.
		name, err := os.Hostname()
		if err != nil {
			return "ERR: " + err.Error(), true
		}
		return errnoResult(unix.Sethostname([]byte(name))), true
	case "personality_query":
		return raw(unix.SYS_PERSONALITY, 0xffffffff), true
	case "name_to_handle_at":
		h := make([]byte, 128)
		*(*uint32)(unsafe.Pointer(&h[0])) = 120
		var mnt int32
		root, _ := unix.BytePtrFromString("/")
		cwd := unix.AT_FDCWD
		return raw(unix.SYS_NAME_TO_HANDLE_AT, uintptr(cwd), uintptr(unsafe.Pointer(root)),
			uintptr(unsafe.Pointer(&h[0])), uintptr(unsafe.Pointer(&mnt)), 0), true
	}
	return "", false
}
