package adversarial

// The attacker's side: each technique runs in a re-executed copy of this
// test binary inside the sandbox (ADV_ROLE=attack), as a root process that
// has read watcher's source. A technique returns nil when it got what it
// was after, errRefused-wrapped errnos when the kernel said no, and
// errNotApplicable when this machine lacks what it needs (the test then
// reports the row and asserts nothing). The test judges the outcome itself
// from outside (files, mounts, cgroups, the agent's state); what the
// attacker prints is evidence, not the verdict.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Exit codes of the attacker role.
const (
	exitAchieved    = 0
	exitRefused     = 3
	exitFailed      = 4
	exitChildKilled = 5
	exitNA          = 6
)

var (
	errNotApplicable = errors.New("not applicable here")
	errChildKilled   = errors.New("child killed by SIGKILL")
)

// attackEnv is what the test tells the attacker (environment variables).
type attackEnv struct {
	ws, secretDir, tgt, scratch, outside string
	hostSock                             string
	agent                                int
}

func (e attackEnv) secret() string { return filepath.Join(e.secretDir, "key") }

func loadAttackEnv() attackEnv {
	agent, _ := strconv.Atoi(os.Getenv("ADV_AGENT"))
	return attackEnv{ws: os.Getenv("ADV_WS"), secretDir: os.Getenv("ADV_SECRET"), tgt: os.Getenv("ADV_TGT"),
		scratch: os.Getenv("ADV_SCRATCH"), outside: os.Getenv("ADV_OUTSIDE"), hostSock: os.Getenv("ADV_HOSTSOCK"), agent: agent}
}

// attackMain is the attacker role: join the sandbox leaf (when placed like
// a container runtime does), run one technique, report.
func attackMain() {
	if p := os.Getenv("ADV_JOIN"); p != "" {
		if err := os.WriteFile(p, []byte("0"), 0); err != nil {
			fmt.Printf("FAILED join %s: %v\n", p, err)
			os.Exit(exitFailed)
		}
	}
	fmt.Printf("PID %d\n", os.Getpid())
	name := os.Getenv("ADV_TECH")
	fn := attacks[name]
	if fn == nil && strings.HasPrefix(name, "syscall") {
		fn = dangerousCall
	}
	if fn == nil {
		fmt.Printf("FAILED unknown technique %q\n", name)
		os.Exit(exitFailed)
	}
	err := fn(loadAttackEnv(), name)
	var errno syscall.Errno
	switch {
	case err == nil:
		fmt.Println("ACHIEVED")
		os.Exit(exitAchieved)
	case errors.Is(err, errNotApplicable):
		fmt.Printf("NA %v\n", err)
		os.Exit(exitNA)
	case errors.Is(err, errChildKilled):
		fmt.Printf("CHILD-KILLED %v\n", err)
		os.Exit(exitChildKilled)
	case errors.As(err, &errno):
		fmt.Printf("REFUSED %v (%d)\n", err, int(errno))
		os.Exit(exitRefused)
	}
	fmt.Printf("FAILED %v\n", err)
	os.Exit(exitFailed)
}

// mem32 is memory below 4 GiB for i386 system call arguments.
type mem32 struct {
	b   []byte
	off int
}

func newMem32() *mem32 {
	b, err := unix.Mmap(-1, 0, 1<<16, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON|unix.MAP_32BIT)
	if err != nil {
		panic(err)
	}
	return &mem32{b: b}
}

func (m *mem32) str(s string) uintptr {
	p := uintptr(unsafe.Pointer(&m.b[m.off]))
	copy(m.b[m.off:], s)
	m.b[m.off+len(s)] = 0
	m.off += len(s) + 1
	return p
}

func (m *mem32) buf(n int) (uintptr, []byte) {
	p := uintptr(unsafe.Pointer(&m.b[m.off]))
	out := m.b[m.off : m.off+n]
	m.off += n
	return p, out
}

func errnoOf(r int32) error {
	if r < 0 {
		return syscall.Errno(-r)
	}
	return nil
}

// readAndPrint opens path for reading and prints what it holds.
func readAndPrint(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return unwrapErrno(err)
	}
	fmt.Printf("DATA %s\n", b)
	return nil
}

func unwrapErrno(err error) error {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno
	}
	return err
}

