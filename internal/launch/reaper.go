package launch

import (
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/limits"
)

// envReaper names the leaf cgroup a reaper guards (see startReaper).
const envReaper = "WATCHER_LAUNCH_REAPER"

// reaperArg0 is the reaper's argv[0], for ps.
const reaperArg0 = "watcher-launch-reaper"

// reaperFD is the read end of the pipe only the launcher writes to.
const reaperFD = 3

// reaperKillWait bounds how long a reaper tries to empty a leaf.
const reaperKillWait = time.Minute

// initCalled is set by Init: only a binary that calls it can be a reaper.
var initCalled bool

// startReaper starts the leaf's reaper: the launcher's binary again, in
// a session of its own (signals to the caller's process group do not
// reach it) and outside the leaf, waiting for end of file on a pipe of
// which only the launcher holds the write end. When the launcher goes
// away without removing the leaf (SIGKILL, a crash), the reaper kills
// what is left in it, frozen or not, and removes it and its v1 twins:
// else the command would run on unsupervised, or stay frozen for good
// and keep the caller's pipes open. The returned function, called once
// the launcher removed the leaf, closes the pipe; the reaper then finds
// no leaf and exits. The reaper is this process's own binary: a process
// that did not call Init gets none (its binary would not act as one), and
// neither that nor a reaper that cannot start is an error.
func startReaper(leaf string) (stop func()) {
	if !initCalled {
		return func() {}
	}
	self, err := os.Executable()
	if err != nil {
		return func() {}
	}
	r, w, err := os.Pipe()
	if err != nil {
		return func() {}
	}
	cmd := exec.Command(self)
	cmd.Args = []string{reaperArg0}
	var env []string
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, envSpec+"=") && !strings.HasPrefix(e, envReaper+"=") {
			env = append(env, e)
		}
	}
	cmd.Env = append(env, envReaper+"="+leaf)
	cmd.Dir = "/" // holds no workspace mount busy
	cmd.ExtraFiles = []*os.File{r}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	r.Close()
	if err != nil {
		w.Close()
		return func() {}
	}
	return func() {
		w.Close()
		go cmd.Wait()
	}
}

// reap is the reaper's body (Init): wait for the launcher to go, then
// clean up what it left. It never returns.
func reap(leaf string) {
	// Only the pipe ends the wait: not the caller's ^C, nor a hangup.
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGPIPE)
	var b [1]byte
	for {
		n, err := unix.Read(reaperFD, b[:])
		if n == 0 || (err != nil && err != unix.EINTR) {
			break
		}
	}
	if _, err := os.Stat(leaf); err != nil {
		os.Exit(0) // the launcher removed it
	}
	code := 0
	if err := cgroupfs.KillWait(leaf, reaperKillWait); err != nil {
		code = 1
	}
	if err := limits.RemoveTree(leaf); err != nil { // with its v1 twins (hybrid hosts)
		code = 1
	}
	os.Exit(code)
}
