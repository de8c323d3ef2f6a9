//go:build !amd64

package ia32

import (
	"errors"
	"syscall"
)

// Syscall is unavailable off amd64.
func Syscall(nr, a1, a2, a3 uintptr) int32 { return -int32(syscall.ENOSYS) }

// Syscall6 is unavailable off amd64.
func Syscall6(nr, a1, a2, a3, a4, a5, a6 uintptr) int32 { return -int32(syscall.ENOSYS) }

// Available reports that i386 system calls cannot be made from this
// build.
func Available() error { return ErrUnavailable }

// ErrUnavailable is what Available returns where 32-bit system calls
// cannot be made.
var ErrUnavailable = errors.New("32-bit system calls: not available on this architecture")
