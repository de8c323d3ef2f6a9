// Command loop is the measured workload of bench/syscall: it runs
// openat+close, stat and getpid N times each on a file and prints ns/op as
// JSON. Usage: loop N FILE
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

func main() {
	var iters int
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: loop N FILE")
		os.Exit(2)
	}
	fmt.Sscan(os.Args[1], &iters)
	loop(iters, os.Args[2])
}

// loop runs each op iters times and prints ns/op as JSON.
func loop(iters int, file string) {
	path, _ := unix.BytePtrFromString(file)
	p := uintptrOf(path)
	var st unix.Stat_t
	res := map[string]float64{}
	run := func(name string, f func()) {
		for i := 0; i < iters/10; i++ { // warm up
			f()
		}
		start := time.Now()
		for i := 0; i < iters; i++ {
			f()
		}
		res[name] = float64(time.Since(start).Nanoseconds()) / float64(iters)
	}
	run("openat+close", func() {
		fd, _, _ := unix.RawSyscall6(unix.SYS_OPENAT, atFDCWD, p, unix.O_RDONLY, 0, 0, 0)
		unix.RawSyscall(unix.SYS_CLOSE, fd, 0, 0)
	})
	run("stat", func() {
		unix.RawSyscall6(unix.SYS_NEWFSTATAT, atFDCWD, p, uintptrOf(&st), 0, 0, 0)
	})
	run("getpid", func() { unix.RawSyscall(unix.SYS_GETPID, 0, 0, 0) })
	json.NewEncoder(os.Stdout).Encode(res)
}

func uintptrOf[T any](p *T) uintptr { return uintptr(unsafe.Pointer(p)) }

var atFDCWD = uintptr(^uint64(99)) // AT_FDCWD (-100) as a syscall argument
