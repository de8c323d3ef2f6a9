// Package adversarial holds the adversarial suite (see README.md); this
// file is the one piece outside the tests: an i386 system call through
// int 0x80 with five arguments, as a sandboxed attacker would make it.
package adversarial

func int80(nr, a1, a2, a3, a4, a5 uintptr) uintptr

// Int80 makes i386 syscall nr through int 0x80 and returns the kernel's
// result (a negative errno on failure). Pointers must be below 4 GiB.
func Int80(nr, a1, a2, a3, a4, a5 uintptr) int32 { return int32(int80(nr, a1, a2, a3, a4, a5)) }
