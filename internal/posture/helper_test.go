package posture

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/enforce/enforcetest"
)

// Helper processes: the test binary re-executed with POSTURE_HELPER set
// changes its own credentials in ways no command-line tool does (one
// thread only), prints "ready" and waits for stdin to close.
const helperEnv = "POSTURE_HELPER"

func init() {
	if os.Getenv(helperEnv) != "" {
		// Keep main on the main thread: the thread group leader is the
		// one /proc/PID/status describes.
		runtime.LockOSThread()
	}
}

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		if err := helper(mode); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			os.Exit(3)
		}
		fmt.Println("ready")
		bufio.NewReader(os.Stdin).ReadString('\n')
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func helper(mode string) error {
	// More threads than the runtime's own, parked in the kernel.
	for range 3 {
		go func() { runtime.LockOSThread(); unix.Pause() }()
	}
	switch mode {
	case "leader-drops-caps":
		// Only the calling thread (the leader) drops its capabilities.
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		return unix.Capset(&hdr, &data[0])
	case "seccomp-all-threads":
		return installAllowAll(unix.SECCOMP_FILTER_FLAG_TSYNC)
	case "seccomp-leader-only":
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			return err
		}
		return installAllowAll(0)
	}
	return fmt.Errorf("unknown mode %q", mode)
}

// installAllowAll installs a seccomp filter that allows everything (flags
// 0: the calling thread only; TSYNC: every thread, no_new_privs too).
func installAllowAll(flags uintptr) error {
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return err
	}
	insns := []unix.SockFilter{{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ALLOW}}
	prog := unix.SockFprog{Len: uint16(len(insns)), Filter: &insns[0]}
	if _, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, flags, uintptr(unsafe.Pointer(&prog))); e != 0 {
		return fmt.Errorf("seccomp: %w", e)
	}
	return nil
}

// started is a running test process in its own cgroup.
type started struct {
	cg  string // cgroup2 directory
	pid int
}

// start runs cmd in a fresh test cgroup, waits for it to be ready (a line
// on stdout for helpers, the exec of the final program for commands) and
// ends it at cleanup.
func start(t *testing.T, cmd *exec.Cmd, waitLine bool) started {
	t.Helper()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %v: %v", cmd.Args, err)
	}
	t.Cleanup(func() {
		stdin.Close()
		cmd.Process.Kill()
		cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || (waitLine && strings.TrimSpace(line) != "ready") {
		t.Fatalf("%v: %q %v", cmd.Args, line, err)
	}
	return started{pid: cmd.Process.Pid}
}

// inCgroup prepares a command placed in a fresh test cgroup.
func inCgroup(t *testing.T, name string, args ...string) (*exec.Cmd, string) {
	t.Helper()
	cg := enforcetest.Cgroup(t, "posture")
	return enforcetest.Command(t, cg, name, args...), cg
}

// helperCmd prepares a helper process in a fresh test cgroup.
func helperCmd(t *testing.T, mode string) (*exec.Cmd, string) {
	t.Helper()
	cmd, cg := inCgroup(t, os.Args[0])
	cmd.Env = append(os.Environ(), helperEnv+"="+mode)
	return cmd, cg
}
