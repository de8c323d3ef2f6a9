package launch

// The supervisor of the metadata filter (metanotify.go), running in the
// launcher. For each notification it resolves the file the call names,
// in the command's own view (its root and cwd, its mount namespace), the
// way the kernel would; refuses with EPERM when that file is not
// writable under the policy; and otherwise performs the change itself on
// the file it resolved, after checking what the command's credentials
// allow. The command's memory is read once, before the decision; the
// kernel never re-reads it (no SECCOMP_USER_NOTIF_FLAG_CONTINUE), so a
// thread rewriting the path after the check changes nothing.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/policy"
)

// seccomp_notif, seccomp_data and seccomp_notif_resp (linux/seccomp.h).
type seccompData struct {
	Nr   int32
	Arch uint32
	IP   uint64
	Args [6]uint64
}

type seccompNotif struct {
	ID    uint64
	PID   uint32
	Flags uint32
	Data  seccompData
}

type seccompNotifResp struct {
	ID    uint64
	Val   int64
	Error int32
	Flags uint32
}

// SECCOMP_IOCTL_NOTIF_ID_VALID: _IOW('!', 2, __u64).
const seccompIoctlNotifIDValid = 0x40082102

// xattrMax bounds a value the supervisor copies (the kernel's XATTR_SIZE_MAX).
const xattrMax = 64 << 10

// MetaRefusal is one metadata change the supervisor refused.
type MetaRefusal struct {
	Syscall string `json:"syscall"`
	Path    string `json:"path"`
	Reason  string `json:"reason"`
	// Process is comm[pid] of the caller (pid in the launcher's view).
	Process string `json:"process,omitempty"`
}

// metaSupervisor answers one command tree's notifications.
type metaSupervisor struct {
	fd       int
	names    map[int]string
	writable func(path string) bool

	mu       sync.Mutex
	refused  []MetaRefusal
	handled  int
	dropped  int // refusals past maxMetaRefusals, counted only
	stopR    *os.File
	stopW    *os.File
	finished chan struct{}
}

const maxMetaRefusals = 64

// writableFunc is the policy's answer to "may the command write here?":
// the same rules the Landlock plan grants writes by.
func writableFunc(r *FileRules) func(string) bool {
	files := canonicalRules(r.Files)
	var roots []string
	for _, p := range append(append([]string{}, r.ReadWrite...), r.Devices...) {
		roots = append(roots, canonicalPath(filepath.Clean(p)))
	}
	return func(path string) bool {
		for _, root := range roots {
			if path == root || strings.HasPrefix(path, strings.TrimSuffix(root, "/")+"/") {
				return true
			}
		}
		if !r.Derive {
			return false
		}
		rule, ok := policy.DecideFile(files, path, true)
		return !ok || (rule.Action != policy.ActionBlock && rule.Action != policy.ActionKill)
	}
}

// startMetaSupervisor serves listener fd until stop is called.
func startMetaSupervisor(fd int, writable func(string) bool) (*metaSupervisor, error) {
	names, _, err := metaNR()
	if err != nil {
		return nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("metadata supervisor: %w", err)
	}
	s := &metaSupervisor{fd: fd, names: names, writable: writable, stopR: r, stopW: w, finished: make(chan struct{})}
	go s.loop()
	return s, nil
}

// stop ends the loop and closes the listener: calls still pending (the
// command is gone, or killed) fail with ENOSYS.
func (s *metaSupervisor) stop() (refused []MetaRefusal, handled, dropped int) {
	s.stopW.Close()
	<-s.finished
	unix.Close(s.fd)
	s.stopR.Close()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refused, s.handled, s.dropped
}

func (s *metaSupervisor) loop() {
	defer close(s.finished)
	fds := []unix.PollFd{{Fd: int32(s.fd), Events: unix.POLLIN}, {Fd: int32(s.stopR.Fd()), Events: unix.POLLIN}}
	for {
		fds[0].Revents, fds[1].Revents = 0, 0
		if _, err := unix.Poll(fds, -1); err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return
		}
		if fds[1].Revents != 0 {
			return
		}
		if fds[0].Revents&(unix.POLLHUP|unix.POLLERR) != 0 && fds[0].Revents&unix.POLLIN == 0 {
			return // no task uses the filter any more
		}
		var req seccompNotif
		if err := ioctlPtr(s.fd, unix.SECCOMP_IOCTL_NOTIF_RECV, unsafe.Pointer(&req)); err != nil {
			if errors.Is(err, unix.EINTR) || errors.Is(err, unix.ENOENT) {
				continue // the caller died or was interrupted
			}
			return
		}
		val, errno := s.handle(&req)
		resp := seccompNotifResp{ID: req.ID, Val: val, Error: -int32(errno)}
		if errno == 0 {
			resp.Error = 0
		}
		ioctlPtr(s.fd, unix.SECCOMP_IOCTL_NOTIF_SEND, unsafe.Pointer(&resp))
	}
}

