package adversarial

// Own subtree and host-wide state (issue 25), placed as a container runtime
// places a process (root in the host's namespaces). Targets are harmless
// stand-ins: a host process the test starts (a sleep), a pty the test
// holds, the clock zone, host name and interface flags set to what they
// are, calls that fail after the kernel's checks.

import (
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/watcherhq/watcher/internal/enforce/enforcetest/nltest"
	"github.com/watcherhq/watcher/internal/testkit/poll"
	"golang.org/x/sys/unix"
)

// hostProcess starts a process outside every sandbox (its own process
// group; with netns, in a network namespace of its own) and returns its pid
// as the row's argument.
func hostProcess(netns bool) func(b *bed) string {
	return func(b *bed) string {
		args := []string{"sleep", "300"}
		if netns {
			args = append([]string{"unshare", "-n"}, args...)
		}
		cmd := exec.Command(args[0], args[1:]...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			b.t.Fatal(err)
		}
		b.t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		hostPIDs[cmd.Process.Pid] = cmd
		return strconv.Itoa(cmd.Process.Pid)
	}
}

// hostPIDs are the host processes of the rows, by pid (the test side).
var hostPIDs = map[int]*exec.Cmd{}

// hostPTY opens a pty the test holds (a host terminal's stand-in) and
// returns its slave's path; hostPTYMaster is its master.
var hostPTYMaster *os.File

func hostPTY(b *bed) string {
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NONBLOCK, 0)
	if err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(func() { m.Close() })
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		b.t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		b.t.Fatal(err)
	}
	hostPTYMaster = m
	return fmt.Sprintf("/dev/pts/%d", n)
}

// hostSessionPTY is hostPTY made the controlling terminal of a host
// session (a sleep, its leader), as the operator's shell holds its own.
func hostSessionPTY(b *bed) string {
	path := hostPTY(b)
	slave, err := os.OpenFile(path, os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		b.t.Fatal(err)
	}
	cmd := exec.Command("sleep", "300")
	cmd.Stdin = slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait(); slave.Close() })
	return path
}

// hostDevice skips the row where the host has no such device node.
func hostDevice(path string) func(b *bed) string {
	return func(b *bed) string {
		if _, err := os.Stat(path); err != nil {
			b.t.Skipf("no %s on this host: %v", path, err)
		}
		return path
	}
}

// hostShm creates a System V segment outside every sandbox holding a
// secret and returns its id.
func hostShm(b *bed) string {
	id, err := unix.SysvShmGet(unix.IPC_PRIVATE, 4096, unix.IPC_CREAT|0o666)
	if err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(func() { unix.SysvShmCtl(id, unix.IPC_RMID, nil) })
	mem, err := unix.SysvShmAttach(id, 0, 0)
	if err != nil {
		b.t.Fatal(err)
	}
	copy(mem, "host-secret")
	unix.SysvShmDetach(mem)
	return strconv.Itoa(id)
}

// mqOpen, mqSend and mqReceive are the POSIX message queue syscalls (the
// kernel takes the name without glibc's leading slash).
func mqOpen(name string, flags int) (int, error) {
	p, err := unix.BytePtrFromString(name)
	if err != nil {
		return -1, err
	}
	fd, _, e := unix.Syscall6(unix.SYS_MQ_OPEN, uintptr(unsafe.Pointer(p)), uintptr(flags), 0o666, 0, 0, 0)
	if e != 0 {
		return -1, e
	}
	return int(fd), nil
}

func mqSend(fd int, msg string) error {
	b := []byte(msg)
	return errnoResult(unix.Syscall6(unix.SYS_MQ_TIMEDSEND, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), 0, 0, 0))
}

func mqReceive(fd int) (string, error) {
	buf := make([]byte, 8192) // at least the queue's mq_msgsize (default 8192)
	n, _, e := unix.Syscall6(unix.SYS_MQ_TIMEDRECEIVE, uintptr(fd), uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), 0, 0, 0)
	if e != 0 {
		return "", e
	}
	return string(buf[:n]), nil
}

