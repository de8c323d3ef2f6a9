package main

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/enforce/enforcetest/nltest"
	"github.com/watcherhq/watcher/internal/testkit/syscallbench"
)

// subtreeOp performs one own-subtree or host-state operation (issue 25),
// harmless to the host: signal 0 or SIGCONT, limits and priorities set to
// the values they have, calls that fail after the checks (a missing
// interface, an invalid length). handled is false for other ops.
func subtreeOp(op string, args []string) (handled bool, err error) {
	n := func(i int) int {
		if i >= len(args) {
			return 0
		}
		if args[i] == "self" {
			return os.Getpid()
		}
		v, _ := strconv.Atoi(args[i])
		return v
	}
	errno := func(_, _ uintptr, e syscall.Errno) error {
		if e != 0 {
			return e
		}
		return nil
	}
	switch op {
	case "sig": // sig PID SIG (PID may be 0, -1 or -PGID)
		return true, unix.Kill(n(0), syscall.Signal(n(1)))
	case "tgkill": // tgkill TGID TID SIG
		return true, unix.Tgkill(n(0), n(1), syscall.Signal(n(2)))
	case "ownsignals":
		return true, ownSignals()
	case "procfdsig": // pidfd_send_signal through a /proc/PID directory
		fd, err := unix.Open(fmt.Sprintf("/proc/%d", n(0)), unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			return true, err
		}
		return true, unix.PidfdSendSignal(fd, syscall.Signal(n(1)), nil, 0)
	case "pidfdopen":
		fd, err := unix.PidfdOpen(n(0), 0)
		if err == nil {
			unix.Close(fd)
		}
		return true, err
	case "prlimit": // prlimit PID: NOFILE set to what it is
		var cur unix.Rlimit
		if err := unix.Prlimit(n(0), unix.RLIMIT_NOFILE, nil, &cur); err != nil {
			return true, err
		}
		return true, unix.Prlimit(n(0), unix.RLIMIT_NOFILE, &cur, nil)
	case "setprio": // setprio WHICH WHO: the priority it has
		p, err := unix.Getpriority(n(0), n(1))
		if err != nil {
			return true, err
		}
		return true, unix.Setpriority(n(0), n(1), 20-p)
	case "ioprio": // ioprio WHICH WHO
		r, _, e := unix.Syscall(unix.SYS_IOPRIO_GET, uintptr(n(0)), uintptr(n(1)), 0)
		if e != 0 {
			return true, e
		}
		return true, errno(unix.Syscall(unix.SYS_IOPRIO_SET, uintptr(n(0)), uintptr(n(1)), r))
	case "affinity": // affinity PID
		var set unix.CPUSet
		if err := unix.SchedGetaffinity(n(0), &set); err != nil {
			return true, err
		}
		return true, unix.SchedSetaffinity(n(0), &set)
	case "kcmp": // kcmp PID: KCMP_VM of this process and PID
		return true, errno(unix.Syscall6(unix.SYS_KCMP, uintptr(os.Getpid()), uintptr(n(0)), 1, 0, 0, 0))
	case "setown", "setownex", "fiosetown": // OWNER
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
		if err != nil {
			return true, err
		}
		switch op {
		case "setown":
			_, err = unix.FcntlInt(uintptr(fds[0]), unix.F_SETOWN, n(0))
		case "setownex":
			ex := [2]int32{1 /* F_OWNER_PID */, int32(n(0))}
			err = errno(unix.Syscall(unix.SYS_FCNTL, uintptr(fds[0]), unix.F_SETOWN_EX, uintptr(unsafe.Pointer(&ex))))
		default:
			owner := int32(n(0))
			err = errno(unix.Syscall(unix.SYS_IOCTL, uintptr(fds[0]), 0x8901 /* FIOSETOWN */, uintptr(unsafe.Pointer(&owner))))
		}
		return true, err
	case "tiocsti", "tiocgwinsz", "tioclinux": // on a pty of its own
		master, err := os.OpenFile("/dev/ptmx", os.O_RDWR, 0)
		if err != nil {
			return true, err
		}
		if err := unix.IoctlSetPointerInt(int(master.Fd()), unix.TIOCSPTLCK, 0); err != nil {
			return true, err
		}
		pn, err := unix.IoctlGetInt(int(master.Fd()), unix.TIOCGPTN)
		if err != nil {
			return true, err
		}
		slave, err := unix.Open(fmt.Sprintf("/dev/pts/%d", pn), unix.O_RDWR|unix.O_NOCTTY, 0)
		if err != nil {
			return true, err
		}
		switch op {
		case "tiocsti":
			c := byte('x')
			return true, errno(unix.Syscall(unix.SYS_IOCTL, uintptr(slave), unix.TIOCSTI, uintptr(unsafe.Pointer(&c))))
		case "tioclinux":
			sub := byte(7) // TIOCL_GETSHIFTSTATE: a read, refused all the same; ENOTTY on a pty
			return true, errno(unix.Syscall(unix.SYS_IOCTL, uintptr(slave), unix.TIOCLINUX, uintptr(unsafe.Pointer(&sub))))
		}
		ws, err := unix.IoctlGetWinsize(slave, unix.TIOCGWINSZ)
		if err == nil {
			fmt.Printf("winsize %dx%d\n", ws.Col, ws.Row)
		}
		return true, err
	case "settimeofday": // neither time nor zone: checks CAP_SYS_TIME, changes nothing
		return true, errno(unix.Syscall(unix.SYS_SETTIMEOFDAY, 0, 0, 0))
	case "clock_settime_mono": // EINVAL: CLOCK_MONOTONIC cannot be set
		var ts unix.Timespec
		unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
		return true, unix.ClockSettime(unix.CLOCK_MONOTONIC, &ts)
	case "adjtimex": // adjtimex MODES: ADJ_STATUS (0x10) writes the status it read
		var tx unix.Timex
		if _, err := unix.Adjtimex(&tx); err != nil {
			return true, err
		}
		tx.Modes = uint32(n(0))
		_, err := unix.Adjtimex(&tx)
		return true, err
	case "fanotify_init": // a group with no mark: nothing watched
		fd, err := unix.FanotifyInit(unix.FAN_CLASS_NOTIF, unix.O_RDONLY)
		if err == nil {
			unix.Close(fd)
		}
		return true, err
	case "sethostname_long": // EINVAL after the capability check
		return true, unix.Sethostname(make([]byte, 65))
	case "clock_gettime":
		var ts unix.Timespec
		return true, unix.ClockGettime(unix.CLOCK_REALTIME, &ts)
	case "uname":
		var u unix.Utsname
		err := unix.Uname(&u)
		fmt.Printf("nodename %s\n", unix.ByteSliceToString(u.Nodename[:]))
		return true, err
	case "unshare": // unshare FLAGS (this process only)
		runtime.LockOSThread()
		return true, unix.Unshare(n(0))
	case "setns": // setns PATH
		fd, err := unix.Open(args[0], unix.O_RDONLY, 0)
		if err != nil {
			return true, err
		}
		runtime.LockOSThread()
		return true, unix.Setns(fd, 0)
	case "syslog": // syslog ACTION (7 CONSOLE_ON: no change unless the console was off; 10 SIZE_BUFFER)
		return true, errno(unix.Syscall(unix.SYS_SYSLOG, uintptr(n(0)), 0, 0))
	case "quotaon_missing": // Q_QUOTAON on a missing device: ENOENT
		dev := []byte("/nonexistent-watcher-test\x00")
		cmd := uintptr(0x800002 << 8) // QCMD(Q_QUOTAON, USRQUOTA)
		return true, errno(unix.Syscall6(unix.SYS_QUOTACTL, cmd, uintptr(unsafe.Pointer(&dev[0])), 0, 0, 0, 0))
	case "siocsifflags_missing", "siocgifconf":
		s, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
		if err != nil {
			return true, err
		}
		if op == "siocgifconf" {
			buf := make([]byte, 4096)
			conf := struct {
				len int32
				_   int32
				buf uintptr
			}{int32(len(buf)), 0, uintptr(unsafe.Pointer(&buf[0]))}
			return true, errno(unix.Syscall(unix.SYS_IOCTL, uintptr(s), unix.SIOCGIFCONF, uintptr(unsafe.Pointer(&conf))))
		}
		ifr, _ := unix.NewIfreq("wtnoexist0")
		ifr.SetUint16(unix.IFF_UP)
		return true, unix.IoctlIfreq(s, unix.SIOCSIFFLAGS, ifr)
	case "nocap": // nocap OP ARGS: OP with no effective capability (as watcher exec leaves it)
		runtime.LockOSThread()
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			return true, err
		}
		data[0].Effective, data[1].Effective = 0, 0
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			return true, err
		}
		_, err := subtreeOp(args[0], args[1:])
		return true, err
	case "hotloop": // hotloop ITERS
		return true, hotLoop(n(0))
	case "rtm_newaddr_missing": // RTM_NEWADDR on no interface: ENODEV after CAP_NET_ADMIN
		return true, nltest.NewAddrNoInterface()
	}
	return false, nil
}

