package ia32

// Syscall makes i386 syscall nr with three arguments through int 0x80 and
// returns the kernel's result (a negative errno on failure).
func Syscall(nr, a1, a2, a3 uintptr) int32 {
	return int32(syscall3(nr, a1, a2, a3))
}

func syscall3(nr, a1, a2, a3 uintptr) uintptr

// Supported reports whether this build can make i386 syscalls.
const Supported = true
