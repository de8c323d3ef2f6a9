package launch_test

// The command's privilege and subtree: capabilities reduced to the
// granted set, a PID namespace of its own, terminal injection refused,
// Landlock's signal scope. Each refusal comes with its benign neighbour.

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/launch"
)

// subtreeHelper runs the helper modes of this file in the child.
func subtreeHelper(op, arg string) (int, bool) {
	switch op {
	case "caps":
		// The capability sets, then a call needing CAP_SYS_TIME
		// (settimeofday setting the time zone to what it is), one
		// needing CAP_SYS_ADMIN (sethostname to the current name, in
		// the command's own UTS namespace) and their neighbours.
		status, _ := os.ReadFile("/proc/self/status")
		for _, l := range strings.Split(string(status), "\n") {
			if strings.HasPrefix(l, "Cap") {
				fmt.Println(strings.ReplaceAll(l, "\t", ""))
			}
		}
		var tv unix.Timeval
		var tz [2]int32 // struct timezone
		_, _, e := unix.Syscall(unix.SYS_GETTIMEOFDAY, uintptr(unsafe.Pointer(&tv)), uintptr(unsafe.Pointer(&tz)), 0)
		fmt.Printf("gettimeofday=%d\n", int(e))
		_, _, e = unix.Syscall(unix.SYS_SETTIMEOFDAY, 0, uintptr(unsafe.Pointer(&tz)), 0)
		fmt.Printf("settimeofday=%d\n", int(e))
		var ts unix.Timespec
		fmt.Printf("clock_gettime=%d\n", errnoOf(unix.ClockGettime(unix.CLOCK_REALTIME, &ts)))
		var u unix.Utsname
		fmt.Printf("uname=%d\n", errnoOf(unix.Uname(&u)))
		fmt.Printf("sethostname=%d\n", errnoOf(unix.Sethostname(bytes.TrimRight(u.Nodename[:], "\x00"))))
	case "subtree":
		// arg is a host process (the test's own): invisible from a PID
		// namespace, out of reach of the Landlock signal scope.
		host, _ := strconv.Atoi(arg)
		fmt.Printf("pid=%d\n", os.Getpid())
		fmt.Printf("kill_host=%d\n", errnoOf(unix.Kill(host, 0)))
		var rl unix.Rlimit
		fmt.Printf("prlimit_host=%d\n", errnoOf(unix.Prlimit(host, unix.RLIMIT_NOFILE, nil, &rl)))
		_, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", host))
		fmt.Printf("environ_host=%d\n", errnoOf(err))
		child := exec.Command("sleep", "30")
		if err := child.Start(); err != nil {
			fmt.Printf("start=%v\n", err)
			return 1, true
		}
		fmt.Printf("prlimit_self=%d\n", errnoOf(unix.Prlimit(0, unix.RLIMIT_NOFILE, nil, &rl)))
		fmt.Printf("prlimit_child=%d\n", errnoOf(unix.Prlimit(child.Process.Pid, unix.RLIMIT_NOFILE, nil, &rl)))
		_, err = os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", child.Process.Pid))
		fmt.Printf("cmdline_child=%d\n", errnoOf(err))
		fmt.Printf("kill_child=%d\n", errnoOf(child.Process.Signal(syscall.SIGTERM)))
		child.Wait()
		ps, err := exec.Command("ps", "-e", "-o", "pid=,comm=").Output()
		if err != nil {
			fmt.Printf("ps=%v\n", err)
		} else {
			fmt.Printf("ps_lines=%d\n", strings.Count(strings.TrimSpace(string(ps)), "\n")+1)
		}
		name, err := os.Hostname()
		fmt.Printf("hostname=%d\nhostname_value=%s\n", errnoOf(err), name)
	case "tty":
		// A pty pair of the command's own: injecting input is refused
		// on it (on any terminal), reading its window size works.
		master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
		if err != nil {
			fmt.Printf("ptmx=%v\n", err)
			return 1, true
		}
		defer master.Close()
		if err := unix.IoctlSetPointerInt(int(master.Fd()), unix.TIOCSPTLCK, 0); err != nil {
			fmt.Printf("unlockpt=%v\n", err)
			return 1, true
		}
		n, err := unix.IoctlGetUint32(int(master.Fd()), unix.TIOCGPTN)
		if err != nil {
			fmt.Printf("ptsname=%v\n", err)
			return 1, true
		}
		slave, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
		if err != nil {
			fmt.Printf("pts=%v\n", err)
			return 1, true
		}
		defer slave.Close()
		c := byte('x')
		ioc := func(cmd uintptr, p unsafe.Pointer) int {
			_, _, e := unix.Syscall(unix.SYS_IOCTL, slave.Fd(), cmd, uintptr(p))
			return int(e)
		}
		fmt.Printf("tiocsti=%d\n", ioc(unix.TIOCSTI, unsafe.Pointer(&c)))
		fmt.Printf("tiocsti_high=%d\n", ioc(1<<32|unix.TIOCSTI, unsafe.Pointer(&c)))
		fmt.Printf("tioclinux=%d\n", ioc(unix.TIOCLINUX, unsafe.Pointer(&c)))
		var ws unix.Winsize
		fmt.Printf("tiocgwinsz=%d\n", ioc(unix.TIOCGWINSZ, unsafe.Pointer(&ws)))
	case "selfkill":
		syscall.Kill(os.Getpid(), syscall.SIGTERM)
		time.Sleep(time.Second)
	default:
		return 0, false
	}
	return 0, true
}