// ownSignals signals its own threads (tgkill, as the Go runtime's
// preemption does), itself, and a child of its own (kill, SIGTERM).
func ownSignals() error {
	pid := os.Getpid()
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return err
	}
	for _, e := range ents {
		tid, _ := strconv.Atoi(e.Name())
		if err := unix.Tgkill(pid, tid, unix.SIGURG); err != nil {
			return fmt.Errorf("tgkill own thread %d: %w", tid, err)
		}
	}
	if err := unix.Kill(pid, 0); err != nil {
		return err
	}
	child := exec.Command("/bin/sleep", "30")
	if err := child.Start(); err != nil {
		return err
	}
	if err := unix.Kill(child.Process.Pid, unix.SIGTERM); err != nil {
		return fmt.Errorf("kill own child: %w", err)
	}
	werr := child.Wait()
	if werr == nil || !strings.Contains(werr.Error(), "terminated") {
		return fmt.Errorf("own child not terminated: %v", werr)
	}
	fmt.Println("own signals delivered")
	return nil
}

// hotLoop measures the calls the own-subtree checks put on sys_enter's
// path (each judged on registers before any lookup, or by the target's
// cgroup): tgkill of its own thread and kill of itself with signal 0 (the
// Go runtime's preemption route), ioctl FIONREAD, fcntl F_GETFL; getpid as
// the control no category touches.
func hotLoop(iters int) error {
	var p [2]int
	if err := unix.Pipe(p[:]); err != nil {
		return err
	}
	runtime.LockOSThread()
	pid, tid := uintptr(unix.Getpid()), uintptr(unix.Gettid())
	var n int32
	res := syscallbench.Result{}
	run := func(name string, f func()) { res[name] = syscallbench.NsPerOp(iters, f) }
	run("tgkill-own", func() { unix.RawSyscall(unix.SYS_TGKILL, pid, tid, 0) })
	run("kill-self", func() { unix.RawSyscall(unix.SYS_KILL, pid, 0, 0) })
	run("ioctl", func() {
		unix.RawSyscall(unix.SYS_IOCTL, uintptr(p[0]), 0x541B /* FIONREAD */, uintptr(unsafe.Pointer(&n)))
	})
	run("fcntl", func() { unix.RawSyscall(unix.SYS_FCNTL, uintptr(p[0]), unix.F_GETFL, 0) })
	run("getpid", func() { unix.RawSyscall(unix.SYS_GETPID, 0, 0, 0) })
	return syscallbench.Write(os.Stdout, res)
}
