package lsm

import (
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// doChangeOp runs the operations that change files without opening them
// for write, and the operations judged as a whole (see pathops_test.go).
func doChangeOp(op opSpec) string {
	switch op.Kind {
	case "truncate":
		return errnoResult(unix.Truncate(op.Path, 0))
	case "ftruncate_fd3":
		// fd 3: a writable descriptor opened outside the sandbox.
		return errnoResult(unix.Ftruncate(3, 0))
	case "open_rdonly_trunc":
		fd, err := unix.Open(op.Path, unix.O_RDONLY|unix.O_TRUNC|unix.O_CLOEXEC, 0)
		if err == nil {
			unix.Close(fd)
		}
		return errnoResult(err)
	case "open_rdonly_creat":
		fd, err := unix.Open(op.Path, unix.O_RDONLY|unix.O_CREAT|unix.O_CLOEXEC, 0o644)
		if err == nil {
			unix.Close(fd)
		}
		return errnoResult(err)
	case "mkfifo":
		return errnoResult(unix.Mknod(op.Path, unix.S_IFIFO|0o600, 0))
	case "mkdir":
		return errnoResult(unix.Mkdir(op.Path, 0o755))
	case "unlink":
		return errnoResult(unix.Unlink(op.Path))
	case "rmdir":
		return errnoResult(unix.Rmdir(op.Path))
	case "symlink":
		return errnoResult(unix.Symlink("target", op.Path))
	case "link":
		return errnoResult(unix.Link(op.Path, op.Path2))
	case "rename":
		return errnoResult(unix.Rename(op.Path, op.Path2))
	case "chmod_setuid":
		return errnoResult(unix.Chmod(op.Path, 0o4755))
	case "chown":
		return errnoResult(unix.Chown(op.Path, 1, 1))
	case "setxattr":
		return errnoResult(unix.Setxattr(op.Path, "trusted.watcher", []byte("x"), 0))
	case "removexattr":
		return errnoResult(unix.Removexattr(op.Path, "trusted.watcher"))
	case "clone_into_cgroup":
		// op.Path: a cgroup directory; the child exits at once.
		cg, err := unix.Open(op.Path, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return "ERR: open cgroup: " + err.Error()
		}
		defer unix.Close(cg)
		// Go starts the child with clone3(CLONE_INTO_CGROUP).
		return startChild(&syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: cg})
	case "fork":
		return startChild(&syscall.SysProcAttr{})
	case "perf_event_open":
		attr := unix.PerfEventAttr{Type: unix.PERF_TYPE_SOFTWARE, Config: unix.PERF_COUNT_SW_CPU_CLOCK, Bits: unix.PerfBitDisabled}
		attr.Size = uint32(unsafe.Sizeof(attr))
		fd, err := unix.PerfEventOpen(&attr, 0, -1, -1, unix.PERF_FLAG_FD_CLOEXEC)
		if err == nil {
			unix.Close(fd)
		}
		return errnoResult(err)
	case "userns":
		return startChild(&syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWUSER})
	case "userfaultfd":
		fd, _, e := unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC, 0, 0)
		if e != 0 {
			return errnoResult(e)
		}
		unix.Close(int(fd))
		return "OK"
	case "io_uring_setup":
		var p uringParams
		fd, _, e := unix.Syscall(unix.SYS_IO_URING_SETUP, 1, uintptr(unsafe.Pointer(&p)), 0)
		if e != 0 {
			return errnoResult(e)
		}
		unix.Close(int(fd))
		return "OK"
	case "add_key":
		_, err := unix.AddKey("user", "watcher-test", []byte("x"), unix.KEY_SPEC_PROCESS_KEYRING)
		return errnoResult(err)
	case "sigio":
		return sigio(op.PID)
	case "kill_pgrp":
		// SIGCONT to a whole process group (op.PID is its id).
		return errnoResult(unix.Kill(-op.PID, unix.SIGCONT))
	case "kill_all":
		// kill(-1): every process the caller may signal; EPERM for some
		// targets does not fail the call.
		return errnoResult(unix.Kill(-1, unix.SIGCONT))
	case "exec":
		// A binary (this test binary, running no test) or a script.
		return errnoResult(exec.Command(op.Path, "-test.run=^$").Run())
	case "mmap_exec", "mmap_read", "mprotect_exec":
		return mapFile(op.Kind, op.Path)
	case "utimes":
		return errnoResult(unix.UtimesNano(op.Path, []unix.Timespec{{Sec: 1}, {Sec: 1}}))
	case "memfd_exec", "memfd_mmap_exec":
		return memfdCode(op.Kind, op.Path)
	}
	if res, ok := doSyscallOp(op); ok {
		return res
	}
	return "ERR: unknown op kind " + op.Kind
}

