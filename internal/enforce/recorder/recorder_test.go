package recorder_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/enforcetest"
	"github.com/watcherhq/watcher/internal/enforce/recorder"
	"github.com/watcherhq/watcher/internal/launch"
	"github.com/watcherhq/watcher/internal/testkit/collect"
)

var helperBin string

func TestMain(m *testing.M) {
	// The denial tests start commands with internal/launch, which
	// re-executes this binary to apply the restrictions.
	launch.Init()
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	dir, err := os.MkdirTemp("", "trhelper")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	helperBin = filepath.Join(dir, "trhelper")
	build := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", helperBin, "./testdata/trhelper")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build helper: %v\n%s", err, out)
		return 1
	}
	return m.Run()
}

// collector is the events the reader emits; find waits up to 3 s.
type collector struct{ collect.Events }

func (c *collector) find(pred func(audit.Event) bool) (audit.Event, bool) {
	return c.Find(3*time.Second, pred)
}

func (c *collector) count(pred func(audit.Event) bool) int { return c.Count(pred) }

func setup(t *testing.T, cfg recorder.Config) (*enforce.Engine, *recorder.Recorder, *collector, string, uint64) {
	t.Helper()
	return setupWith(t, cfg, recorder.AttachOptions{Syscalls: true})
}

func setupWith(t *testing.T, cfg recorder.Config, opts recorder.AttachOptions) (*enforce.Engine, *recorder.Recorder, *collector, string, uint64) {
	t.Helper()
	eng := enforcetest.Engine(t)
	sb := enforcetest.Cgroup(t, "sb")
	sbID, err := eng.AddSandbox(sb, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := recorder.Load(eng)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	if err := tr.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	if err := tr.Attach(opts); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { recorder.Detach(eng.PinDir()) })
	rd := eng.NewReader(enforce.ReaderOptions{PollInterval: 10 * time.Millisecond})
	recorder.Register(rd)
	c := &collector{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); rd.Run(ctx) }()
	go c.Drain(rd.Events())
	t.Cleanup(func() { cancel(); <-done })
	return eng, tr, c, sb, sbID
}

func run(t *testing.T, cg string, name string, args ...string) (int, string) {
	t.Helper()
	cmd := enforcetest.Command(t, cg, name, args...)
	out, _ := cmd.CombinedOutput()
	return cmd.Process.Pid, string(out)
}

// TestExecExitParentChain: an exec in a nested sandbox cgroup yields an exec
// event with the resolved exe, argv and parent chain, and an exit event
// with the status; nothing is recorded outside.
func TestExecExitParentChain(t *testing.T) {
	_, _, c, sb, sbID := setup(t, recorder.Config{})
	leaf := enforcetest.Child(t, enforcetest.Child(t, sb, "nested"), "leaf")
	leafID, _ := cgroupfs.ID(leaf)
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("needs sh")
	}
	shReal, _ := filepath.EvalSymlinks(sh)
	pid, _ := run(t, leaf, sh, "-c", "exit 3")
	ev, ok := c.find(func(ev audit.Event) bool { return ev.Kind == audit.KindExec && int(ev.Process.TGID) == pid })
	if !ok {
		t.Fatal("no exec event")
	}
	if ev.Process.Exe != shReal || strings.Join(ev.Process.Args, " ") != "sh -c exit 3" && strings.Join(ev.Process.Args, " ") != sh+" -c exit 3" {
		t.Errorf("exe %q args %q, want %s [sh -c exit 3]", ev.Process.Exe, ev.Process.Args, shReal)
	}
	wantParent := fmt.Sprintf("parents: %d(", os.Getpid())
	if !strings.HasPrefix(ev.Message, wantParent) || ev.Process.CgroupID != leafID || ev.Sandbox.CgroupID != sbID {
		t.Errorf("exec event %+v, want %s... cgroup %d sandbox %d", ev, wantParent, leafID, sbID)
	}
	ex, ok := c.find(func(ev audit.Event) bool { return ev.Kind == audit.KindExit && int(ev.Process.TGID) == pid })
	if !ok {
		t.Fatal("no exit event")
	}
	if !strings.HasPrefix(ex.Message, "exit code 3; parents: ") {
		t.Errorf("exit event message %q", ex.Message)
	}
	// Outside: nothing.
	opid, _ := run(t, "", sh, "-c", "exit 0")
	time.Sleep(100 * time.Millisecond)
	if n := c.count(func(ev audit.Event) bool { return int(ev.Process.TGID) == opid }); n != 0 {
		t.Errorf("%d events for an unsandboxed process", n)
	}
}

