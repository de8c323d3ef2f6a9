// Command loop is the measured workload of bench/syscall: it runs
// openat+close, stat and getpid N times each on a file and prints ns/op
// (syscallbench.Loop and its result line). Usage: loop N FILE
package main

import (
	"fmt"
	"os"

	"github.com/watcherhq/watcher/internal/testkit/syscallbench"
)

func main() {
	var iters int
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: loop N FILE")
		os.Exit(2)
	}
	fmt.Sscan(os.Args[1], &iters)
	res, err := syscallbench.Loop(iters, os.Args[2])
	if err == nil {
		err = syscallbench.Write(os.Stdout, res)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "loop:", err)
		os.Exit(1)
	}
}
