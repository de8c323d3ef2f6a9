// Command bshelper performs one dangerous operation for the backstop tests:
// bshelper op [args...]. It prints the syscall's result and exits 0 whatever
// it returned: being killed is what the tests look for. It is a separate
// binary so that nothing but the operation runs in the sandbox (the test
// binary links cilium/ebpf, whose init calls bpf(2)).
package main

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/test/adversarial"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: bshelper op [args...]")
		os.Exit(2)
	}
	op := os.Args[1]
	arg := func(i int) string {
		if i+2 < len(os.Args) {
			return os.Args[i+2]
		}
		return ""
	}
	argInt := func(i int) uintptr { n, _ := strconv.Atoi(arg(i)); return uintptr(n) }
	var err error
	switch op {
	case "open":
		var b []byte
		b, err = os.ReadFile(arg(0))
		if err == nil {
			fmt.Printf("read %d bytes\n", len(b))
		}
	case "openwrite":
		var fd int
		fd, err = unix.Open(arg(0), unix.O_WRONLY, 0)
		if err == nil {
			unix.Close(fd)
		}
	case "openat2":
		var fd int
		fd, err = unix.Openat2(unix.AT_FDCWD, arg(0), &unix.OpenHow{Flags: unix.O_RDONLY})
		if err == nil {
			unix.Close(fd)
		}
	case "opath":
		var fd, fd2 int
		fd, err = unix.Open(arg(0), unix.O_PATH, 0)
		if err == nil {
			fmt.Println("O_PATH open survived")
			fd2, err = unix.Open(fmt.Sprintf("/proc/self/fd/%d", fd), unix.O_RDONLY, 0)
			if err == nil {
				unix.Close(fd2)
			}
		}
	case "ptrace":
		_, _, e := unix.RawSyscall6(unix.SYS_PTRACE, unix.PTRACE_SEIZE, argInt(0), 0, 0, 0, 0)
		if e == 0 {
			unix.RawSyscall6(unix.SYS_PTRACE, unix.PTRACE_DETACH, argInt(0), 0, 0, 0, 0)
		} else {
			err = e
		}
	case "vmread", "vmwrite":
		buf := make([]byte, 8)
		local := []unix.Iovec{{Base: &buf[0], Len: 8}}
		remote := []unix.RemoteIovec{{Base: uintptr(0x10000), Len: 8}}
		if op == "vmread" {
			_, err = unix.ProcessVMReadv(int(argInt(0)), local, remote, 0)
		} else {
			_, err = unix.ProcessVMWritev(int(argInt(0)), local, remote, 0)
		}
	case "pidfd_getfd":
		var pfd, fd int
		pfd, err = unix.PidfdOpen(int(argInt(0)), 0)
		if err == nil {
			fd, err = unix.PidfdGetfd(pfd, 0, 0)
			if err == nil {
				unix.Close(fd)
			}
		}
	case "mount":
		err = unix.Mount("watcher-test", arg(0), "tmpfs", 0, "")
	case "umount":
		err = unix.Unmount(arg(0), 0)
	case "fsopen":
		var fd int
		fd, err = unix.Fsopen("tmpfs", 0)
		if err == nil {
			unix.Close(fd)
		}
	case "chroot":
		err = unix.Chroot("/")
	case "pivot_root":
		err = unix.PivotRoot("/nonexistent-watcher", "/nonexistent-watcher")
	case "bpf":
		_, _, e := unix.Syscall(unix.SYS_BPF, 0 /* BPF_MAP_CREATE */, 0, 0)
		err = e
	case "init_module":
		_, _, e := unix.Syscall(unix.SYS_INIT_MODULE, 0, 0, 0)
		err = e
	case "finit_module":
		f, _ := os.Open("/proc/self/exe")
		err = unix.FinitModule(int(f.Fd()), "", 0)
	case "kexec_load":
		_, _, e := unix.Syscall6(unix.SYS_KEXEC_LOAD, 0, 0, 0, 0, 0, 0)
		err = e
	case "kexec_file_load":
		f, _ := os.Open("/proc/self/exe")
		err = unix.KexecFileLoad(int(f.Fd()), -1, "", 0)
	case "procmem":
		var fd int
		fd, err = unix.Open(fmt.Sprintf("/proc/%s/mem", arg(0)), unix.O_RDONLY, 0)
		if err == nil {
			unix.Close(fd)
		}
	case "killagent":
		err = unix.Kill(int(argInt(0)), 0)
	case "sigio":
		// F_SETOWN PID + F_SETSIG SIG + O_ASYNC on a pipe, then a write:
		// the kernel signals PID now, and again when this process exits
		// (the last writer's close wakes the reader).
		err = sigio(int(argInt(0)), int(argInt(1)))
	case "clonefiles":
		// Reproducer of the CLONE_FILES hole: a partner sharing the file
		// table, then the opener opens the protected file and is killed;
		// the partner reads the descriptor and prints it.
		pid, e := cloneFilesPartner()
		if e != 0 {
			err = e
			break
		}
		fmt.Fprintf(os.Stderr, "partner %d\n", pid)
		// Keep the descriptor open a while: the partner polls for it.
		var fd int
		fd, err = unix.Open(arg(0), unix.O_RDONLY, 0)
		if err == nil {
			fmt.Printf("opener got fd %d\n", fd)
			time.Sleep(300 * time.Millisecond)
			var ws unix.WaitStatus
			unix.Wait4(int(pid), &ws, 0, nil)
		}
	case "uring":
		var b []byte
		b, err = uringReadFile(arg(0), arg(1))
		if err == nil {
			fmt.Printf("uring read: %s", b)
		}
	case "escape":
		// WATCHER_ARG0 is an fd to a cgroup.procs outside the sandbox,
		// opened before this process entered it.
		fd := int(argInt(0))
		_, err = unix.Write(fd, []byte("0\n"))
	case "socket":
		// socket(family, type, 0): "packet" is AF_PACKET SOCK_DGRAM, "udp"
		// the benign neighbour.
		family, typ := unix.AF_INET, unix.SOCK_DGRAM
		if arg(0) == "packet" {
			family = unix.AF_PACKET
		}
		var fd int
		if fd, err = unix.Socket(family, typ, 0); err == nil {
			unix.Close(fd)
		}
	case "unixconnect":
		// connect(2) of a stream unix socket to arg 0 ("dgram" as arg 1:
		// a datagram socket), then what the peer sends first.
		typ := unix.SOCK_STREAM
		if arg(1) == "dgram" {
			typ = unix.SOCK_DGRAM
		}
		var fd int
		if fd, err = unix.Socket(unix.AF_UNIX, typ, 0); err != nil {
			break
		}
		if err = unix.Connect(fd, &unix.SockaddrUnix{Name: arg(0)}); err == nil {
			fmt.Println("connected")
			if typ == unix.SOCK_STREAM {
				buf := make([]byte, 64)
				n, _ := unix.Read(fd, buf)
				fmt.Printf("peer said: %s\n", buf[:max(n, 0)])
			}
		}
		unix.Close(fd)
	case "chrootopen":
		// chroot DIR, then read PATH (relative to the new root).
		if err = unix.Chroot(arg(0)); err == nil {
			var b []byte
			if b, err = os.ReadFile(arg(1)); err == nil {
				fmt.Printf("read %d bytes\n", len(b))
			}
		}
	case "uringrename":
		err = uringRename(arg(0), arg(1))
	case "openloop":
		// open+close PATH N times (repeated opens: the verdict cache).
		for i := 0; i < int(argInt(0)) && err == nil; i++ {
			var fd int
			if fd, err = unix.Open(arg(1), unix.O_RDONLY, 0); err == nil {
				unix.Close(fd)
			}
		}
	case "openpause":
		// open+close PATH1 N times, print "cached", wait for a line on
		// stdin (the test changes names, mounts or rules meanwhile), then
		// chroot to JAIL when given and read PATH2: one process, so
		// nothing else (a new cgroup, a new binary) happens between.
		for i := 0; i < int(argInt(0)) && err == nil; i++ {
			var fd int
			if fd, err = unix.Open(arg(1), unix.O_RDONLY, 0); err == nil {
				unix.Close(fd)
			}
		}
		if err != nil {
			break
		}
		fmt.Println("cached")
		var line [1]byte
		os.Stdin.Read(line[:])
		if jail := arg(3); jail != "" {
			if err = unix.Chroot(jail); err != nil {
				break
			}
		}
		var b []byte
		if b, err = os.ReadFile(arg(2)); err == nil {
			fmt.Printf("read %d bytes\n", len(b))
		}
	case "int80rename":
		// i386 rename(OLD, NEW) through int 0x80.
		err = int80Strings(38, arg(0), arg(1), 0)
	case "int80":
		// int80 NR [STR]: i386 syscall NR(STR, ...) through int 0x80
		// ("int80 61 /" is chroot("/"), "int80 20" getpid).
		err = int80Strings(argInt(0), arg(1), "", 0)
	case "int80move":
		// i386 mount(SRC, DST, NULL, MS_MOVE, NULL) through int 0x80.
		err = int80Move(arg(0), arg(1))
	case "lowmap":
		// lowmap KIND ADDR: one page placed at ADDR (lowmap.go).
		err = lowMapping(arg(0), uint64(argInt(1)))
	case "pagezero":
		// pagezero BIN: exec BIN under the MMAP_PAGE_ZERO personality,
		// which makes the ELF loader map page 0. personality(2) sets the
		// calling thread's flags and execve reads the exec'ing thread's.
		runtime.LockOSThread()
		const mmapPageZero = 0x0100000
		if _, _, e := unix.RawSyscall(unix.SYS_PERSONALITY, mmapPageZero, 0, 0); e != 0 {
			err = e
			break
		}
		err = syscall.Exec(arg(0), []string{arg(0)}, nil)
	case "exec":
		err = syscall.Exec(arg(0), []string{arg(0)}, nil)
	case "mmaploop":
		// mmaploop N: N anonymous mmap+munmap pairs placed by the kernel
		// (the low-mapping check's fast path); prints ns per pair.
		fmt.Printf("ns/op %.1f\n", mmapLoop(int(argInt(0))))
	case "sleep":
		select {}
	case "cmds":
		cmdLoop() // commands from stdin (cmds.go)
	default:
		var handled bool
		if handled, err = subtreeOp(op, os.Args[2:]); !handled {
			fmt.Fprintf(os.Stderr, "unknown helper op %q\n", op)
			os.Exit(2)
		}
	}
	fmt.Printf("result: %v\n", err)
	os.Exit(0)
}