func mqUnlink(name string) {
	if p, err := unix.BytePtrFromString(name); err == nil {
		unix.Syscall(unix.SYS_MQ_UNLINK, uintptr(unsafe.Pointer(p)), 0, 0)
	}
}

// hostMQ creates a POSIX message queue outside every sandbox holding a
// secret and returns its name.
func hostMQ(b *bed) string {
	name := fmt.Sprintf("watcher-adv-host-%d", os.Getpid())
	fd, err := mqOpen(name, unix.O_CREAT|unix.O_RDWR|unix.O_CLOEXEC)
	if err != nil {
		b.t.Skipf("no POSIX message queues here: %v", err)
	}
	b.t.Cleanup(func() { unix.Close(fd); mqUnlink(name) })
	if err := mqSend(fd, "host-secret"); err != nil {
		b.t.Fatal(err)
	}
	return name
}

func argPID(o outcome) int {
	for _, l := range strings.Split(o.out, "\n") {
		if p, ok := strings.CutPrefix(l, "TARGET "); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(p))
			return n
		}
	}
	return 0
}

// hostGone: the host process died (a signal reached it).
func hostGone(b *bed, o outcome) (bool, string) {
	cmd := hostPIDs[argPID(o)]
	if cmd == nil {
		return false, "no host process"
	}
	var ws unix.WaitStatus
	if !poll.Within(time.Second, func() bool {
		n, _ := unix.Wait4(cmd.Process.Pid, &ws, unix.WNOHANG, nil)
		return n == cmd.Process.Pid
	}) {
		return false, ""
	}
	b.t.Logf("host process %d ended: signal %v, exit %d", cmd.Process.Pid, ws.Signal(), ws.ExitStatus())
	return true, "host process got " + ws.Signal().String()
}

// hostProc reads /proc/PID/<file> of the row's host process and reports
// whether it holds want.
func hostProc(file, want string) func(*bed, outcome) (bool, string) {
	return func(b *bed, o outcome) (bool, string) {
		data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/%s", argPID(o), file))
		if strings.Contains(string(data), want) {
			return true, "host process " + file + " now has " + strings.TrimSpace(want)
		}
		return false, ""
	}
}

func hostNice(b *bed, o outcome) (bool, string) {
	data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", argPID(o)))
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	if len(f) > 16 && f[16] != "0" {
		return true, "host process nice now " + f[16]
	}
	return false, ""
}

func ptyInjected(b *bed, o outcome) (bool, string) {
	buf := make([]byte, 64)
	if n, _ := hostPTYMaster.Read(buf); n > 0 {
		return true, fmt.Sprintf("host terminal got %q", buf[:n])
	}
	return false, ""
}

// never: the row's call changes nothing even when it runs (a stand-in for
// the real change); what counts is the kill and the record.
func never(*bed, outcome) (bool, string) { return false, "" }

