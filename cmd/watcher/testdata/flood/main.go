// Command flood is a sandboxed workload of the end-to-end tests: it repeats
// one cheap operation N times as fast as it can and prints how often each
// outcome happened. It must not link cilium/ebpf (whose init calls bpf(2),
// which the kill backstop answers with SIGKILL inside a sandbox).
//
// Usage:
//
//	flood connect ADDR:PORT N   connect one TCP socket N times (refused: EPERM)
//	flood open PATH N           open and close PATH N times (routine events)
package main

import (
	"fmt"
	"net/netip"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: flood connect ADDR:PORT N | flood open PATH N")
		os.Exit(2)
	}
	n, err := strconv.Atoi(os.Args[3])
	if err != nil || n <= 0 {
		fmt.Fprintln(os.Stderr, "N: want a positive integer")
		os.Exit(2)
	}
	var eperm, ok, other int
	switch os.Args[1] {
	case "connect":
		ap, err := netip.ParseAddrPort(os.Args[2])
		if err != nil || !ap.Addr().Is4() {
			fmt.Fprintln(os.Stderr, "ADDR:PORT: want an IPv4 address and port")
			os.Exit(2)
		}
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			fmt.Fprintln(os.Stderr, "socket:", err)
			os.Exit(1)
		}
		sa := &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}
		for range n {
			switch err := unix.Connect(fd, sa); err {
			case unix.EPERM:
				eperm++
			case nil:
				ok++
				unix.Close(fd)
				if fd, err = unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0); err != nil {
					fmt.Fprintln(os.Stderr, "socket:", err)
					os.Exit(1)
				}
			default:
				other++
			}
		}
	case "open":
		for range n {
			fd, err := unix.Openat(unix.AT_FDCWD, os.Args[2], unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				other++
				continue
			}
			ok++
			unix.Close(fd)
		}
	default:
		fmt.Fprintln(os.Stderr, "unknown operation", os.Args[1])
		os.Exit(2)
	}
	fmt.Printf("%s pid=%d eperm=%d ok=%d other=%d\n", os.Args[1], os.Getpid(), eperm, ok, other)
}