var partnerBuf [256]byte

// cloneFilesPartner clones a process sharing this one's file table (not a
// thread). The child is a copy of this thread only, so it runs nothing but
// raw syscalls: it polls descriptors 3..63 for the secret and prints it.
//
//go:nosplit
//go:norace
func cloneFilesPartner() (uintptr, syscall.Errno) {
	r1, _, e := syscall.RawSyscall6(unix.SYS_CLONE, unix.CLONE_FILES|uintptr(unix.SIGCHLD), 0, 0, 0, 0, 0)
	if e != 0 || r1 != 0 {
		return r1, e
	}
	ts := unix.Timespec{Nsec: 1000000}
	for i := 0; i < 3000; i++ {
		for fd := uintptr(3); fd < 64; fd++ {
			n, _, e := syscall.RawSyscall6(unix.SYS_PREAD64, fd, uintptr(unsafe.Pointer(&partnerBuf[0])), uintptr(len(partnerBuf)), 0, 0, 0)
			if e == 0 && n >= 6 && partnerBuf[0] == 'S' && partnerBuf[1] == 'E' && partnerBuf[2] == 'C' {
				syscall.RawSyscall(unix.SYS_WRITE, 1, uintptr(unsafe.Pointer(&partnerBuf[0])), n)
				syscall.RawSyscall(unix.SYS_EXIT_GROUP, 0, 0, 0)
			}
		}
		syscall.RawSyscall(unix.SYS_NANOSLEEP, uintptr(unsafe.Pointer(&ts)), 0, 0)
	}
	syscall.RawSyscall(unix.SYS_EXIT_GROUP, 3, 0, 0)
	return 0, 0
}

