package recorder_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/watcherhq/watcher/internal/testkit/poll"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/enforcetest"
	"github.com/watcherhq/watcher/internal/enforce/recorder"
	"github.com/watcherhq/watcher/internal/launch"
	"github.com/watcherhq/watcher/internal/launch/ia32"
)

// denyEnv is a secret file and a program outside the Landlock rules, and
// the rules (the defaults, plus the helper's directory).
type denyEnv struct {
	secret, prog string
	rules        launch.FileRules
}

func newDenyEnv(t *testing.T) denyEnv {
	t.Helper()
	if launch.LandlockABI() == 0 {
		t.Skip("Landlock is not available on this kernel")
	}
	base := t.TempDir()
	private := filepath.Join(base, "private")
	workspace := filepath.Join(base, "workspace")
	for _, d := range []string{private, workspace} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	e := denyEnv{secret: filepath.Join(private, "shadow"), prog: filepath.Join(private, "prog")}
	if err := os.WriteFile(e.secret, []byte("root:$6$secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Should Landlock let it run, the helper's output would be missing.
	if err := os.WriteFile(e.prog, []byte("#!/bin/false\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	e.rules = launch.DefaultFileRules(workspace)
	e.rules.ReadOnly = append(e.rules.ReadOnly, filepath.Dir(helperBin))
	return e
}

// launchDeny runs `trhelper deny` with the launcher's restrictions in a
// fresh leaf below cgroup and returns the verdict and the helper's
// name=errno results. The helper makes its i386 ptrace (through int 0x80)
// only where this kernel runs 32-bit calls (ia32.Available, asked here:
// inside, the seccomp filter would answer the probe); elsewhere the row
// is logged and skipped as a subtest of its own.
func launchDeny(t *testing.T, e denyEnv, cgroup string) (launch.Verdict, map[string]syscall.Errno) {
	t.Helper()
	var out bytes.Buffer
	rules := e.rules
	args := []string{"deny", e.secret, e.prog}
	no32 := ia32.Available()
	if no32 == nil {
		args = append(args, "ia32")
	}
	v, err := launch.Run(context.Background(), launch.Config{
		Path: helperBin, Args: args,
		Stdout: &out, Stderr: &out,
		Sandbox: "test", CgroupParent: cgroup, Label: "deny",
		Restrictions: launch.Restrictions{Seccomp: launch.DefaultSeccomp(), Files: &rules},
	})
	if err != nil {
		t.Fatalf("launch: %v\n%s", err, out.String())
	}
	if v.Outcome != launch.OutcomeExited || v.ExitCode != 0 {
		t.Fatalf("helper: %s\n%s", v, out.String())
	}
	res := map[string]syscall.Errno{}
	for _, l := range strings.Split(out.String(), "\n") {
		k, val, ok := strings.Cut(l, "=")
		if n, err := strconv.Atoi(val); ok && err == nil {
			res[k] = syscall.Errno(n)
		}
	}
	want := map[string]syscall.Errno{
		"mount": syscall.EPERM, "ptrace": syscall.EPERM, "socket_packet": syscall.EPERM,
		"open": syscall.EACCES, "execve": syscall.EACCES, "socket_raw_unprivileged": syscall.EPERM,
	}
	if no32 == nil {
		want["ia32_ptrace"] = syscall.EPERM
	} else {
		t.Logf("ia32_ptrace not made: %v", no32)
		t.Run("ia32_ptrace", func(t *testing.T) { t.Skip(no32.Error()) })
	}
	for k, w := range want {
		if got, ok := res[k]; !ok || got != w {
			t.Errorf("%s: %v, want %v (the restrictions must refuse it)\n%s", k, got, w, out.String())
		}
	}
	return v, res
}

// TestDenialsRecorded: the refusals of the launcher's seccomp filter and
// Landlock ruleset, which no LSM hook or sys_enter program sees, arrive as
// DENIED alerts with the syscall, the path as passed, pid, comm and
// sandbox; the kernel's own EPERM (a raw socket without CAP_NET_RAW) is
// not taken for seccomp's; the same refusals outside a sandbox, or with
// recording off, produce nothing.
func TestDenialsRecorded(t *testing.T) {
	_, tr, c, sb, sbID := setupWith(t, recorder.Config{RecordDenials: true}, recorder.AttachOptions{Denials: true})
	e := newDenyEnv(t)
	v, _ := launchDeny(t, e, sb)
	leafID := v.CgroupID
	if leafID == 0 || leafID == sbID {
		t.Fatalf("leaf cgroup id %d (sandbox %d)", leafID, sbID)
	}
	mine := func(ev audit.Event) bool { return int(ev.Process.TGID) == v.PID }
	// The process, not the thread: the Go runtime may run the helper's
	// main goroutine on any of its threads, so PID (the thread) varies.
	checkCommon := func(t *testing.T, ev audit.Event, what string) {
		t.Helper()
		if ev.Verdict != audit.VerdictDenied || !ev.IsAlert() || ev.Process.Comm != "trhelper" ||
			ev.Process.CgroupID != leafID || ev.Sandbox.CgroupID != sbID || ev.Process.TGID != uint32(v.PID) {
			t.Errorf("%s: event %+v, want denied alert from pid %d comm trhelper cgroup %d sandbox %d",
				what, ev, v.PID, leafID, sbID)
		}
	}

	seccompDenial := func(name string) func(audit.Event) bool {
		return func(ev audit.Event) bool {
			return mine(ev) && ev.Mechanism == recorder.MechanismSeccomp && ev.Syscall != nil && ev.Syscall.Name == name
		}
	}
	for _, name := range []string{"mount", "ptrace", "socket"} {
		ev, ok := c.find(seccompDenial(name))
		if !ok {
			t.Errorf("no seccomp denial event for %s", name)
			continue
		}
		checkCommon(t, ev, name)
		if ev.Kind != audit.KindSyscall || ev.Syscall.Ret != -int64(syscall.EPERM) ||
			!strings.Contains(ev.Message, "refused by the seccomp filter (EPERM)") {
			t.Errorf("%s: event %+v syscall %+v", name, ev, *ev.Syscall)
		}
		if name == "socket" && !strings.Contains(ev.Message, "family 17") {
			t.Errorf("socket denial message %q, want family 17 (AF_PACKET)", ev.Message)
		}
	}
	t.Run("ia32_ptrace_event", func(t *testing.T) {
		if err := ia32.Available(); err != nil {
			t.Skip(err.Error())
		}
		ev, ok := c.find(func(ev audit.Event) bool {
			return seccompDenial("ptrace")(ev) && ev.Syscall.Nr == 26 && strings.Contains(ev.Message, "i386 syscall 26")
		})
		if !ok {
			t.Error("no seccomp denial event for the i386 ptrace")
		} else {
			checkCommon(t, ev, "ia32 ptrace")
		}
	})

	for _, want := range []struct{ syscall, path string }{{"openat", e.secret}, {"execve", e.prog}} {
		ev, ok := c.find(func(ev audit.Event) bool {
			return mine(ev) && ev.Kind == audit.KindFileOpen && ev.Syscall != nil && ev.Syscall.Name == want.syscall &&
				ev.File != nil && ev.File.Path == want.path
		})
		if !ok {
			t.Errorf("no Landlock denial event for %s", want.syscall)
			continue
		}
		checkCommon(t, ev, want.syscall)
		if ev.Mechanism != recorder.MechanismLandlock || ev.File == nil || ev.File.Path != want.path ||
			ev.Syscall.Ret != -int64(syscall.EACCES) ||
			!strings.Contains(ev.Message, "path is the string the caller passed") ||
			strings.Contains(ev.Message, "CAP_DAC_OVERRIDE") {
			t.Errorf("%s: event %+v file %+v, want landlock, path %s", want.syscall, ev, ev.File, want.path)
		}
	}

	// Every denial above is one event; the unprivileged raw socket's
	// EPERM came from the kernel after the syscall entered: no record.
	time.Sleep(150 * time.Millisecond)
	if n := c.count(seccompDenial("socket")); n != 1 {
		t.Errorf("%d socket denials, want 1 (the kernel's EPERM is not seccomp's)", n)
	}
	// Each refusal once: the four seccomp ones (three where the kernel
	// runs no 32-bit calls: no i386 ptrace made), and the two file ones,
	// besides what the Go runtime itself is refused at start (Landlock:
	// /sys/kernel/mm/transparent_hugepage).
	wantSeccomp := 4
	if ia32.Available() != nil {
		wantSeccomp = 3
	}
	if n := c.count(func(ev audit.Event) bool { return mine(ev) && ev.Mechanism == recorder.MechanismSeccomp }); n != wantSeccomp {
		t.Errorf("%d seccomp denial events, want %d", n, wantSeccomp)
	}
	for _, p := range []string{e.secret, e.prog} {
		if n := c.count(func(ev audit.Event) bool { return mine(ev) && ev.File != nil && ev.File.Path == p }); n != 1 {
			t.Errorf("%d denial events for %s, want 1", n, p)
		}
	}
	for _, ev := range c.All() {
		if mine(ev) && ev.Verdict == audit.VerdictDenied {
			t.Logf("%s %s %s: %s", ev.Kind, ev.Mechanism, ev.Syscall.Name, ev.Message)
			if ev.File != nil {
				t.Logf("  path %q", ev.File.Path)
			}
		}
	}

	// The same restrictions outside any sandbox: refused, not recorded.
	outside := enforcetest.Cgroup(t, "outside")
	ov, _ := launchDeny(t, e, outside)
	// Recording off (programs still attached): nothing either.
	if err := tr.SetConfig(recorder.Config{}); err != nil {
		t.Fatal(err)
	}
	offv, _ := launchDeny(t, e, sb)
	time.Sleep(200 * time.Millisecond)
	for _, pid := range []int{ov.PID, offv.PID} {
		pred := func(ev audit.Event) bool { return int(ev.Process.TGID) == pid && ev.Verdict != audit.VerdictAllowed }
		if n := c.count(pred); n != 0 {
			ev, _ := c.find(pred)
			t.Errorf("%d alerts for pid %d (outside the sandbox, or recording off), e.g. %+v", n, pid, ev)
		}
	}
	if id, _ := cgroupfs.ID(outside); id == sbID {
		t.Fatal("outside cgroup is the sandbox")
	}
}

// TestDenialWatchRejectsUnknown: a syscall name outside the x86_64 table
// is an error, not a silent gap in the record.
func TestDenialWatchRejectsUnknown(t *testing.T) {
	eng := enforcetest.Engine(t)
	tr, err := recorder.Load(eng)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	err = tr.SetConfig(recorder.Config{RecordDenials: true, SeccompSyscalls: []string{"ptrace", "no_such_syscall"}})
	if err == nil || !strings.Contains(err.Error(), "no_such_syscall") {
		t.Fatalf("SetConfig with an unknown syscall: %v", err)
	}
}

// BenchmarkDenialsOutside measures what recording denials costs a process
// outside every sandbox (every task of the host pays it): a syscall loop
// bare, then with sys_enter and sys_exit attached and RecordDenials on, in
// the same run; it reports both and their ratio. openat is in the watch
// set (open family), getpid is not.
//
//	go test -run '^$' -bench DenialsOutside ./internal/enforce/recorder/
func BenchmarkDenialsOutside(b *testing.B) {
	eng := enforcetest.Engine(b)
	tr, err := recorder.Load(eng)
	if err != nil {
		b.Fatal(err)
	}
	defer tr.Close()
	if err := tr.SetConfig(recorder.Config{RecordDenials: true}); err != nil {
		b.Fatal(err)
	}
	path, _ := syscall.BytePtrFromString("/dev/null")
	ops := map[string]func(){
		"openat+close": func() {
			fd, _, _ := syscall.RawSyscall6(syscall.SYS_OPENAT, uintptr(0xffffff9c), uintptr(unsafe.Pointer(path)), syscall.O_RDONLY, 0, 0, 0)
			syscall.RawSyscall(syscall.SYS_CLOSE, fd, 0, 0)
		},
		"getpid": func() { syscall.RawSyscall(syscall.SYS_GETPID, 0, 0, 0) },
	}
	for _, name := range []string{"openat+close", "getpid"} {
		op := ops[name]
		b.Run(name, func(b *testing.B) {
			loop := func() time.Duration {
				start := time.Now()
				for i := 0; i < b.N; i++ {
					op()
				}
				return time.Since(start)
			}
			bare := loop()
			links, err := tr.AttachLinks()
			if err != nil {
				b.Fatal(err)
			}
			attached := loop()
			for _, l := range links {
				l.Close()
			}
			n := float64(b.N)
			b.ReportMetric(float64(bare.Nanoseconds())/n, "bare-ns/op")
			b.ReportMetric(float64(attached.Nanoseconds())/n, "attached-ns/op")
			b.ReportMetric(float64(attached)/float64(bare), "ratio")
		})
	}
}

// TestDenialsAttachDetach: an agent that starts without the syscall
// tracepoints (nothing linked for them in the kernel) attaches them when
// the first launched command announces itself, the refusals are then
// recorded, and they are detached again when no command needs them, while
// exec and exit recording stays.
func TestDenialsAttachDetach(t *testing.T) {
	eng, tr, c, sb, _ := setupWith(t, recorder.Config{}, recorder.AttachOptions{})
	pins := enforce.LinkPinDir(eng.PinDir(), recorder.Group)
	expect := func(state string, want bool) {
		t.Helper()
		ids, err := tr.ProgramIDs()
		if err != nil {
			t.Fatal(err)
		}
		links, err := enforce.LinkedPrograms()
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{recorder.ProgSysEnter, recorder.ProgSysExit} {
			_, err := os.Stat(filepath.Join(pins, p))
			if (links[ids[p]] > 0) != want || (err == nil) != want {
				t.Errorf("%s: %s has %d links in the kernel (pin: %v), want attached=%v", state, p, links[ids[p]], err, want)
			}
		}
		for _, p := range []string{recorder.ProgExec, recorder.ProgExit} {
			if links[ids[p]] != 1 {
				t.Errorf("%s: %s has %d links, want 1", state, p, links[ids[p]])
			}
		}
		if tr.DenialsAttached() != want {
			t.Errorf("%s: DenialsAttached() = %v, the kernel says %v", state, tr.DenialsAttached(), want)
		}
	}
	expect("before any command", false)
	for i := 0; i < 2; i++ { // idempotent
		if err := tr.SetSyscalls(recorder.AttachOptions{Denials: true}); err != nil {
			t.Fatal(err)
		}
	}
	if err := tr.SetConfig(recorder.Config{RecordDenials: true}); err != nil {
		t.Fatal(err)
	}
	expect("a command announced", true)
	e := newDenyEnv(t)
	v, _ := launchDeny(t, e, sb)
	poll.Eventually(t, 5*time.Second, func() bool {
		_, ok := c.find(func(ev audit.Event) bool {
			return int(ev.Process.TGID) == v.PID && ev.Mechanism == recorder.MechanismSeccomp && ev.Syscall != nil && ev.Syscall.Name == "mount"
		})
		return ok
	}, "no seccomp denial recorded after the tracepoints were attached")
	if err := tr.SetConfig(recorder.Config{}); err != nil {
		t.Fatal(err)
	}
	if err := tr.SetSyscalls(recorder.AttachOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("no command left", false)
	// The syscall stream alone needs sys_enter only.
	if err := tr.SetSyscalls(recorder.AttachOptions{Syscalls: true}); err != nil {
		t.Fatal(err)
	}
	ids, _ := tr.ProgramIDs()
	links, _ := enforce.LinkedPrograms()
	if links[ids[recorder.ProgSysEnter]] != 1 || links[ids[recorder.ProgSysExit]] != 0 {
		t.Errorf("syscall stream: sys_enter %d and sys_exit %d links, want 1 and 0", links[ids[recorder.ProgSysEnter]], links[ids[recorder.ProgSysExit]])
	}
}
