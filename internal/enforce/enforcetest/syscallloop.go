package enforcetest

import (
	"fmt"
	"os"
	"strconv"
	"testing"

	"github.com/watcherhq/watcher/internal/testkit/syscallbench"
)

const loopMode = "syscall-loop"

// SyscallLoop runs the syscall loop of the benchmarks (syscallbench.Loop,
// iters times on /etc/passwd) in a child of the test binary placed in
// cgPath ("" for the test's own cgroup) and returns its ns/op. The child
// runs the helper test testName, whose body is SyscallLoopChild.
func SyscallLoop(t testing.TB, cgPath, testName string, iters int) syscallbench.Result {
	t.Helper()
	out, err := SelfCommand(t, cgPath, testName, loopMode, fmt.Sprintf("WATCHER_LOOP_ITERS=%d", iters)).Output()
	if err != nil {
		t.Fatalf("syscall loop: %v", err)
	}
	res, err := syscallbench.Parse(out)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// SyscallLoopChild is the body of SyscallLoop's helper test: in the child
// it runs the loop, prints the result and exits; in a normal test run it
// skips.
func SyscallLoopChild(t *testing.T) {
	if os.Getenv("WATCHER_TEST_HELPER") != loopMode {
		t.Skip("helper process of a syscall-loop measurement")
	}
	iters, _ := strconv.Atoi(os.Getenv("WATCHER_LOOP_ITERS"))
	res, err := syscallbench.Loop(iters, "/etc/passwd")
	if err == nil {
		err = syscallbench.Write(os.Stdout, res)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(0)
}
