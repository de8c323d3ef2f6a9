// Command trhelper generates syscalls for the trace tests and benchmarks:
// trhelper getpid N | init_module | finit_module.
package main

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: trhelper getpid N | init_module | finit_module")
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
	default:
		os.Exit(2)
	}
}