var subtreeTechniques = []technique{
	{class: 10, name: "kill-host-process", variant: "kill(HOST, SIGTERM) of a process outside every sandbox", afterTheFact: true, setup: hostProcess(false), achieved: hostGone},
	{class: 10, name: "kill-pgrp-host", variant: "kill(-HOST_PGID, SIGTERM)", afterTheFact: true, setup: hostProcess(false), achieved: hostGone},
	{class: 10, name: "pidfd-host", variant: "pidfd_send_signal(/proc/HOST, SIGTERM)", afterTheFact: true, setup: hostProcess(false), achieved: hostGone},
	{class: 10, name: "prlimit-host", variant: "prlimit(HOST, RLIMIT_NOFILE, 8)", afterTheFact: true, setup: hostProcess(false), achieved: hostProc("limits", "Max open files            8 ")},
	{class: 10, name: "setpriority-host", variant: "setpriority(PRIO_PROCESS, HOST, 19)", afterTheFact: true, setup: hostProcess(false), achieved: hostNice},
	{class: 10, name: "affinity-host", variant: "sched_setaffinity(HOST, cpu 0)", afterTheFact: true, setup: hostProcess(false), achieved: hostProc("status", "Cpus_allowed_list:\t0\n")},
	// The write succeeds whatever happens to the SIGIO it raises: what
	// counts is the signal's refusal (or the sender's kill) and the host
	// process alive.
	{class: 10, name: "fsetown-sigio-host", variant: "F_SETOWN HOST + O_ASYNC write (SIGIO)", delivery: true, setup: hostProcess(false), achieved: hostGone},
	{class: 10, name: "tiocsti-host-tty", variant: "TIOCSTI into a terminal outside the sandbox", afterTheFact: true, setup: hostPTY, achieved: ptyInjected},
	{class: 10, name: "open-host-session-tty", variant: "read-open of a terminal a host session controls (the operator's keystrokes)", setup: hostSessionPTY, achieved: printed("TTY-OPENED")},
	{class: 10, name: "open-console", variant: "read-open of /dev/console (a host login's terminal)", setup: hostDevice("/dev/console"), achieved: printed("TTY-OPENED")},
	{class: 10, name: "environ-host", variant: "read /proc/HOST/environ (a host process's tokens)", setup: hostProcess(false), achieved: printed("ENVIRON-READ")},
	{class: 10, name: "fd-dir-host", variant: "list /proc/HOST/fd (what a host process holds open)", setup: hostProcess(false), achieved: printed("FDS-LISTED")},
	{class: 10, name: "shmat-host", variant: "attach a host process's System V segment and read it", setup: hostShm, achieved: printed("host-secret")},
	{class: 10, name: "mq-host", variant: "open a host process's POSIX message queue and receive from it", setup: hostMQ, achieved: printed("host-secret")},
	{class: 10, name: "inotify-secret-dir", variant: "inotify mark on the protected credentials directory (who opens it, and when)", achieved: printed("MARKED")},
	{class: 10, name: "settimeofday-tz", variant: "settimeofday(NULL, current zone) (CAP_SYS_TIME)", achieved: never},
	{class: 10, name: "adjtimex-status", variant: "adjtimex ADJ_STATUS, the status it has (CAP_SYS_TIME)", achieved: never},
	{class: 10, name: "sethostname-same", variant: "sethostname(its current name) (CAP_SYS_ADMIN)", achieved: never},
	{class: 10, name: "setdomainname-same", variant: "setdomainname(its current name) (CAP_SYS_ADMIN)", achieved: never},
	{class: 10, name: "setns-foreign-net", variant: "setns into a host process's network namespace", setup: hostProcess(true), achieved: never},
	{class: 10, name: "siocsifflags-lo", variant: "SIOCSIFFLAGS lo, the flags it has (CAP_NET_ADMIN)", achieved: never},
	{class: 10, name: "rtnetlink-newaddr", variant: "RTM_NEWADDR on no interface (CAP_NET_ADMIN; after the fact)", achieved: never},
	{class: 10, name: "benign-own-signals", variant: "tgkill its own threads, kill its own child", benign: true, achieved: benignOK("OWN-SIGNALS")},
	{class: 10, name: "benign-own-limits", variant: "prlimit and setpriority on itself and its child", benign: true, achieved: benignOK("OWN-LIMITS")},
	{class: 10, name: "benign-own-pty", variant: "TIOCGWINSZ on a pty of its own", benign: true, achieved: benignOK("WINSIZE")},
	{class: 10, name: "benign-own-session-pty", variant: "a pty its own session controls, opened again by name", benign: true, achieved: benignOK("OWN-SESSION-PTY")},
	{class: 10, name: "benign-ps-reads", variant: "cmdline, stat and status of a host process; environ and fd of its own child", benign: true, setup: hostProcess(false), achieved: benignOK("PS-READS")},
	{class: 10, name: "benign-own-shm", variant: "a System V segment of its own (get, attach, write, remove)", benign: true, achieved: benignOK("OWN-SHM")},
	{class: 10, name: "benign-own-mq", variant: "a POSIX message queue of its own (create, send, receive, unlink)", benign: true, achieved: benignOK("OWN-MQ")},
	{class: 10, name: "benign-own-inotify", variant: "an inotify mark in its workspace, and its event", benign: true, achieved: benignOK("OWN-INOTIFY")},
	{class: 10, name: "benign-host-reads", variant: "clock_gettime, uname, SIOCGIFCONF, adjtimex read", benign: true, achieved: benignOK("HOST-READS")},
}