// A minimal io_uring, enough to open a file (plain, async, SQPOLL, or into
// a fixed-file slot) and read it, as a sandboxed attacker would.

type sqRingOffsets struct {
	Head, Tail, RingMask, RingEntries, Flags, Dropped, Array, Resv1 uint32
	UserAddr                                                        uint64
}

type cqRingOffsets struct {
	Head, Tail, RingMask, RingEntries, Overflow, Cqes, Flags, Resv1 uint32
	UserAddr                                                        uint64
}

type ioUringParams struct {
	SqEntries, CqEntries, Flags, SqThreadCPU, SqThreadIdle, Features, WqFd uint32
	Resv                                                                   [3]uint32
	SqOff                                                                  sqRingOffsets
	CqOff                                                                  cqRingOffsets
}

type ioUringSqe struct {
	Opcode      uint8
	Flags       uint8
	Ioprio      uint16
	Fd          int32
	Off         uint64
	Addr        uint64
	Len         uint32
	OpFlags     uint32
	UserData    uint64
	BufIndex    uint16
	Personality uint16
	FileIndex   uint32
	Addr3       uint64
	_           uint64
}

type ioUringCqe struct {
	UserData uint64
	Res      int32
	Flags    uint32
}

const (
	ioringSetupSQPoll   = 1 << 1
	ioringOpOpenat      = 18
	ioringOpRead        = 22
	ioringOpRenameat    = 35
	iosqeFixedFile      = 1 << 0
	iosqeAsync          = 1 << 4
	ioringEnterGetevent = 1 << 0
	ioringEnterSQWakeup = 1 << 1
	ioringSQNeedWakeup  = 1 << 0
	ioringRegisterFiles = 2
	ioringOffSQEs       = 0x10000000
)

