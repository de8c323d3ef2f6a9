// Package adversarial holds the adversarial suite (described in
// docs/concepts/adversarial.md); this file is the one piece
// outside the tests: an i386 system call through int 0x80 with five
// arguments, as a sandboxed attacker would make it.
package adversarial

import i386 "github.com/watcherhq/watcher/internal/launch/ia32"

// Int80 makes i386 syscall nr through int 0x80 (internal/launch/ia32's
// trampoline) and returns the kernel's result (a negative errno on
// failure). Pointers must be below 4 GiB. The sixth argument register
// (ebp) is 0: a six-argument call such as process_vm_readv gets flags 0,
// as the x86_64 probes pass them.
func Int80(nr, a1, a2, a3, a4, a5 uintptr) int32 { return i386.Syscall6(nr, a1, a2, a3, a4, a5, 0) }
