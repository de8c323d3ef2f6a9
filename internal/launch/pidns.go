package launch

// The command's own subtree: a PID namespace (host processes are not even
// visible), a UTS namespace and an IPC namespace, with a fresh /proc and
// /dev/mqueue in its own mount namespace. The re-executed launcher child
// is PID 1 of the namespace: it starts the command as PID 2, forwards the
// signals it is sent, reaps orphans and reports the command's status. The
// command itself must not be PID 1: the kernel drops signals PID 1 has no
// handler for, so a timeout's SIGTERM would be lost, and orphans would
// never be reaped.

import (
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// SubtreeNamespaces are the namespaces `watcher exec` gives every command:
// mounts (for /proc and /dev/mqueue of its own), PID, UTS (starting with
// the host's names) and System V IPC / POSIX message queues.
const SubtreeNamespaces uintptr = unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC

// subtreeMounts are made after Isolation.Mounts: a /proc showing only the
// PID namespace's processes, and the message queue file system of the
// IPC namespace (the host's /dev/mqueue would list, and unlink, the
// host's queues).
func subtreeMounts(ns uintptr) []Mount {
	var ms []Mount
	const flags = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	if ns&unix.CLONE_NEWPID != 0 && ns&unix.CLONE_NEWNS != 0 {
		ms = append(ms, Mount{Source: "proc", Target: "/proc", FSType: "proc", Flags: flags})
	}
	if ns&unix.CLONE_NEWIPC != 0 && ns&unix.CLONE_NEWNS != 0 {
		ms = append(ms, Mount{Source: "mqueue", Target: "/dev/mqueue", FSType: "mqueue", Flags: flags, IfExists: true})
	}
	return ms
}

// nsNames names the namespace flags, for the verdict.
func nsNames(ns uintptr) []string {
	var out []string
	for _, n := range []struct {
		flag uintptr
		name string
	}{{unix.CLONE_NEWNS, "mnt"}, {unix.CLONE_NEWPID, "pid"}, {unix.CLONE_NEWUTS, "uts"}, {unix.CLONE_NEWIPC, "ipc"},
		{unix.CLONE_NEWNET, "net"}, {unix.CLONE_NEWCGROUP, "cgroup"}, {unix.CLONE_NEWUSER, "user"}} {
		if ns&n.flag != 0 {
			out = append(out, n.name)
		}
	}
	return out
}

// commandStatus is what PID 1 reports on the report pipe once the command
// ended: PID 1 of a namespace cannot die of a signal sent to itself, so
// the launcher learns the command's status from this.
type commandStatus struct {
	Exited   bool `json:"exited"`
	ExitCode int  `json:"exit_code"`
	Signal   int  `json:"signal,omitempty"`
}

// forwarded are the signals PID 1 passes on to the command: those sent to
// it from the host (kill of the process the launcher started). The
// terminal's job-control signals (SIGINT, SIGQUIT, SIGTSTP, SIGTTIN,
// SIGTTOU, SIGWINCH) reach the command's process group directly and are
// not sent twice; the graded timeouts signal the command themselves.
var forwarded = []os.Signal{syscall.SIGTERM, syscall.SIGHUP, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGALRM}

var swallowed = []os.Signal{syscall.SIGINT, syscall.SIGQUIT, syscall.SIGTSTP, syscall.SIGTTIN, syscall.SIGTTOU, syscall.SIGWINCH}

// runAsInit starts the command from the calling (locked, restricted)
// thread, whose no_new_privs, Landlock domain, seccomp filters and
// capabilities it inherits, then forwards signals and reaps every child
// until the command ends; it writes the command's status to report and
// exits. It never returns.
func runAsInit(path string, args, env []string, report *os.File) {
	// Not dumpable: the command may not open /proc/1/mem or attach to
	// PID 1 (whose other threads the restrictions above do not cover)
	// without CAP_SYS_PTRACE. Before the fork, the command's image gets
	// its own flag at execve.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		fmt.Fprintf(os.Stderr, "watcher launch: %v\n", err)
		os.Exit(ExitRestrictFailed)
	}
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, append(append([]os.Signal{}, forwarded...), swallowed...)...)
	var mu sync.Mutex // the command's pid is not signalled once reaped
	mu.Lock()
	pid, err := syscall.ForkExec(path, args, &syscall.ProcAttr{Env: env, Files: []uintptr{0, 1, 2}})
	if err != nil {
		mu.Unlock()
		fmt.Fprintf(os.Stderr, "watcher launch: exec %s: %v\n", path, err)
		os.Exit(ExitExecFailed)
	}
	alive := true
	mu.Unlock()
	go func() {
		for s := range sigs {
			sig := s.(syscall.Signal)
			if isSwallowed(sig) {
				continue
			}
			mu.Lock()
			if alive {
				unix.Kill(pid, sig)
			}
			mu.Unlock()
		}
	}()
	var st commandStatus
	for {
		var ws unix.WaitStatus
		got, err := unix.Wait4(-1, &ws, 0, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			// No children left: the command is gone without a status.
			st = commandStatus{Exited: true, ExitCode: ExitExecFailed}
			break
		}
		if got != pid {
			continue // an orphan
		}
		mu.Lock()
		alive = false
		mu.Unlock()
		if ws.Signaled() {
			st = commandStatus{Signal: int(ws.Signal())}
		} else {
			st = commandStatus{Exited: true, ExitCode: ws.ExitStatus()}
		}
		break
	}
	json.NewEncoder(report).Encode(st)
	// Leaving kills what the command left in the namespace.
	os.Exit(0)
}

func isSwallowed(sig syscall.Signal) bool {
	for _, s := range swallowed {
		if s == sig {
			return true
		}
	}
	return false
}