type ring struct {
	fd     int
	p      ioUringParams
	sqMem  []byte
	sqes   []byte
	sqpoll bool
}

func newRing(flags uint32) (*ring, error) {
	r := &ring{}
	r.p.Flags = flags
	r.p.SqThreadIdle = 2000
	fd, _, errno := syscall.Syscall(unix.SYS_IO_URING_SETUP, 4, uintptr(unsafe.Pointer(&r.p)), 0)
	if errno != 0 {
		return nil, fmt.Errorf("io_uring_setup: %w", errno)
	}
	r.fd = int(fd)
	r.sqpoll = flags&ioringSetupSQPoll != 0
	sqSize := int(r.p.SqOff.Array + r.p.SqEntries*4)
	cqSize := int(r.p.CqOff.Cqes + r.p.CqEntries*uint32(unsafe.Sizeof(ioUringCqe{})))
	size := max(sqSize, cqSize) // IORING_FEAT_SINGLE_MMAP
	var err error
	r.sqMem, err = unix.Mmap(r.fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("mmap rings: %w", err)
	}
	r.sqes, err = unix.Mmap(r.fd, ioringOffSQEs, int(r.p.SqEntries)*64, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("mmap sqes: %w", err)
	}
	return r, nil
}

func (r *ring) u32(off uint32) *uint32 { return (*uint32)(unsafe.Pointer(&r.sqMem[off])) }

// submit queues one SQE and waits for its completion.
func (r *ring) submit(sqe ioUringSqe) (int32, error) {
	tail := atomic.LoadUint32(r.u32(r.p.SqOff.Tail))
	mask := *r.u32(r.p.SqOff.RingMask)
	idx := tail & mask
	*(*ioUringSqe)(unsafe.Pointer(&r.sqes[idx*64])) = sqe
	*(*uint32)(unsafe.Pointer(&r.sqMem[r.p.SqOff.Array+idx*4])) = idx
	atomic.StoreUint32(r.u32(r.p.SqOff.Tail), tail+1)
	toSubmit, flags := uintptr(1), uintptr(ioringEnterGetevent)
	if r.sqpoll {
		toSubmit = 0
		if atomic.LoadUint32(r.u32(r.p.SqOff.Flags))&ioringSQNeedWakeup != 0 {
			flags |= ioringEnterSQWakeup
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		head := atomic.LoadUint32(r.u32(r.p.CqOff.Head))
		if head != atomic.LoadUint32(r.u32(r.p.CqOff.Tail)) {
			cmask := *r.u32(r.p.CqOff.RingMask)
			cqe := *(*ioUringCqe)(unsafe.Pointer(&r.sqMem[r.p.CqOff.Cqes+(head&cmask)*16]))
			atomic.StoreUint32(r.u32(r.p.CqOff.Head), head+1)
			return cqe.Res, nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("no completion")
		}
		_, _, errno := syscall.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), toSubmit, 1, flags, 0, 0)
		if errno != 0 && errno != unix.EINTR && errno != unix.EAGAIN && errno != unix.EBUSY {
			return 0, fmt.Errorf("io_uring_enter: %w", errno)
		}
		toSubmit = 0
		if r.sqpoll {
			time.Sleep(time.Millisecond)
		}
	}
}