func errnoResult(_, _ uintptr, e syscall.Errno) error {
	if e != 0 {
		return e
	}
	return nil
}

func targetArg() int {
	n, _ := strconv.Atoi(os.Getenv("ADV_ARG"))
	fmt.Printf("TARGET %d\n", n)
	return n
}

var subtreeAttacks = map[string]func(attackEnv, string) error{
	"kill-host-process": func(attackEnv, string) error { return unix.Kill(targetArg(), unix.SIGTERM) },
	"kill-pgrp-host":    func(attackEnv, string) error { return unix.Kill(-targetArg(), unix.SIGTERM) },
	"pidfd-host": func(attackEnv, string) error {
		fd, err := unix.Open(fmt.Sprintf("/proc/%d", targetArg()), unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			return err
		}
		return unix.PidfdSendSignal(fd, unix.SIGTERM, nil, 0)
	},
	"prlimit-host": func(attackEnv, string) error {
		return unix.Prlimit(targetArg(), unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: 8, Max: 8}, nil)
	},
	"setpriority-host": func(attackEnv, string) error { return unix.Setpriority(unix.PRIO_PROCESS, targetArg(), 19) },
	"affinity-host": func(attackEnv, string) error {
		var set unix.CPUSet
		set.Set(0)
		return unix.SchedSetaffinity(targetArg(), &set)
	},
	"fsetown-sigio-host": func(attackEnv, string) error {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
		if err != nil {
			return err
		}
		if _, err := unix.FcntlInt(uintptr(fds[0]), unix.F_SETOWN, targetArg()); err != nil {
			return err
		}
		if _, err := unix.FcntlInt(uintptr(fds[0]), unix.F_SETFL, unix.O_ASYNC); err != nil {
			return err
		}
		_, err = unix.Write(fds[1], []byte("x"))
		return err
	},
	"tiocsti-host-tty": func(attackEnv, string) error {
		fd, err := unix.Open(os.Getenv("ADV_ARG"), unix.O_RDWR|unix.O_NOCTTY, 0)
		if err != nil {
			return err
		}
		c := byte('!')
		return errnoResult(unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TIOCSTI, uintptr(unsafe.Pointer(&c))))
	},
	"open-host-session-tty": func(attackEnv, string) error {
		if _, err := unix.Open(os.Getenv("ADV_ARG"), unix.O_RDONLY|unix.O_NOCTTY, 0); err != nil {
			return err
		}
		fmt.Println("TTY-OPENED")
		return nil
	},
	"open-console": func(attackEnv, string) error {
		if _, err := unix.Open(os.Getenv("ADV_ARG"), unix.O_RDONLY|unix.O_NOCTTY, 0); err != nil {
			return err
		}
		fmt.Println("TTY-OPENED")
		return nil
	},
	"environ-host": func(attackEnv, string) error {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", targetArg()))
		if err != nil {
			return err
		}
		fmt.Printf("ENVIRON-READ %d bytes\n", len(data))
		return nil
	},
	"fd-dir-host": func(attackEnv, string) error {
		ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", targetArg()))
		if err != nil {
			return err
		}
		fmt.Printf("FDS-LISTED %d\n", len(ents))
		return nil
	},
	"shmat-host": func(attackEnv, string) error {
		mem, err := unix.SysvShmAttach(targetArg(), 0, unix.SHM_RDONLY)
		if err != nil {
			return err
		}
		fmt.Printf("read %q\n", strings.TrimRight(string(mem[:16]), "\x00"))
		return nil
	},
	"mq-host": func(attackEnv, string) error {
		fd, err := mqOpen(os.Getenv("ADV_ARG"), unix.O_RDONLY)
		if err != nil {
			return err
		}
		msg, err := mqReceive(fd)
		if err != nil {
			return err
		}
		fmt.Printf("received %q\n", msg)
		return nil
	},
	"inotify-secret-dir": func(e attackEnv, _ string) error {
		fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
		if err != nil {
			return err
		}
		if _, err := unix.InotifyAddWatch(fd, e.secretDir, unix.IN_ACCESS|unix.IN_OPEN); err != nil {
			return err
		}
		fmt.Println("MARKED")
		return nil
	},
	"settimeofday-tz": func(attackEnv, string) error {
		var tv unix.Timeval
		var tz [2]int32
		if err := errnoResult(unix.Syscall(unix.SYS_GETTIMEOFDAY, uintptr(unsafe.Pointer(&tv)), uintptr(unsafe.Pointer(&tz)), 0)); err != nil {
			return err
		}
		return errnoResult(unix.Syscall(unix.SYS_SETTIMEOFDAY, 0, uintptr(unsafe.Pointer(&tz)), 0))
	},
	"adjtimex-status": func(attackEnv, string) error {
		var tx unix.Timex
		if _, err := unix.Adjtimex(&tx); err != nil {
			return err
		}
		tx.Modes = unix.ADJ_STATUS
		_, err := unix.Adjtimex(&tx)
		return err
	},
	"sethostname-same": func(attackEnv, string) error {
		name, err := os.Hostname()
		if err != nil {
			return err
		}
		return unix.Sethostname([]byte(name))
	},
	"setdomainname-same": func(attackEnv, string) error {
		var u unix.Utsname
		if err := unix.Uname(&u); err != nil {
			return err
		}
		return unix.Setdomainname([]byte(unix.ByteSliceToString(u.Domainname[:])))
	},
	"setns-foreign-net": func(attackEnv, string) error {
		fd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/net", targetArg()), unix.O_RDONLY, 0)
		if err != nil {
			return err
		}
		return unix.Setns(fd, unix.CLONE_NEWNET)
	},
	"siocsifflags-lo": func(attackEnv, string) error {
		s, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
		if err != nil {
			return err
		}
		ifr, err := unix.NewIfreq("lo")
		if err != nil {
			return err
		}
		if err := unix.IoctlIfreq(s, unix.SIOCGIFFLAGS, ifr); err != nil {
			return err
		}
		return unix.IoctlIfreq(s, unix.SIOCSIFFLAGS, ifr)
	},
	"rtnetlink-newaddr": func(attackEnv, string) error { return nltest.NewAddrNoInterface() },
	"benign-own-signals": func(attackEnv, string) error {
		pid := os.Getpid()
		ents, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return err
		}
		for _, e := range ents {
			tid, _ := strconv.Atoi(e.Name())
			if err := unix.Tgkill(pid, tid, unix.SIGURG); err != nil {
				return err
			}
		}
		child := exec.Command("sleep", "30")
		if err := child.Start(); err != nil {
			return err
		}
		if err := unix.Kill(child.Process.Pid, unix.SIGTERM); err != nil {
			return err
		}
		child.Wait()
		fmt.Println("OWN-SIGNALS")
		return nil
	},
	"benign-own-limits": func(attackEnv, string) error {
		child := exec.Command("sleep", "30")
		if err := child.Start(); err != nil {
			return err
		}
		defer func() { child.Process.Kill(); child.Wait() }()
		for _, pid := range []int{0, os.Getpid(), child.Process.Pid} {
			if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, nil, &unix.Rlimit{}); err != nil {
				return err
			}
			lim := unix.Rlimit{Cur: 512, Max: 512}
			if pid == child.Process.Pid {
				if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &lim, nil); err != nil {
					return err
				}
			}
			if err := unix.Setpriority(unix.PRIO_PROCESS, pid, 5); err != nil {
				return err
			}
		}
		fmt.Println("OWN-LIMITS")
		return nil
	},
	"benign-own-pty": func(attackEnv, string) error {
		// Read-only: a write-open of /dev/ptmx or /dev/pts/N is a write
		// outside the workspace under the restricted preset's file rules.
		m, err := os.OpenFile("/dev/ptmx", os.O_RDONLY, 0)
		if err != nil {
			return err
		}
		if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
			return err
		}
		n, err := unix.IoctlGetInt(int(m.Fd()), unix.TIOCGPTN)
		if err != nil {
			return err
		}
		s, err := unix.Open(fmt.Sprintf("/dev/pts/%d", n), unix.O_RDONLY|unix.O_NOCTTY, 0)
		if err != nil {
			return err
		}
		ws, err := unix.IoctlGetWinsize(s, unix.TIOCGWINSZ)
		if err != nil {
			return err
		}
		fmt.Printf("WINSIZE %dx%d\n", ws.Col, ws.Row)
		return nil
	},
	"benign-own-session-pty": func(attackEnv, string) error {
		// Read-only opens, as benign-own-pty (the restricted preset's
		// file rules refuse write-opens outside the workspace).
		m, err := os.OpenFile("/dev/ptmx", os.O_RDONLY, 0)
		if err != nil {
			return err
		}
		defer m.Close()
		if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
			return err
		}
		n, err := unix.IoctlGetInt(int(m.Fd()), unix.TIOCGPTN)
		if err != nil {
			return err
		}
		path := fmt.Sprintf("/dev/pts/%d", n)
		slave, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOCTTY, 0)
		if err != nil {
			return err
		}
		defer slave.Close()
		child := exec.Command("sleep", "30")
		child.Stdin = slave
		child.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
		if err := child.Start(); err != nil {
			return err
		}
		defer func() { child.Process.Kill(); child.Wait() }()
		again, err := unix.Open(path, unix.O_RDONLY|unix.O_NOCTTY, 0)
		if err != nil {
			return err
		}
		if _, err := unix.IoctlGetWinsize(again, unix.TIOCGWINSZ); err != nil {
			return err
		}
		fmt.Println("OWN-SESSION-PTY")
		return nil
	},
	"benign-ps-reads": func(attackEnv, string) error {
		host := targetArg()
		for _, f := range []string{"cmdline", "stat", "status"} {
			if _, err := os.ReadFile(fmt.Sprintf("/proc/%d/%s", host, f)); err != nil {
				return err
			}
		}
		child := exec.Command("sleep", "30")
		if err := child.Start(); err != nil {
			return err
		}
		defer func() { child.Process.Kill(); child.Wait() }()
		for _, pid := range []string{"self", strconv.Itoa(child.Process.Pid)} {
			if _, err := os.ReadFile("/proc/" + pid + "/environ"); err != nil {
				return err
			}
			if _, err := os.ReadDir("/proc/" + pid + "/fd"); err != nil {
				return err
			}
		}
		fmt.Println("PS-READS")
		return nil
	},
	"benign-own-shm": func(attackEnv, string) error {
		id, err := unix.SysvShmGet(unix.IPC_PRIVATE, 4096, unix.IPC_CREAT|0o600)
		if err != nil {
			return err
		}
		mem, err := unix.SysvShmAttach(id, 0, 0)
		if err != nil {
			return err
		}
		copy(mem, "mine")
		if string(mem[:4]) != "mine" {
			return fmt.Errorf("segment reads %q", mem[:4])
		}
		unix.SysvShmDetach(mem)
		if _, err := unix.SysvShmCtl(id, unix.IPC_RMID, nil); err != nil {
			return err
		}
		fmt.Println("OWN-SHM")
		return nil
	},
	"benign-own-mq": func(attackEnv, string) error {
		name := fmt.Sprintf("watcher-adv-own-%d", os.Getpid())
		fd, err := mqOpen(name, unix.O_CREAT|unix.O_EXCL|unix.O_RDWR)
		if err != nil {
			return err
		}
		defer mqUnlink(name)
		if err := mqSend(fd, "mine"); err != nil {
			return err
		}
		again, err := mqOpen(name, unix.O_RDONLY)
		if err != nil {
			return err
		}
		if msg, err := mqReceive(again); err != nil || msg != "mine" {
			return fmt.Errorf("received %q, %v", msg, err)
		}
		fmt.Println("OWN-MQ")
		return nil
	},
	"benign-own-inotify": func(e attackEnv, _ string) error {
		fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
		if err != nil {
			return err
		}
		wd, err := unix.InotifyAddWatch(fd, e.ws, unix.IN_CREATE)
		if err != nil {
			return err
		}
		name := fmt.Sprintf("inotify-%d", os.Getpid())
		if err := os.WriteFile(filepath.Join(e.ws, name), nil, 0o644); err != nil {
			return err
		}
		buf := make([]byte, 4096)
		n, err := unix.Read(fd, buf)
		if err != nil {
			return err
		}
		if int32(binary.LittleEndian.Uint32(buf)) != int32(wd) || !strings.Contains(string(buf[:n]), name) {
			return fmt.Errorf("inotify event %q, want IN_CREATE of %s on wd %d", buf[:n], name, wd)
		}
		fmt.Println("OWN-INOTIFY")
		return nil
	},
	"benign-host-reads": func(attackEnv, string) error {
		var ts unix.Timespec
		if err := unix.ClockGettime(unix.CLOCK_REALTIME, &ts); err != nil {
			return err
		}
		var u unix.Utsname
		if err := unix.Uname(&u); err != nil {
			return err
		}
		var tx unix.Timex
		if _, err := unix.Adjtimex(&tx); err != nil {
			return err
		}
		s, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
		if err != nil {
			return err
		}
		buf := make([]byte, 4096)
		conf := struct {
			len int32
			_   int32
			buf uintptr
		}{int32(len(buf)), 0, uintptr(unsafe.Pointer(&buf[0]))}
		if err := errnoResult(unix.Syscall(unix.SYS_IOCTL, uintptr(s), unix.SIOCGIFCONF, uintptr(unsafe.Pointer(&conf)))); err != nil {
			return err
		}
		fmt.Println("HOST-READS")
		return nil
	},
}

func init() {
	for k, v := range subtreeAttacks {
		attacks[k] = v
	}
}

// TestSubtreeBackstop runs the own-subtree and host-state rows placed as a
// container runtime places a process (the "sandbox" path; watcher exec's
// namespaces and capability drop are the launcher's rows), judged as
// TestAdversarial judges: on the kill backstop every row is killed and
// recorded, the effect of a call that completes before the kill named
// (after the fact); its benign neighbours work.
func TestSubtreeBackstop(t *testing.T) {
	b := newBed(t)
	t.Logf("layer: %s", b.layer)
	var rows []row
	for _, tech := range subtreeTechniques {
		t.Run(tech.name, func(t *testing.T) {
			r := row{tech: tech, path: "sandbox"}
			defer func() {
				r.failed = t.Failed()
				rows = append(rows, r)
			}()
			b.t = t
			var arg string
			if tech.setup != nil {
				arg = tech.setup(b)
			}
			r = judge(t, b, tech, b.inSandbox(tech.name, arg))
			resetWS(b)
			b.ensureAgent()
		})
	}
	b.t = t
	printTable(t, b, rows)
}
