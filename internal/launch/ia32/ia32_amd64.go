package ia32

// Syscall makes i386 syscall nr with three arguments through int 0x80 and
// returns the kernel's result (a negative errno on failure).
func Syscall(nr, a1, a2, a3 uintptr) int32 {
	return int32(syscall3(nr, a1, a2, a3))
}

func syscall3(nr, a1, a2, a3 uintptr) uintptr

// Syscall6 is Syscall with six arguments (the sixth in ebp: mmap2's page
// offset).
func Syscall6(nr, a1, a2, a3, a4, a5, a6 uintptr) int32 {
	return int32(syscall6(nr, a1, a2, a3, a4, a5, a6))
}

func syscall6(nr, a1, a2, a3, a4, a5, a6 uintptr) uintptr