// startChild starts this binary (doing nothing) with attr; a refusal at
// clone time comes back from Start.
func startChild(attr *syscall.SysProcAttr) string {
	cmd := newSelf()
	cmd.SysProcAttr = attr
	err := cmd.Start()
	if err == nil {
		cmd.Wait()
	}
	return errnoResult(err)
}

// newSelf is this test binary running no test: a child that exits at once.
func newSelf() *exec.Cmd { return exec.Command(os.Args[0], "-test.run=^$") }

// sigio makes the kernel send SIGIO to owner (0: this process) through
// a pipe with O_ASYNC and F_SETOWN. For this process it reports whether
// the signal arrived; for another it reports the setup's errors only.
func sigio(owner int) string {
	self := owner == 0
	if self {
		owner = os.Getpid()
	}
	ch := make(chan os.Signal, 1)
	if self {
		signal.Notify(ch, syscall.SIGIO)
		defer signal.Stop(ch)
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return "ERR: pipe: " + err.Error()
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	if _, err := unix.FcntlInt(uintptr(p[0]), unix.F_SETOWN, owner); err != nil {
		return errnoResult(err)
	}
	fl, err := unix.FcntlInt(uintptr(p[0]), unix.F_GETFL, 0)
	if err != nil {
		return "ERR: F_GETFL: " + err.Error()
	}
	if _, err := unix.FcntlInt(uintptr(p[0]), unix.F_SETFL, fl|unix.O_ASYNC); err != nil {
		return errnoResult(err)
	}
	if _, err := unix.Write(p[1], []byte("x")); err != nil {
		return errnoResult(err)
	}
	if !self {
		return "OK"
	}
	select {
	case <-ch:
		return "OK"
	case <-time.After(10 * time.Second):
		return "ERR: no SIGIO"
	}
}

// mapFile maps path's first page as the dynamic loader would
// (mmap_exec), readable only (mmap_read), or readable and then
// mprotect(PROT_EXEC) (mprotect_exec).
func mapFile(kind, path string) string {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "ERR: open: " + err.Error()
	}
	defer unix.Close(fd)
	prot := unix.PROT_READ
	if kind == "mmap_exec" {
		prot |= unix.PROT_EXEC
	}
	b, err := unix.Mmap(fd, 0, os.Getpagesize(), prot, unix.MAP_PRIVATE)
	if err != nil {
		return errnoResult(err)
	}
	defer unix.Munmap(b)
	if kind == "mprotect_exec" {
		return errnoResult(unix.Mprotect(b, unix.PROT_READ|unix.PROT_EXEC))
	}
	return "OK"
}

// memfdCode copies the program at path into a memfd (a file with no name)
// and runs it through /proc/self/fd (memfd_exec, which is execveat of the
// descriptor), or maps it executable as a loader would (memfd_mmap_exec).
func memfdCode(kind, path string) string {
	fd, err := unix.MemfdCreate("payload", unix.MFD_CLOEXEC)
	if err != nil {
		return "ERR: memfd_create: " + err.Error()
	}
	defer unix.Close(fd)
	b, err := os.ReadFile(path)
	if err != nil {
		return "ERR: " + err.Error()
	}
	if _, err := unix.Write(fd, b); err != nil {
		return "ERR: write: " + err.Error()
	}
	if kind == "memfd_mmap_exec" {
		m, err := unix.Mmap(fd, 0, os.Getpagesize(), unix.PROT_READ|unix.PROT_EXEC, unix.MAP_PRIVATE)
		if err != nil {
			return errnoResult(err)
		}
		unix.Munmap(m)
		return "OK"
	}
	// Not CLOEXEC for the child: exec.Command passes only 0-2, so run the
	// descriptor through ExtraFiles as fd 3.
	f := os.NewFile(uintptr(fd), "memfd")
	cmd := exec.Command("/proc/self/fd/3", "-test.run=^$")
	cmd.ExtraFiles = []*os.File{f}
	err = cmd.Run()
	return errnoResult(err)
}