// runChild runs a program and maps its end to the attack's result.
func runChild(path string, args ...string) error {
	cmd := &exec.Cmd{Path: path, Args: args, Stdout: os.Stdout, Stderr: os.Stdout}
	err := cmd.Run()
	if cmd.ProcessState == nil { // the exec itself was refused
		return unwrapErrno(err)
	}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
		return errChildKilled
	}
	return unwrapErrno(err)
}

func copyFile(src, dst string, mode os.FileMode) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, mode)
}

type cloneArgs struct {
	Flags, Pidfd, ChildTID, ParentTID, ExitSignal, Stack, StackSize, TLS, SetTID, SetTIDSize, Cgroup uint64
}

var childOut [256]byte

// clone3Child clones with args; the child (a copy of this thread only) runs
// raw syscalls: it writes msg, reads fd secretFD when >= 0 and writes what
// it read, then exits. Returns the child's pid in the parent.
//
//go:nosplit
//go:norace
func clone3Child(args *cloneArgs, msg *byte, msgLen uintptr, path *byte) (uintptr, syscall.Errno) {
	r1, _, e := syscall.RawSyscall(unix.SYS_CLONE3, uintptr(unsafe.Pointer(args)), unsafe.Sizeof(*args), 0)
	if e != 0 || r1 != 0 {
		return r1, e
	}
	syscall.RawSyscall(unix.SYS_WRITE, 1, uintptr(unsafe.Pointer(msg)), msgLen)
	if path != nil {
		fd, _, e := syscall.RawSyscall6(unix.SYS_OPENAT, uintptr(0xffffffffffffff9c), uintptr(unsafe.Pointer(path)), 0, 0, 0, 0)
		if e == 0 {
			n, _, e := syscall.RawSyscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(&childOut[0])), uintptr(len(childOut)))
			if e == 0 {
				syscall.RawSyscall(unix.SYS_WRITE, 1, uintptr(unsafe.Pointer(&childOut[0])), n)
			}
		}
	}
	syscall.RawSyscall(unix.SYS_EXIT_GROUP, 0, 0, 0)
	return 0, 0
}

// kcmpChild clones sharing the file table when the kernel reads
// CLONE_FILES, and reports from the child whether it does (kcmp).
//
//go:nosplit
//go:norace
func kcmpChild(args *cloneArgs, report uintptr) (uintptr, syscall.Errno) {
	r1, _, e := syscall.RawSyscall(unix.SYS_CLONE3, uintptr(unsafe.Pointer(args)), unsafe.Sizeof(*args), 0)
	if e != 0 || r1 != 0 {
		return r1, e
	}
	self, _, _ := syscall.RawSyscall(unix.SYS_GETPID, 0, 0, 0)
	parent, _, _ := syscall.RawSyscall(unix.SYS_GETPPID, 0, 0, 0)
	r, _, _ := syscall.RawSyscall6(unix.SYS_KCMP, self, parent, 2 /* KCMP_FILES */, 0, 0, 0)
	if r == 0 {
		syscall.RawSyscall(unix.SYS_WRITE, report, uintptr(unsafe.Pointer(&childOut[0])), 1)
	}
	syscall.RawSyscall(unix.SYS_EXIT_GROUP, 0, 0, 0)
	return 0, 0
}

// cloneFilesChild clones with clone(2) CLONE_FILES; the child writes a
// byte to fd report and exits.
//
//go:nosplit
//go:norace
func cloneFilesChild(report uintptr) (uintptr, syscall.Errno) {
	r1, _, e := syscall.RawSyscall6(unix.SYS_CLONE, unix.CLONE_FILES|uintptr(unix.SIGCHLD), 0, 0, 0, 0, 0)
	if e != 0 || r1 != 0 {
		return r1, e
	}
	syscall.RawSyscall(unix.SYS_WRITE, report, uintptr(unsafe.Pointer(&childOut[0])), 1)
	syscall.RawSyscall(unix.SYS_EXIT_GROUP, 0, 0, 0)
	return 0, 0
}