// uringReadFile opens path through the ring with the given variant
// ("plain", "async", "sqpoll", "fixed") and returns the first bytes read.
func uringReadFile(variant, path string) ([]byte, error) {
	var flags uint32
	if variant == "sqpoll" {
		flags = ioringSetupSQPoll
	}
	r, err := newRing(flags)
	if err != nil {
		return nil, err
	}
	p, _ := unix.BytePtrFromString(path)
	open := ioUringSqe{Opcode: ioringOpOpenat, Fd: unix.AT_FDCWD, Addr: uint64(uintptr(unsafe.Pointer(p))), OpFlags: unix.O_RDONLY}
	if variant == "async" {
		open.Flags = iosqeAsync
	}
	fixed := variant == "fixed"
	if fixed {
		slots := []int32{-1, -1}
		if _, _, errno := syscall.Syscall6(unix.SYS_IO_URING_REGISTER, uintptr(r.fd), ioringRegisterFiles,
			uintptr(unsafe.Pointer(&slots[0])), 2, 0, 0); errno != 0 {
			return nil, fmt.Errorf("register files: %w", errno)
		}
		open.FileIndex = 1 // slot 0, openat_direct: no descriptor is returned
	}
	res, err := r.submit(open)
	if err != nil {
		return nil, err
	}
	if res < 0 {
		return nil, fmt.Errorf("openat: %w", syscall.Errno(-res))
	}
	buf := make([]byte, 64)
	read := ioUringSqe{Opcode: ioringOpRead, Fd: res, Addr: uint64(uintptr(unsafe.Pointer(&buf[0]))), Len: uint32(len(buf))}
	if fixed {
		read.Fd, read.Flags = 0, iosqeFixedFile
	}
	n, err := r.submit(read)
	if err != nil {
		return nil, err
	}
	if n < 0 {
		return nil, fmt.Errorf("read: %w", syscall.Errno(-n))
	}
	return buf[:n], nil
}

func sigio(pid, sig int) error {
	var p [2]int
	if err := unix.Pipe(p[:]); err != nil {
		return err
	}
	if _, err := unix.FcntlInt(uintptr(p[0]), unix.F_SETOWN, pid); err != nil {
		return err
	}
	if _, err := unix.FcntlInt(uintptr(p[0]), unix.F_SETSIG, sig); err != nil {
		return err
	}
	if _, err := unix.FcntlInt(uintptr(p[0]), unix.F_SETFL, unix.O_ASYNC); err != nil {
		return err
	}
	_, err := unix.Write(p[1], []byte("x"))
	return err
}

// uringRename renames oldpath to newpath with IORING_OP_RENAMEAT.
func uringRename(oldpath, newpath string) error {
	r, err := newRing(0)
	if err != nil {
		return err
	}
	o, _ := unix.BytePtrFromString(oldpath)
	n, _ := unix.BytePtrFromString(newpath)
	atFDCWD := int32(unix.AT_FDCWD)
	res, err := r.submit(ioUringSqe{Opcode: ioringOpRenameat, Fd: unix.AT_FDCWD, Addr: uint64(uintptr(unsafe.Pointer(o))),
		Len: uint32(atFDCWD), Off: uint64(uintptr(unsafe.Pointer(n)))})
	if err != nil {
		return err
	}
	if res < 0 {
		return fmt.Errorf("renameat: %w", syscall.Errno(-res))
	}
	return nil
}

// int80Move moves the mount at src to dst with the i386 mount syscall
// (21).
func int80Move(src, dst string) error {
	const msMove = 8192
	return int80Strings(21, src, dst, msMove)
}

// int80Strings makes i386 syscall nr(a, b, NULL, flags, NULL), its strings
// in memory below 4 GiB.
func int80Strings(nr uintptr, a, b string, flags uintptr) error {
	mem, err := unix.Mmap(-1, 0, 1<<16, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON|unix.MAP_32BIT)
	if err != nil {
		return err
	}
	copy(mem, a)
	copy(mem[4096:], b)
	if r := adversarial.Int80(nr, uintptr(unsafe.Pointer(&mem[0])), uintptr(unsafe.Pointer(&mem[4096])), 0, flags, 0); r < 0 {
		return syscall.Errno(-r)
	}
	return nil
}