// results parses the helper's name=value lines.
func results(out []byte) map[string]string {
	m := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			m[k] = v
		} else if k, v, ok := strings.Cut(sc.Text(), ":"); ok {
			m[k] = v
		}
	}
	return m
}

func wantErrno(t *testing.T, r map[string]string, name string, want syscall.Errno, out []byte) {
	t.Helper()
	if got := r[name]; got != strconv.Itoa(int(want)) {
		t.Errorf("%s: errno %s, want %d (%v)\n%s", name, got, int(want), want, out)
	}
}

// hostBounding is the test process's bounding set: what a command can
// hold at most.
func hostBounding(t *testing.T) launch.CapSet {
	t.Helper()
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(l, "CapBnd:"); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				t.Fatal(err)
			}
			return launch.CapSet(n)
		}
	}
	t.Fatal("no CapBnd in /proc/self/status")
	return 0
}

func TestCapabilitiesReduced(t *testing.T) {
	e := newEnv(t)
	bnd := hostBounding(t)
	for _, tc := range []struct {
		name    string
		granted launch.CapSet
	}{
		{"none", 0},
		{"docker-like", 1<<unix.CAP_CHOWN | 1<<unix.CAP_DAC_OVERRIDE | 1<<unix.CAP_FOWNER | 1<<unix.CAP_KILL | 1<<unix.CAP_NET_BIND_SERVICE},
		{"time-and-admin", 1<<unix.CAP_SYS_TIME | 1<<unix.CAP_SYS_ADMIN | 1<<unix.CAP_SETPCAP},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := e.config("caps")
			// No file rules: /proc/self/status of the command is
			// readable whatever the rules; the namespaces give it a UTS
			// namespace for sethostname.
			cfg.Restrictions.Files = nil
			cfg.Restrictions.Capabilities = &tc.granted
			cfg.Isolation = launch.Isolation{Namespaces: launch.SubtreeNamespaces}
			v, out := e.runConfig(t, cfg)
			if v.Outcome != launch.OutcomeExited || v.ExitCode != 0 {
				t.Fatalf("verdict %s\n%s", v, out)
			}
			want := tc.granted & bnd
			if !v.Applied.CapsReduced || v.Applied.Capabilities != want {
				t.Errorf("applied caps %#x reduced=%t, want %#x", uint64(v.Applied.Capabilities), v.Applied.CapsReduced, uint64(want))
			}
			r := results(out)
			for _, set := range []string{"CapBnd", "CapPrm", "CapEff", "CapInh"} {
				if got := r[set]; got != fmt.Sprintf("%016x", uint64(want)) {
					t.Errorf("%s = %s, want %016x", set, got, uint64(want))
				}
			}
			if r["CapAmb"] != fmt.Sprintf("%016x", 0) {
				t.Errorf("CapAmb = %s, want 0", r["CapAmb"])
			}
			expect := func(name string, capNum int) {
				t.Helper()
				if want&(1<<capNum) != 0 {
					wantErrno(t, r, name, 0, out)
				} else {
					wantErrno(t, r, name, unix.EPERM, out)
				}
			}
			expect("settimeofday", unix.CAP_SYS_TIME)
			expect("sethostname", unix.CAP_SYS_ADMIN)
			for _, n := range []string{"gettimeofday", "clock_gettime", "uname"} {
				wantErrno(t, r, n, 0, out)
			}
		})
	}
}

func TestOwnPIDNamespace(t *testing.T) {
	e := newEnv(t)
	if _, err := exec.LookPath("ps"); err != nil {
		t.Skip("no ps on this host")
	}
	host := os.Getpid()
	cfg := e.config("subtree:" + strconv.Itoa(host))
	cfg.Restrictions.Files = nil
	none := launch.CapSet(0)
	cfg.Restrictions.Capabilities = &none
	cfg.Isolation = launch.Isolation{Namespaces: launch.SubtreeNamespaces}
	v, out := e.runConfig(t, cfg)
	if v.Outcome != launch.OutcomeExited || v.ExitCode != 0 {
		t.Fatalf("verdict %s\n%s", v, out)
	}
	r := results(out)
	// Not PID 1 (the launcher's init is; its threads take the next
	// numbers).
	if n, err := strconv.Atoi(r["pid"]); err != nil || n <= 1 || n > 100 {
		t.Errorf("the command is pid %s in its namespace, want a small number above 1", r["pid"])
	}
	wantErrno(t, r, "kill_host", unix.ESRCH, out)
	wantErrno(t, r, "prlimit_host", unix.ESRCH, out)
	wantErrno(t, r, "environ_host", unix.ENOENT, out)
	for _, n := range []string{"prlimit_self", "prlimit_child", "cmdline_child", "kill_child", "hostname"} {
		wantErrno(t, r, n, 0, out)
	}
	// init, the command, ps: a handful, not the host's processes.
	if n, err := strconv.Atoi(r["ps_lines"]); err != nil || n < 3 || n > 6 {
		t.Errorf("ps lists %s processes, want the namespace's 3-6\n%s", r["ps_lines"], out)
	}
	if h, _ := os.Hostname(); r["hostname_value"] != h {
		t.Errorf("hostname inside %q, host %q", r["hostname_value"], h)
	}
	if got := strings.Join(v.Applied.Namespaces, ","); got != "mnt,pid,uts,ipc" {
		t.Errorf("applied namespaces %q", got)
	}
	// Outside, the same host process is visible: the refusals above are
	// the namespace's.
	r = results(outside(t, "subtree:"+strconv.Itoa(host)))
	if r["kill_host"] != "0" || r["environ_host"] != "0" {
		t.Errorf("outside: kill %s environ %s, want 0", r["kill_host"], r["environ_host"])
	}
}