// unixConnect connects to the stream socket at path and prints what the
// server says.
func unixConnect(path string) error {
	c, err := net.Dial("unix", path)
	if err != nil {
		return unwrapErrno(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b := make([]byte, 64)
	n, _ := c.Read(b)
	fmt.Printf("CONNECTED %s\n", b[:n])
	return nil
}

func cbytes(s string) *byte {
	b := append([]byte(s), 0)
	return &b[0]
}

var attacks = map[string]func(attackEnv, string) error{
	// --- class 1: every system call entry -----------------------------
	"ia32-open-read": func(e attackEnv, _ string) error {
		m := newMem32()
		fd := Int80(5, m.str(e.secret()), 0, 0, 0, 0) // i386 open
		if err := errnoOf(fd); err != nil {
			return err
		}
		p, b := m.buf(256)
		n := Int80(3, uintptr(fd), p, 256, 0, 0) // i386 read
		if err := errnoOf(n); err != nil {
			return err
		}
		fmt.Printf("DATA %s\n", b[:n])
		return nil
	},
	"ia32-openat-read": func(e attackEnv, _ string) error {
		m := newMem32()
		fd := Int80(295, uintptr(uint32(0xffffff9c)), m.str(e.secret()), 0, 0, 0) // i386 openat(AT_FDCWD)
		if err := errnoOf(fd); err != nil {
			return err
		}
		p, b := m.buf(256)
		n := Int80(3, uintptr(fd), p, 256, 0, 0)
		if err := errnoOf(n); err != nil {
			return err
		}
		fmt.Printf("DATA %s\n", b[:n])
		return nil
	},
	"ia32-mount": func(e attackEnv, _ string) error {
		m := newMem32()
		dir := filepath.Join(e.ws, "m32")
		os.MkdirAll(dir, 0o755)
		return errnoOf(Int80(21, m.str("none"), m.str(dir), m.str("tmpfs"), 0, 0)) // i386 mount
	},
	"ia32-socketcall-packet": func(e attackEnv, _ string) error {
		// i386 socketcall(SYS_SOCKET, {AF_PACKET, SOCK_RAW, 0}): neither
		// the x86_64 socket number nor cgroup/sock_create sees it.
		m := newMem32()
		p, b := m.buf(12)
		binary.LittleEndian.PutUint32(b[0:], unix.AF_PACKET)
		binary.LittleEndian.PutUint32(b[4:], unix.SOCK_RAW)
		fd := Int80(102, 1, p, 0, 0, 0)
		if err := errnoOf(fd); err != nil {
			return err
		}
		fmt.Println("PACKET-SOCKET")
		return nil
	},
	"ia32-kill-agent": func(e attackEnv, _ string) error {
		return errnoOf(Int80(37, uintptr(e.agent), uintptr(unix.SIGTERM), 0, 0, 0)) // i386 kill
	},
	"benign-read-ws": func(e attackEnv, _ string) error { return readAndPrint(filepath.Join(e.ws, "hello")) },

	// --- class 2: kernel state, not user memory -------------------------
	"clone3-files-race": func(e attackEnv, _ string) error {
		var p [2]int
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
			return err
		}
		args := &cloneArgs{ExitSignal: uint64(unix.SIGCHLD)}
		var stop atomic.Bool
		go func() {
			runtime.LockOSThread()
			for !stop.Load() {
				atomic.StoreUint64(&args.Flags, unix.CLONE_FILES)
				atomic.StoreUint64(&args.Flags, 0)
			}
		}()
		for i := 0; i < 300; i++ {
			// Every other call also asks for CLONE_FILES itself, so the
			// kernel's copy carries the flag even where the flipper never
			// runs at the same time (a single-threaded emulator).
			if i%2 == 1 {
				atomic.StoreUint64(&args.Flags, unix.CLONE_FILES)
			}
			pid, errno := kcmpChild(args, uintptr(p[1]))
			if errno == 0 {
				var ws unix.WaitStatus
				unix.Wait4(int(pid), &ws, 0, nil)
			}
		}
		stop.Store(true)
		b := make([]byte, 512)
		n, _ := unix.Read(p[0], b)
		if n > 0 {
			fmt.Printf("SHARED %d children shared the file table\n", n)
			return nil
		}
		return syscall.EPERM
	},
	"clone-files": func(e attackEnv, _ string) error {
		// No race: clone(2)'s flags are a register.
		var p [2]int
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
			return err
		}
		pid, errno := cloneFilesChild(uintptr(p[1]))
		if errno != 0 {
			return errno
		}
		var ws unix.WaitStatus
		unix.Wait4(int(pid), &ws, 0, nil)
		b := make([]byte, 8)
		if n, _ := unix.Read(p[0], b); n > 0 {
			fmt.Println("SHARED the child shares the file table")
			return nil
		}
		return fmt.Errorf("child did not report")
	},
	"openat2-trunc-race": func(e attackEnv, _ string) error {
		how := &unix.OpenHow{Flags: unix.O_RDONLY}
		var stop atomic.Bool
		go func() {
			runtime.LockOSThread()
			for !stop.Load() {
				atomic.StoreUint64(&how.Flags, unix.O_RDONLY|unix.O_TRUNC)
				atomic.StoreUint64(&how.Flags, unix.O_RDONLY)
			}
		}()
		victim := filepath.Join(e.tgt, "victim")
		// Bounded by time, not tries: on an idle 2-core machine 500 tries
		// sometimes never hit the window.
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			fd, err := unix.Openat2(unix.AT_FDCWD, victim, how)
			if err == nil {
				unix.Close(fd)
			}
			if st, err := os.Stat(victim); err == nil && st.Size() == 0 {
				stop.Store(true)
				return nil
			}
		}
		stop.Store(true)
		// Not a refusal: no truncating open reached the kernel, so there
		// is nothing the agent could have recorded.
		fmt.Println(raceNotWon)
		return syscall.EPERM
	},

	// --- class 3: leaving the sandbox at creation time ------------------
	"clone-into-cgroup": func(e attackEnv, _ string) error {
		fd, err := unix.Open(e.outside, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			return err
		}
		args := &cloneArgs{Flags: unix.CLONE_INTO_CGROUP, ExitSignal: uint64(unix.SIGCHLD), Cgroup: uint64(fd)}
		msg := []byte("OUTSIDE-CHILD-RAN\n")
		pid, errno := clone3Child(args, &msg[0], uintptr(len(msg)), cbytes(e.secret()))
		if errno != 0 {
			return errno
		}
		var ws unix.WaitStatus
		unix.Wait4(int(pid), &ws, 0, nil)
		if ws.Signaled() {
			return errChildKilled
		}
		return nil
	},
	"cgroup-procs-escape": func(e attackEnv, _ string) error {
		if err := os.WriteFile(filepath.Join(e.outside, "cgroup.procs"), []byte("0"), 0); err != nil {
			return unwrapErrno(err)
		}
		fmt.Println("OUTSIDE-SELF")
		return readAndPrint(e.secret())
	},
	"benign-child-in-sandbox": func(e attackEnv, _ string) error {
		return runChild("/bin/sh", "sh", "-c", "echo child-ok; cat /proc/self/cgroup 2>/dev/null; true")
	},

	// --- class 4: other names for a protected file ----------------------
	"hardlink-read": func(e attackEnv, _ string) error {
		l := filepath.Join(e.ws, "hl")
		if err := os.Link(e.secret(), l); err != nil {
			return unwrapErrno(err)
		}
		return readAndPrint(l)
	},
	"rename-read": func(e attackEnv, _ string) error {
		l := filepath.Join(e.ws, "rn")
		if err := os.Rename(filepath.Join(e.secretDir, "key2"), l); err != nil {
			return unwrapErrno(err)
		}
		return readAndPrint(l)
	},
	"late-file-hardlink": func(e attackEnv, _ string) error {
		l := filepath.Join(e.ws, "late")
		if err := os.Link(filepath.Join(e.secretDir, "late"), l); err != nil {
			return unwrapErrno(err)
		}
		return readAndPrint(l)
	},
	"symlink-read": func(e attackEnv, _ string) error {
		l := filepath.Join(e.ws, "sl")
		if err := os.Symlink(e.secret(), l); err != nil {
			return unwrapErrno(err)
		}
		return readAndPrint(l)
	},
	"proc-self-root": func(e attackEnv, _ string) error { return readAndPrint("/proc/self/root" + e.secret()) },
	"proc-agent-root": func(e attackEnv, _ string) error {
		return readAndPrint(fmt.Sprintf("/proc/%d/root%s", e.agent, e.secret()))
	},
	"bind-mount-read": func(e attackEnv, _ string) error {
		dir := filepath.Join(e.ws, "bind")
		os.MkdirAll(dir, 0o755)
		if err := unix.Mount(e.secretDir, dir, "", unix.MS_BIND, ""); err != nil {
			return err
		}
		return readAndPrint(filepath.Join(dir, "key"))
	},
	"benign-hardlink-in-ws": func(e attackEnv, _ string) error {
		l := filepath.Join(e.ws, "hello-link")
		if err := os.Link(filepath.Join(e.ws, "hello"), l); err != nil {
			return unwrapErrno(err)
		}
		return readAndPrint(l)
	},
	"benign-rename-in-ws": func(e attackEnv, _ string) error {
		a, b := filepath.Join(e.ws, "ren-a"), filepath.Join(e.ws, "ren-b")
		if err := os.WriteFile(a, []byte("moved\n"), 0o644); err != nil {
			return unwrapErrno(err)
		}
		if err := os.Rename(a, b); err != nil {
			return unwrapErrno(err)
		}
		return readAndPrint(b)
	},

	// --- class 5: changing data without opening for write ---------------
	"rdonly-otrunc": func(e attackEnv, _ string) error {
		fd, err := unix.Open(filepath.Join(e.tgt, "victim"), unix.O_RDONLY|unix.O_TRUNC, 0)
		if err == nil {
			unix.Close(fd)
		}
		return err
	},
	"rdonly-ocreat": func(e attackEnv, _ string) error {
		fd, err := unix.Open(filepath.Join(e.tgt, "created"), unix.O_RDONLY|unix.O_CREAT, 0o644)
		if err == nil {
			unix.Close(fd)
		}
		return err
	},
	"truncate": func(e attackEnv, _ string) error { return unix.Truncate(filepath.Join(e.tgt, "victim"), 0) },
	"rename-away": func(e attackEnv, _ string) error {
		return unix.Rename(filepath.Join(e.tgt, "victim"), filepath.Join(e.ws, "stolen"))
	},
	"unlink": func(e attackEnv, _ string) error { return unix.Unlink(filepath.Join(e.tgt, "victim")) },
	"link-in": func(e attackEnv, _ string) error {
		return unix.Link(filepath.Join(e.ws, "hello"), filepath.Join(e.tgt, "planted"))
	},
	"symlink-in": func(e attackEnv, _ string) error { return unix.Symlink("/etc/passwd", filepath.Join(e.tgt, "planted")) },
	"mknod-in": func(e attackEnv, _ string) error {
		return unix.Mknod(filepath.Join(e.tgt, "planted"), unix.S_IFIFO|0o644, 0)
	},
	"mkdir-in":     func(e attackEnv, _ string) error { return unix.Mkdir(filepath.Join(e.tgt, "planted"), 0o755) },
	"chmod-setuid": func(e attackEnv, _ string) error { return unix.Chmod(filepath.Join(e.tgt, "victim"), 0o4755) },
	"chown":        func(e attackEnv, _ string) error { return unix.Chown(filepath.Join(e.tgt, "victim"), 4242, 4242) },
	"setxattr": func(e attackEnv, _ string) error {
		return unix.Setxattr(filepath.Join(e.tgt, "victim"), "user.adv", []byte("x"), 0)
	},
	"utimensat": func(e attackEnv, _ string) error {
		return unix.UtimesNano(filepath.Join(e.tgt, "victim"), []unix.Timespec{{Sec: 1}, {Sec: 1}})
	},
	"benign-modify-in-ws": func(e attackEnv, _ string) error {
		f := filepath.Join(e.ws, "mod")
		if err := os.WriteFile(f, []byte("data\n"), 0o644); err != nil {
			return unwrapErrno(err)
		}
		for _, err := range []error{unix.Chmod(f, 0o600), unix.Truncate(f, 1), unix.Rename(f, f+"2"),
			unix.Link(f+"2", f+"3"), unix.Symlink(f+"3", f+"4"), unix.Unlink(f + "2")} {
			if err != nil {
				return err
			}
		}
		return nil
	},

	// --- class 6: exec rules mean what noexec means ----------------------
	"exec-tmp-elf": func(e attackEnv, _ string) error {
		t := filepath.Join(e.scratch, "t")
		if err := copyFile("/bin/touch", t, 0o755); err != nil {
			return err
		}
		return runChild(t, "touch", filepath.Join(e.ws, "mark"))
	},
	"exec-tmp-shebang": func(e attackEnv, _ string) error {
		s := filepath.Join(e.scratch, "s.sh")
		if err := os.WriteFile(s, []byte("#!/bin/sh\necho ran > "+filepath.Join(e.ws, "mark")+"\n"), 0o755); err != nil {
			return err
		}
		return runChild(s, s)
	},
	"exec-tmp-ldso": func(e attackEnv, _ string) error {
		ld := "/lib64/ld-linux-x86-64.so.2"
		if _, err := os.Stat(ld); err != nil {
			return fmt.Errorf("no dynamic loader at %s: %w", ld, errNotApplicable)
		}
		t := filepath.Join(e.scratch, "t")
		if err := copyFile("/bin/touch", t, 0o644); err != nil {
			return err
		}
		return runChild(ld, ld, t, filepath.Join(e.ws, "mark"))
	},
	"mmap-exec-tmp": func(e attackEnv, _ string) error {
		t := filepath.Join(e.scratch, "code")
		if err := os.WriteFile(t, make([]byte, 4096), 0o644); err != nil {
			return err
		}
		fd, err := unix.Open(t, unix.O_RDONLY, 0)
		if err != nil {
			return err
		}
		b, err := unix.Mmap(fd, 0, 4096, unix.PROT_READ|unix.PROT_EXEC, unix.MAP_PRIVATE)
		if err != nil {
			return err
		}
		unix.Munmap(b)
		fmt.Println("MAPPED-EXEC")
		return nil
	},
	"mprotect-exec-tmp": func(e attackEnv, _ string) error {
		t := filepath.Join(e.scratch, "code2")
		if err := os.WriteFile(t, make([]byte, 4096), 0o644); err != nil {
			return err
		}
		fd, err := unix.Open(t, unix.O_RDONLY, 0)
		if err != nil {
			return err
		}
		b, err := unix.Mmap(fd, 0, 4096, unix.PROT_READ, unix.MAP_PRIVATE)
		if err != nil {
			return err
		}
		defer unix.Munmap(b)
		if err := unix.Mprotect(b, unix.PROT_READ|unix.PROT_EXEC); err != nil {
			return err
		}
		fmt.Println("MPROTECTED-EXEC")
		return nil
	},
	"memfd-exec": func(e attackEnv, _ string) error {
		fd, err := unix.MemfdCreate("payload", 0)
		if err != nil {
			return err
		}
		b, err := os.ReadFile("/bin/touch")
		if err != nil {
			return err
		}
		if _, err := unix.Write(fd, b); err != nil {
			return err
		}
		return runChild(fmt.Sprintf("/proc/self/fd/%d", fd), "touch", filepath.Join(e.ws, "mark"))
	},
	"benign-exec-ws-script": func(e attackEnv, _ string) error {
		s := filepath.Join(e.ws, "ok.sh")
		if err := os.WriteFile(s, []byte("#!/bin/sh\necho ran > "+filepath.Join(e.ws, "mark")+"\n"), 0o755); err != nil {
			return err
		}
		return runChild(s, s)
	},

	// --- class 7: the agent defends itself ---------------------------------
	"kill-agent":   func(e attackEnv, _ string) error { return unix.Kill(e.agent, unix.SIGTERM) },
	"tgkill-agent": func(e attackEnv, _ string) error { return unix.Tgkill(e.agent, e.agent, unix.SIGTERM) },
	"pidfd-agent": func(e attackEnv, _ string) error {
		fd, err := unix.PidfdOpen(e.agent, 0)
		if err != nil {
			return err
		}
		return unix.PidfdSendSignal(fd, unix.SIGTERM, nil, 0)
	},
	"kill-pgrp-agent": func(e attackEnv, _ string) error { return unix.Kill(-e.agent, unix.SIGTERM) },
	"kill-all-urg":    func(e attackEnv, _ string) error { return unix.Kill(-1, unix.SIGURG) },
	"stop-agent":      func(e attackEnv, _ string) error { return unix.Kill(e.agent, unix.SIGSTOP) },
	"sigqueue-agent": func(e attackEnv, _ string) error {
		// rt_sigqueueinfo: a kill by another syscall, with a forged siginfo.
		var info [128]byte
		binary.LittleEndian.PutUint32(info[0:], uint32(unix.SIGTERM))
		binary.LittleEndian.PutUint32(info[8:], ^uint32(0)) // si_code SI_QUEUE
		_, _, en := syscall.Syscall(unix.SYS_RT_SIGQUEUEINFO, uintptr(e.agent), uintptr(unix.SIGTERM), uintptr(unsafe.Pointer(&info[0])))
		if en != 0 {
			return en
		}
		return nil
	},
	"fsetown-ex-pgrp-agent": func(e attackEnv, _ string) error {
		// F_SETOWN_EX to the agent's process group: no pid of the agent
		// is ever named.
		pgid, err := unix.Getpgid(e.agent)
		if err != nil {
			return err
		}
		var p [2]int
		if err := unix.Pipe(p[:]); err != nil {
			return err
		}
		own := struct{ Type, Pid int32 }{2 /* F_OWNER_PGRP */, int32(pgid)} // struct f_owner_ex
		if _, _, en := syscall.Syscall(unix.SYS_FCNTL, uintptr(p[0]), unix.F_SETOWN_EX, uintptr(unsafe.Pointer(&own))); en != 0 {
			return en
		}
		if _, err := unix.FcntlInt(uintptr(p[0]), unix.F_SETSIG, int(unix.SIGTERM)); err != nil {
			return err
		}
		if _, err := unix.FcntlInt(uintptr(p[0]), unix.F_SETFL, unix.O_ASYNC); err != nil {
			return err
		}
		_, err = unix.Write(p[1], []byte("x"))
		return err
	},
	"fsetown-sigio-agent": func(e attackEnv, _ string) error {
		var p [2]int
		if err := unix.Pipe(p[:]); err != nil {
			return err
		}
		if _, err := unix.FcntlInt(uintptr(p[0]), unix.F_SETOWN, e.agent); err != nil {
			return err
		}
		if _, err := unix.FcntlInt(uintptr(p[0]), unix.F_SETSIG, int(unix.SIGTERM)); err != nil {
			return err
		}
		if _, err := unix.FcntlInt(uintptr(p[0]), unix.F_SETFL, unix.O_ASYNC); err != nil {
			return err
		}
		_, err := unix.Write(p[1], []byte("x"))
		return err
	},
	"ptrace-attach-agent": func(e attackEnv, _ string) error {
		runtime.LockOSThread()
		if err := unix.PtraceAttach(e.agent); err != nil {
			return err
		}
		time.Sleep(500 * time.Millisecond) // hold it stopped
		return nil
	},
	"oom-score-adj-agent": func(e attackEnv, _ string) error {
		return unwrapErrno(os.WriteFile(fmt.Sprintf("/proc/%d/oom_score_adj", e.agent), []byte("1000"), 0))
	},

	// --- class 8: one list, both enforcers: sockets -------------------------
	"packet-socket": func(e attackEnv, _ string) error {
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0x0300 /* htons(ETH_P_ALL) */)
		if err != nil {
			return err
		}
		unix.Close(fd)
		fmt.Println("PACKET-SOCKET")
		return nil
	},
	"unix-symlink-host-socket": func(e attackEnv, _ string) error {
		// The cgroup unix hook sees a path inside the workspace; the kernel
		// resolves it to the host's socket.
		l := filepath.Join(e.ws, "svc.sock")
		if err := os.Symlink(e.hostSock, l); err != nil {
			return unwrapErrno(err)
		}
		return unixConnect(l)
	},
	"unix-host-socket": func(e attackEnv, _ string) error { return unixConnect(e.hostSock) },
	"benign-unix-ws-socket": func(e attackEnv, _ string) error {
		// A socket in the workspace, reached through a symlink in it.
		s := filepath.Join(e.ws, "own.sock")
		ln, err := net.Listen("unix", s)
		if err != nil {
			return unwrapErrno(err)
		}
		defer ln.Close()
		go func() {
			if c, err := ln.Accept(); err == nil {
				c.Write([]byte("WS-SERVICE\n"))
				c.Close()
			}
		}()
		l := filepath.Join(e.ws, "own-link")
		if err := os.Symlink(s, l); err != nil {
			return unwrapErrno(err)
		}
		return unixConnect(l)
	},

	// --- class 9: paths the cgroup hooks do not see ------------------------
	"binfmt-register": func(e attackEnv, _ string) error {
		reg := "/proc/sys/fs/binfmt_misc/register"
		if _, err := os.Stat(reg); err != nil {
			if err := unix.Mount("binfmt_misc", "/proc/sys/fs/binfmt_misc", "binfmt_misc", 0, ""); err != nil {
				return err
			}
		}
		f, err := os.OpenFile(reg, os.O_WRONLY, 0)
		if err != nil {
			return unwrapErrno(err)
		}
		// An invalid registration: harmless even where the open got through.
		f.Write([]byte(":adv-invalid"))
		f.Close()
		fmt.Println("OPENED-REGISTER")
		return nil
	},
}
