package ia32

import "syscall"

func errnoError(e int32) error { return syscall.Errno(e) }
