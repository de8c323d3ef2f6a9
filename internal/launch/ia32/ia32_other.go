//go:build !amd64

package ia32

import "syscall"

// Syscall is unavailable off amd64.
func Syscall(nr, a1, a2, a3 uintptr) int32 { return -int32(syscall.ENOSYS) }

// Syscall6 is unavailable off amd64.
func Syscall6(nr, a1, a2, a3, a4, a5, a6 uintptr) int32 { return -int32(syscall.ENOSYS) }

// Supported reports whether this build can make i386 syscalls.
const Supported = false
