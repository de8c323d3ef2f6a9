package lsm

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// doSubtreeOp performs the own-subtree operations (issue 25) on op.PID or
// op.Path: processes, System V and mqueue objects, terminals, notify marks.
func doSubtreeOp(op opSpec) (string, bool) {
	switch op.Kind {
	case "sigio_owner":
		// F_SETOWN + O_ASYNC on a socket, then make it readable: the
		// kernel signals the owner (SIGCONT via F_SETSIG: harmless).
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return "ERR: socketpair: " + err.Error(), true
		}
		defer unix.Close(fds[0])
		defer unix.Close(fds[1])
		if _, err := unix.FcntlInt(uintptr(fds[0]), unix.F_SETOWN, op.PID); err != nil {
			return "ERR: F_SETOWN: " + err.Error(), true
		}
		if _, err := unix.FcntlInt(uintptr(fds[0]), unix.F_SETSIG, int(unix.SIGCONT)); err != nil {
			return "ERR: F_SETSIG: " + err.Error(), true
		}
		if _, err := unix.FcntlInt(uintptr(fds[0]), unix.F_SETFL, unix.O_ASYNC); err != nil {
			return "ERR: O_ASYNC: " + err.Error(), true
		}
		_, err = unix.Write(fds[1], []byte("x"))
		return errnoResult(err), true
	case "prlimit":
		// The target's own limit again: nothing changes when allowed.
		var old unix.Rlimit
		if err := unix.Prlimit(op.PID, unix.RLIMIT_NOFILE, nil, &old); err != nil {
			return "ERR: prlimit read: " + err.Error(), true
		}
		return errnoResult(unix.Prlimit(op.PID, unix.RLIMIT_NOFILE, &old, nil)), true
	case "setpriority":
		prio, err := unix.Getpriority(unix.PRIO_PROCESS, op.PID)
		if err != nil {
			return "ERR: getpriority: " + err.Error(), true
		}
		return errnoResult(unix.Setpriority(unix.PRIO_PROCESS, op.PID, 20-prio)), true
	case "setaffinity":
		var set unix.CPUSet
		if err := unix.SchedGetaffinity(op.PID, &set); err != nil {
			return "ERR: sched_getaffinity: " + err.Error(), true
		}
		return errnoResult(unix.SchedSetaffinity(op.PID, &set)), true
	case "ioprio":
		prio, _, e := unix.Syscall(unix.SYS_IOPRIO_GET, 1 /* IOPRIO_WHO_PROCESS */, uintptr(op.PID), 0)
		if e != 0 {
			return "ERR: ioprio_get: " + e.Error(), true
		}
		_, _, e = unix.Syscall(unix.SYS_IOPRIO_SET, 1, uintptr(op.PID), prio)
		return errnoResult(errOrNil(e)), true
	case "migrate_pages":
		// Node 0 to node 0: nothing moves when allowed.
		mask := uint64(1)
		_, _, e := unix.Syscall6(unix.SYS_MIGRATE_PAGES, uintptr(op.PID), 64, uintptr(unsafe.Pointer(&mask)), uintptr(unsafe.Pointer(&mask)), 0, 0)
		return errnoResult(errOrNil(e)), true
	case "readlink":
		_, err := os.Readlink(op.Path)
		return errnoResult(unwrapPath(err)), true
	case "read":
		_, err := os.ReadFile(op.Path)
		return errnoResult(unwrapPath(err)), true
	case "setns_pidfd":
		pidfd, err := unix.PidfdOpen(op.PID, 0)
		if err != nil {
			return "ERR: pidfd_open: " + err.Error(), true
		}
		defer unix.Close(pidfd)
		return errnoResult(unix.Setns(pidfd, unix.CLONE_NEWNS)), true
	case "own_children":
		return ownChildren(), true
	case "tiocsti", "tioclinux", "tiocgwinsz":
		return ttyOp(op.Kind), true
	case "inotify":
		fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
		if err != nil {
			return "ERR: inotify_init: " + err.Error(), true
		}
		defer unix.Close(fd)
		_, err = unix.InotifyAddWatch(fd, op.Path, unix.IN_OPEN|unix.IN_ACCESS)
		return errnoResult(err), true
	case "shmat":
		addr, err := shmat(int(op.Num))
		if err == nil {
			shmdt(addr)
		}
		return errnoResult(err), true
	case "shm_stat":
		var ds unix.SysvShmDesc
		_, err := unix.SysvShmCtl(int(op.Num), unix.IPC_STAT, &ds)
		return errnoResult(err), true
	case "shm_rmid":
		_, err := unix.SysvShmCtl(int(op.Num), unix.IPC_RMID, nil)
		return errnoResult(err), true
	case "mq_unlink":
		return errnoResult(mqUnlink(op.Path)), true
	case "shm_own":
		// A segment of its own, attached by this process and a child.
		id, err := unix.SysvShmGet(unix.IPC_PRIVATE, 4096, unix.IPC_CREAT|0o600)
		if err != nil {
			return "ERR: shmget: " + err.Error(), true
		}
		defer unix.SysvShmCtl(id, unix.IPC_RMID, nil)
		addr, err := shmat(id)
		if err != nil {
			return errnoResult(err), true
		}
		shmdt(addr)
		var ds unix.SysvShmDesc
		_, err = unix.SysvShmCtl(id, unix.IPC_STAT, &ds)
		return errnoResult(err), true
	case "mq_open":
		fd, err := mqOpen(op.Path, 0)
		if err == nil {
			unix.Close(fd)
		}
		return errnoResult(err), true
	case "mq_own":
		name := fmt.Sprintf("%s-%d", op.Path, os.Getpid())
		fd, err := mqOpen(name, unix.O_CREAT|unix.O_EXCL)
		if err != nil {
			return "ERR: create: " + errnoResult(err), true
		}
		unix.Close(fd)
		defer mqUnlink(name)
		fd, err = mqOpen(name, 0) // opened again: still its own
		if err == nil {
			unix.Close(fd)
		}
		return errnoResult(err), true
	}
	return "", false
}

