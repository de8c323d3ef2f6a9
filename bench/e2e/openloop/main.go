// Command openloop is the end-to-end benchmark's sandboxed workload: it
// opens and closes one file N times and prints how long that took. It must
// not link cilium/ebpf (whose init calls bpf(2), which the kill backstop
// answers with SIGKILL inside a sandbox).
//
// Usage: openloop PATH N
package main

import (
	"fmt"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: openloop PATH N")
		os.Exit(2)
	}
	n, err := strconv.Atoi(os.Args[2])
	if err != nil || n <= 0 {
		fmt.Fprintln(os.Stderr, "N: want a positive integer")
		os.Exit(2)
	}
	start := time.Now()
	for i := 0; i < n; i++ {
		fd, err := unix.Openat(unix.AT_FDCWD, os.Args[1], unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			fmt.Fprintln(os.Stderr, "open:", err)
			os.Exit(1)
		}
		unix.Close(fd)
	}
	fmt.Printf("opens=%d seconds=%.6f\n", n, time.Since(start).Seconds())
}