func TestLandlockSignalScope(t *testing.T) {
	e := newEnv(t)
	if launch.LandlockABI() < 6 {
		t.Skip("Landlock ABI < 6: no signal scope on this kernel")
	}
	host := strconv.Itoa(os.Getpid())
	// No PID namespace, no file rules: the scope alone.
	cfg := e.config("subtree:" + host)
	cfg.Restrictions.Files = nil
	v, out := e.runConfig(t, cfg)
	if v.Outcome != launch.OutcomeExited {
		t.Fatalf("verdict %s\n%s", v, out)
	}
	if !strings.Contains(strings.Join(v.Applied.Scoped, ","), "signal") {
		t.Errorf("scope not reported: %v", v.Applied.Scoped)
	}
	r := results(out)
	wantErrno(t, r, "kill_host", unix.EPERM, out)
	wantErrno(t, r, "kill_child", 0, out)
	// Turned off, the same signal goes through (kill with signal 0 only
	// probes).
	cfg.Restrictions.NoIPCScope = true
	v, out = e.runConfig(t, cfg)
	if len(v.Applied.Scoped) != 0 {
		t.Errorf("scope %v reported with NoIPCScope", v.Applied.Scoped)
	}
	wantErrno(t, results(out), "kill_host", 0, out)
}

func TestTerminalInjectionRefused(t *testing.T) {
	e := newEnv(t)
	v, out := e.run(t, "tty")
	if v.Outcome != launch.OutcomeExited || v.ExitCode != 0 {
		t.Fatalf("verdict %s\n%s", v, out)
	}
	r := results(out)
	for _, n := range []string{"tiocsti", "tiocsti_high", "tioclinux"} {
		wantErrno(t, r, n, unix.EPERM, out)
	}
	wantErrno(t, r, "tiocgwinsz", 0, out)
	// Outside the sandbox TIOCSTI works on the helper's own pty (the
	// refusal above is the filter's), and TIOCLINUX is not a pty ioctl.
	r = results(outside(t, "tty"))
	if r["tiocsti"] != "0" {
		t.Errorf("outside: TIOCSTI errno %s, want 0", r["tiocsti"])
	}
}

func TestInitPassesStatusAndSignals(t *testing.T) {
	e := newEnv(t)
	sub := launch.Isolation{Namespaces: launch.SubtreeNamespaces}
	cfg := e.config("exit:7")
	cfg.Isolation = sub
	v, out := e.runConfig(t, cfg)
	if v.Outcome != launch.OutcomeExited || v.ExitCode != 7 {
		t.Errorf("exit 7: verdict %s\n%s", v, out)
	}
	cfg = e.config("selfkill")
	cfg.Isolation = sub
	v, out = e.runConfig(t, cfg)
	if v.Outcome != launch.OutcomeSignaled || v.Signal != syscall.SIGTERM {
		t.Errorf("self-killed: verdict %s\n%s", v, out)
	}
	// The graded timeouts reach the command, not lost on PID 1.
	cfg = e.config("sleep")
	cfg.Isolation = sub
	cfg.Timeouts = launch.Timeouts{Term: 300 * time.Millisecond, Kill: 10 * time.Second}
	v, err := launch.Run(context.Background(), cfg)
	if err != nil || v.Outcome != launch.OutcomeTermed || v.Killed || v.Signal != syscall.SIGTERM {
		t.Errorf("term: verdict %s err %v", v, err)
	}
	cfg = e.config("sleep-ignore-term")
	cfg.Isolation = sub
	// Term late enough for the helper to ignore SIGTERM first, on a
	// loaded machine too.
	cfg.Timeouts = launch.Timeouts{Term: 2 * time.Second, Kill: 3 * time.Second}
	v, err = launch.Run(context.Background(), cfg)
	if err != nil || v.Outcome != launch.OutcomeKilled || v.Signal != syscall.SIGKILL {
		t.Errorf("kill: verdict %s err %v", v, err)
	}
}