func ioctlPtr(fd int, req uint, arg unsafe.Pointer) error {
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(req), uintptr(arg))
	if e != 0 {
		return e
	}
	return nil
}

// handle decides one call; it returns the syscall's result or an errno.
func (s *metaSupervisor) handle(req *seccompNotif) (int64, unix.Errno) {
	name := s.names[int(req.Data.Nr)]
	c, err := s.decode(req, name)
	if err != nil {
		var errno unix.Errno
		if errors.As(err, &errno) {
			return -1, errno
		}
		return -1, unix.EPERM
	}
	defer c.close()
	// Everything read from the command's memory and /proc is stale if the
	// caller is gone (its PID could be reused): check before acting.
	id := req.ID
	if ioctlPtr(s.fd, seccompIoctlNotifIDValid, unsafe.Pointer(&id)) != nil {
		return -1, unix.ENOENT
	}
	s.mu.Lock()
	s.handled++
	s.mu.Unlock()
	if !s.writable(c.path) {
		reason := "not writable under the policy (outside the writable paths)"
		if c.kind == metaNotify {
			reason = "a file-notification mark outside the sandbox's writable paths"
		}
		s.refuse(req.PID, name, c.path, reason)
		return -1, unix.EPERM
	}
	if err := c.perform(); err != nil {
		var errno unix.Errno
		if errors.As(err, &errno) {
			if errno == unix.EPERM {
				s.refuse(req.PID, name, c.path, err.Error())
			}
			return -1, errno
		}
		return -1, unix.EPERM
	}
	return c.result, 0
}

func (s *metaSupervisor) refuse(tid uint32, name, path, reason string) {
	comm, _ := os.ReadFile("/proc/" + strconv.Itoa(int(tid)) + "/comm")
	proc := strings.TrimSpace(string(comm)) + "[" + strconv.Itoa(int(tid)) + "]"
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.refused) >= maxMetaRefusals {
		s.dropped++
		return
	}
	s.refused = append(s.refused, MetaRefusal{Syscall: name, Path: path, Reason: reason, Process: proc})
}

// caller is what the supervisor knows of the calling thread.
type caller struct {
	tid, tgid     int
	fsuid, fsgid  uint32
	capEff        uint64
	supplementary []uint32
}

func (c *caller) has(capNum int) bool { return c.capEff&(1<<uint(capNum)) != 0 }

func (c *caller) inGroup(gid uint32) bool {
	if c.fsgid == gid {
		return true
	}
	for _, g := range c.supplementary {
		if g == gid {
			return true
		}
	}
	return false
}

// readCaller reads the calling thread's filesystem ids and capabilities.
func readCaller(tid int) (caller, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(tid) + "/status")
	if err != nil {
		return caller{}, err
	}
	c := caller{tid: tid}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(line, ":")
		f := strings.Fields(v)
		switch k {
		case "Tgid":
			if len(f) == 1 {
				c.tgid, _ = strconv.Atoi(f[0])
			}
		case "Uid":
			if len(f) == 4 {
				n, _ := strconv.ParseUint(f[3], 10, 32)
				c.fsuid = uint32(n)
			}
		case "Gid":
			if len(f) == 4 {
				n, _ := strconv.ParseUint(f[3], 10, 32)
				c.fsgid = uint32(n)
			}
		case "Groups":
			for _, g := range f {
				n, _ := strconv.ParseUint(g, 10, 32)
				c.supplementary = append(c.supplementary, uint32(n))
			}
		case "CapEff":
			if len(f) == 1 {
				c.capEff, _ = strconv.ParseUint(f[0], 16, 64)
			}
		}
	}
	return c, nil
}

// superviseMeta takes the child's listener (pidfd_getfd: the launcher is
// its parent and outside every sandbox) and starts the supervisor.
func superviseMeta(pid, childFD int, files *FileRules) (*metaSupervisor, error) {
	if files == nil {
		return nil, fmt.Errorf("metadata supervisor: no file rules")
	}
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, fmt.Errorf("metadata supervisor: pidfd_open: %w", err)
	}
	defer unix.Close(pidfd)
	fd, err := unix.PidfdGetfd(pidfd, childFD, 0)
	if err != nil {
		return nil, fmt.Errorf("metadata supervisor: pidfd_getfd: %w", err)
	}
	unix.CloseOnExec(fd)
	s, err := startMetaSupervisor(fd, writableFunc(files))
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	return s, nil
}