// TestModuleAttempts: module and kexec loading attempts fail here (ENOSYS)
// but are recorded as alerts, with the file for finit_module.
func TestModuleAttempts(t *testing.T) {
	_, _, c, sb, _ := setup(t, recorder.Config{ModuleAlerts: true, ModuleRuleID: 5})
	for _, op := range []string{"init_module", "finit_module"} {
		leaf := enforcetest.Child(t, sb, op)
		pid, out := run(t, leaf, helperBin, op)
		ev, ok := c.find(func(ev audit.Event) bool { return ev.Kind == audit.KindModule && int(ev.Process.TGID) == pid })
		if !ok {
			t.Fatalf("%s: no alert (helper said %q)", op, out)
		}
		if ev.Verdict != audit.VerdictRecorded || !ev.IsAlert() || ev.Rule != "rule-5" || ev.Syscall.Name != op {
			t.Errorf("%s event %+v", op, ev)
		}
		if op == "finit_module" && (ev.File == nil || ev.File.Path != helperBin) {
			t.Errorf("finit_module file %+v, want %s", ev.File, helperBin)
		}
	}
	pid, _ := run(t, "", helperBin, "init_module")
	time.Sleep(100 * time.Millisecond)
	if n := c.count(func(ev audit.Event) bool { return int(ev.Process.TGID) == pid }); n != 0 {
		t.Errorf("%d events outside", n)
	}
}

// TestSampledSyscalls: totals are exact per sandbox and syscall while only
// 1 in N events travel.
func TestSampledSyscalls(t *testing.T) {
	const every, calls = 100, 50000
	_, tr, c, sb, sbID := setup(t, recorder.Config{SampleEvery: every})
	leaf := enforcetest.Child(t, sb, "leaf")
	pid, out := run(t, leaf, helperBin, "getpid", fmt.Sprint(calls))
	counts, err := tr.Counts()
	if err != nil {
		t.Fatal(err)
	}
	got := counts[recorder.CountKey{SandboxCgroup: sbID, Nr: uint32(syscall.SYS_GETPID)}]
	if got < calls || got > calls+100 {
		t.Fatalf("getpid total %d, want %d (+ the runtime's few); helper: %s", got, calls, out)
	}
	time.Sleep(200 * time.Millisecond)
	samples := c.count(func(ev audit.Event) bool {
		return ev.Kind == audit.KindSyscall && int(ev.Process.TGID) == pid && ev.Syscall.Nr == int64(syscall.SYS_GETPID)
	})
	// Per CPU, one in `every`: between calls/every - ncpu and calls/every + 1.
	if samples < calls/every-runtime.NumCPU() || samples > calls/every+1 {
		t.Fatalf("%d getpid samples for %d calls at 1/%d", samples, calls, every)
	}
	ev, _ := c.find(func(ev audit.Event) bool { return ev.Kind == audit.KindSyscall && int(ev.Process.TGID) == pid })
	if ev.Syscall.Count != every || ev.Verdict != audit.VerdictAllowed || ev.IsAlert() {
		t.Errorf("sample %+v", ev)
	}
	t.Logf("getpid total %d, %d samples", got, samples)
}

func TestProbe(t *testing.T) {
	eng := enforcetest.Engine(t)
	fexit := map[string]bool{}
	for _, n := range recorder.FexitPrograms {
		fexit[n] = true
	}
	for name, err := range recorder.Probe(eng) {
		switch {
		case err != nil && fexit[name]:
			// Optional: sys_enter and sys_exit record refusals instead.
			t.Logf("%s does not load here (sys_exit records refusals): %v", name, err)
		case err != nil:
			t.Errorf("%s does not load: %v", name, err)
		}
	}
}
