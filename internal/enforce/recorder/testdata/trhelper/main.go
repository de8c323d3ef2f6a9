// Command trhelper generates syscalls for the trace tests and benchmarks:
// trhelper getpid N | init_module | finit_module | deny SECRET PROG [ia32].
package main

import (
	"fmt"
	"os"
	"strconv"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/launch/ia32"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: trhelper getpid N | init_module | finit_module | deny SECRET PROG [ia32]")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "getpid":
		n, _ := strconv.Atoi(os.Args[2])
		for i := 0; i < n; i++ {
			unix.RawSyscall(unix.SYS_GETPID, 0, 0, 0)
		}
	case "init_module":
		_, _, e := unix.Syscall(unix.SYS_INIT_MODULE, 0, 0, 0)
		fmt.Println("init_module:", e)
	case "finit_module":
		f, err := os.Open("/proc/self/exe")
		if err != nil {
			fmt.Println(err)
			os.Exit(1)
		}
		fmt.Println("finit_module:", unix.FinitModule(int(f.Fd()), "", 0))
	case "deny":
		deny(os.Args[2], os.Args[3], len(os.Args) > 4 && os.Args[4] == "ia32")
	default:
		os.Exit(2)
	}
}

func cstr(s string) uintptr {
	p, _ := unix.BytePtrFromString(s)
	return uintptr(unsafe.Pointer(p))
}

// deny makes operations the launcher's seccomp filter and Landlock ruleset
// refuse, printing name=errno for each, with arguments that change nothing
// where they are allowed. The last one is refused by the kernel itself,
// after dropping root: seccomp allows it. With32 adds an i386 ptrace
// through int 0x80: the test asks for it where the kernel runs 32-bit
// calls (elsewhere int 0x80 faults; in here the seccomp filter would
// answer a probe of the helper's own).
func deny(secret, prog string, with32 bool) {
	report := func(name string, e syscall.Errno) { fmt.Printf("%s=%d\n", name, int(e)) }
	_, _, e := unix.Syscall6(unix.SYS_MOUNT, cstr("none"), cstr("/nonexistent-watcher"), cstr("tmpfs"), 0, 0, 0)
	report("mount", e)
	_, _, e = unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_PEEKDATA, uintptr(os.Getppid()), 0, 0, 0, 0)
	report("ptrace", e)
	if with32 {
		// i386 ptrace (26) through int 0x80.
		report("ia32_ptrace", syscall.Errno(-ia32.Syscall(26, unix.PTRACE_PEEKDATA, uintptr(os.Getppid()), 0)))
	}
	fd, _, e := unix.Syscall(unix.SYS_SOCKET, unix.AF_PACKET, unix.SOCK_RAW, 0)
	if e == 0 {
		unix.Close(int(fd))
	}
	report("socket_packet", e)
	cwd := unix.AT_FDCWD
	fd, _, e = unix.Syscall6(unix.SYS_OPENAT, uintptr(cwd), cstr(secret), unix.O_RDONLY, 0, 0, 0)
	if e == 0 {
		unix.Close(int(fd))
	}
	report("open", e)
	_, _, e = unix.Syscall(unix.SYS_EXECVE, cstr(prog), uintptr(unsafe.Pointer(&[2]uintptr{cstr(prog), 0})), uintptr(unsafe.Pointer(&[1]uintptr{0})))
	report("execve", e)
	if err := syscall.Setuid(65534); err != nil {
		fmt.Println("setuid:", err)
		return
	}
	fd, _, e = unix.Syscall(unix.SYS_SOCKET, unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP)
	if e == 0 {
		unix.Close(int(fd))
	}
	report("socket_raw_unprivileged", e)
}
