// Package ia32 enters the kernel through the i386 syscall table (int
// 0x80) from a 64-bit process. Tests use it (the seccomp, LSM and
// adversarial suites) to check that rules written for the native table
// also stop the other ABI.
package ia32
