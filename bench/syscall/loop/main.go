// Command loop is the measured workload of bench/syscall: it runs
// openat+close, stat and getpid N times each on a file and prints ns/op
// (syscallbench.Loop and its result line). Usage: loop N FILE [cpu]
//
// With "cpu" each operation is timed by the thread's CPU clock instead of
// the wall clock: time the loop spends preempted by other work on a
// loaded host does not count, the programs' run time (kernel time of the
// thread) does.
package main

import (
	"fmt"
	"os"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/testkit/syscallbench"
)

func main() {
	var iters int
	if len(os.Args) != 3 && !(len(os.Args) == 4 && os.Args[3] == "cpu") {
		fmt.Fprintln(os.Stderr, "usage: loop N FILE [cpu]")
		os.Exit(2)
	}
	fmt.Sscan(os.Args[1], &iters)
	var res syscallbench.Result
	var err error
	if len(os.Args) == 4 {
		res, err = cpuLoop(iters, os.Args[2])
	} else {
		res, err = syscallbench.Loop(iters, os.Args[2])
	}
	if err == nil {
		err = syscallbench.Write(os.Stdout, res)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "loop:", err)
		os.Exit(1)
	}
}

// cpuLoop is syscallbench.Loop timed by CLOCK_THREAD_CPUTIME_ID.
func cpuLoop(iters int, file string) (syscallbench.Result, error) {
	runtime.LockOSThread()
	path, err := unix.BytePtrFromString(file)
	if err != nil {
		return nil, err
	}
	p := uintptr(unsafe.Pointer(path))
	atFDCWD := uintptr(^uint64(99))
	var st unix.Stat_t
	res := syscallbench.Result{}
	run := func(name string, f func()) error {
		for i := 0; i < iters/10; i++ {
			f()
		}
		var t0, t1 unix.Timespec
		if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &t0); err != nil {
			return err
		}
		for i := 0; i < iters; i++ {
			f()
		}
		if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &t1); err != nil {
			return err
		}
		res[name] = float64(t1.Nano()-t0.Nano()) / float64(iters)
		return nil
	}
	for _, op := range []struct {
		name string
		f    func()
	}{
		{"openat+close", func() {
			fd, _, _ := unix.RawSyscall6(unix.SYS_OPENAT, atFDCWD, p, unix.O_RDONLY, 0, 0, 0)
			unix.RawSyscall(unix.SYS_CLOSE, fd, 0, 0)
		}},
		{"stat", func() {
			unix.RawSyscall6(unix.SYS_NEWFSTATAT, atFDCWD, p, uintptr(unsafe.Pointer(&st)), 0, 0, 0)
		}},
		{"getpid", func() { unix.RawSyscall(unix.SYS_GETPID, 0, 0, 0) }},
	} {
		if err := run(op.name, op.f); err != nil {
			return nil, err
		}
	}
	return res, nil
}