func errOrNil(e syscall.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

// unwrapPath returns the errno inside an *os.PathError (or err).
func unwrapPath(err error) error {
	if pe, ok := err.(*os.PathError); ok {
		return pe.Err
	}
	if le, ok := err.(*os.LinkError); ok {
		return le.Err
	}
	return err
}

func shmat(id int) (uintptr, error) {
	addr, _, e := unix.Syscall(unix.SYS_SHMAT, uintptr(id), 0, 0)
	if e != 0 {
		return 0, e
	}
	return addr, nil
}

func shmdt(addr uintptr) { unix.Syscall(unix.SYS_SHMDT, addr, 0, 0) }

func mqOpen(name string, flags int) (int, error) {
	p, err := unix.BytePtrFromString(strings.TrimPrefix(name, "/"))
	if err != nil {
		return -1, err
	}
	fd, _, e := unix.Syscall6(unix.SYS_MQ_OPEN, uintptr(unsafe.Pointer(p)), uintptr(flags|unix.O_RDWR|unix.O_CLOEXEC), 0o600, 0, 0, 0)
	if e != 0 {
		return -1, e
	}
	return int(fd), nil
}

func mqUnlink(name string) error {
	p, err := unix.BytePtrFromString(strings.TrimPrefix(name, "/"))
	if err != nil {
		return err
	}
	_, _, e := unix.Syscall(unix.SYS_MQ_UNLINK, uintptr(unsafe.Pointer(p)), 0, 0)
	return errOrNil(e)
}

// ownChildren does to a child of its own what the other-process rule
// refuses for processes outside: signal it, set its limit and priority,
// then kill it. The first failure is the result.
func ownChildren() string {
	cmd := exec.Command(os.Args[0], "-test.run=^TestLSMSleeper$")
	cmd.Env = append(os.Environ(), "WATCHER_TEST_HELPER=sleep")
	if err := cmd.Start(); err != nil {
		return "ERR: start child: " + err.Error()
	}
	pid := cmd.Process.Pid
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	for _, step := range []struct {
		what string
		op   opSpec
	}{
		{"sigcont", opSpec{Kind: "kill", PID: pid, Num: uint64(unix.SIGCONT)}},
		{"prlimit", opSpec{Kind: "prlimit", PID: pid}},
		{"prlimit self", opSpec{Kind: "prlimit", PID: 0}},
		{"setpriority", opSpec{Kind: "setpriority", PID: pid}},
		{"setaffinity", opSpec{Kind: "setaffinity", PID: pid}},
		{"environ", opSpec{Kind: "read", Path: fmt.Sprintf("/proc/%d/environ", pid)}},
	} {
		if res := doOp(step.op); res != "OK" {
			return step.what + ": " + res
		}
	}
	return errnoResult(unix.Kill(pid, unix.SIGKILL))
}

// ttyOp opens a new pseudo-terminal and makes one ioctl on its slave.
func ttyOp(kind string) string {
	ptmx, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "SKIP: /dev/ptmx: " + err.Error()
	}
	defer unix.Close(ptmx)
	if err := unix.IoctlSetPointerInt(ptmx, unix.TIOCSPTLCK, 0); err != nil {
		return "ERR: unlockpt: " + err.Error()
	}
	n, err := unix.IoctlGetInt(ptmx, unix.TIOCGPTN)
	if err != nil {
		return "ERR: ptsname: " + err.Error()
	}
	pts, err := unix.Open(fmt.Sprintf("/dev/pts/%d", n), unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "ERR: open pts: " + err.Error()
	}
	defer unix.Close(pts)
	switch kind {
	case "tiocsti":
		c := byte('x')
		_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(pts), unix.TIOCSTI, uintptr(unsafe.Pointer(&c)))
		return errnoResult(errOrNil(e))
	case "tioclinux":
		sub := byte(2) // TIOCL_SETSEL: a paste selection
		_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(pts), unix.TIOCLINUX, uintptr(unsafe.Pointer(&sub)))
		return errnoResult(errOrNil(e))
	}
	_, err = unix.IoctlGetWinsize(pts, unix.TIOCGWINSZ)
	return errnoResult(err)
}
