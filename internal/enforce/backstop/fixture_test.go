package backstop_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/testkit/poll"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/backstop"
	"github.com/watcherhq/watcher/internal/enforce/enforcetest"
	"github.com/watcherhq/watcher/internal/enforce/rules/backstoprules"
)

// fixture is a loaded, attached backstop with a reader collecting events,
// one sandbox cgroup (with a nested cgroup below it) and an unsandboxed one.
type fixture struct {
	eng      *enforce.Engine
	bs       *backstop.Backstop
	sandbox  string // sandbox root cgroup
	nested   string // cgroup below the sandbox root
	outside  string // a cgroup outside every sandbox
	sbID     uint64
	secret   string // temp file under an exact path rule
	secretID uint32 // its rule id
	rules    backstoprules.Rules
	mounts   []backstop.MountKill

	mu     sync.Mutex
	events []audit.Event
	seq    int
}

const secretContent = "SECRET-backstop-test\n"

// helperBin is testdata/bshelper, built by TestMain (or WATCHER_BSHELPER).
var helperBin string

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	// A helper built beforehand (a guest without a Go toolchain or a
	// module cache: test/vm/run.sh --hostroot --env WATCHER_BSHELPER=PATH).
	if p := os.Getenv("WATCHER_BSHELPER"); p != "" {
		helperBin = p
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "bshelper")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	helperBin = filepath.Join(dir, "bshelper")
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	build := exec.Command(goBin, "build", "-o", helperBin, "./testdata/bshelper")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build helper: %v\n%s", err, out)
		return 1
	}
	return m.Run()
}

func newFixture(t *testing.T, edit func(*backstoprules.Rules)) *fixture {
	t.Helper()
	eng := enforcetest.Engine(t)
	f := &fixture{eng: eng}
	f.sandbox = enforcetest.Cgroup(t, "sb")
	f.nested = enforcetest.Child(t, f.sandbox, "nested")
	f.outside = enforcetest.Child(t, filepath.Dir(f.sandbox), "outside")
	var err error
	if f.sbID, err = eng.AddSandbox(f.sandbox, 1, 0); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	f.secret = filepath.Join(dir, "secret")
	if err := os.WriteFile(f.secret, []byte(secretContent), 0o600); err != nil {
		t.Fatal(err)
	}
	f.secretID = 77
	f.rules = backstop.DefaultRules()
	f.rules.Paths = append(f.rules.Paths, backstoprules.PathRule{
		Path: f.secret, Ops: backstoprules.OpRead | backstoprules.OpWrite,
		Rule: backstoprules.Rule{Action: enforce.ActionKill, ID: f.secretID},
	})
	if edit != nil {
		edit(&f.rules)
	}
	f.bs, err = backstop.Load(eng)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.bs.Close() })
	if err := f.bs.SetRules(f.rules); err != nil {
		t.Fatal(err)
	}
	if err := f.bs.Attach(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { backstop.Detach(eng.PinDir()) })

	rd := eng.NewReader(enforce.ReaderOptions{PollInterval: 10 * time.Millisecond})
	backstop.RegisterWithHandlers(rd, backstop.Handlers{OnMount: func(mk backstop.MountKill) {
		f.mu.Lock()
		f.mounts = append(f.mounts, mk)
		f.mu.Unlock()
	}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := rd.Run(ctx); err != nil {
			t.Errorf("reader: %v", err)
		}
	}()
	go func() {
		for ev := range rd.Events() {
			f.mu.Lock()
			f.events = append(f.events, ev)
			f.mu.Unlock()
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return f
}

// leaf returns a fresh leaf cgroup under parent (cgroup.kill quirk).
func (f *fixture) leaf(t *testing.T, parent string) string {
	f.mu.Lock()
	f.seq++
	name := fmt.Sprintf("leaf%d", f.seq)
	f.mu.Unlock()
	return enforcetest.Child(t, parent, name)
}

// result of a helper run.
type result struct {
	pid    int
	cgroup uint64
	killed bool
	out    string
	err    error
}

// run starts the helper op in a fresh leaf below parent ("" = no cgroup
// change) and waits for it.
func (f *fixture) run(t *testing.T, parent, op string, args ...string) result {
	t.Helper()
	var cg string
	if parent != "" {
		cg = f.leaf(t, parent)
	}
	cmd := enforcetest.Command(t, cg, helperBin, append([]string{op}, args...)...)
	cmd.WaitDelay = 3 * time.Second
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", op, err)
	}
	err := cmd.Wait()
	if cg != "" {
		cgroupfs.Kill(cg) // partners left behind
	}
	r := result{pid: cmd.Process.Pid, out: out.String(), err: err}
	if cg != "" {
		r.cgroup, _ = cgroupfs.ID(cg)
	}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
		r.killed = true
	}
	return r
}

// waitEvent waits for an event of process pid matching pred.
func (f *fixture) waitEvent(t *testing.T, pid int, pred func(audit.Event) bool) (audit.Event, bool) {
	t.Helper()
	var found audit.Event
	ok := poll.Within(3*time.Second, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, ev := range f.events {
			if int(ev.Process.TGID) == pid && (pred == nil || pred(ev)) {
				found = ev
				return true
			}
		}
		return false
	})
	return found, ok
}

func (f *fixture) eventsOf(pid int) []audit.Event {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []audit.Event
	for _, ev := range f.events {
		if int(ev.Process.TGID) == pid {
			out = append(out, ev)
		}
	}
	return out
}

// expectKilled checks a sandboxed run: killed by SIGKILL and a killed event
// with the process, cgroup and sandbox, passing check.
func (f *fixture) expectKilled(t *testing.T, r result, check func(audit.Event) error) audit.Event {
	t.Helper()
	if !r.killed {
		t.Fatalf("not killed (err %v), output:\n%s", r.err, r.out)
	}
	ev, ok := f.waitEvent(t, r.pid, func(ev audit.Event) bool { return ev.Verdict == audit.VerdictKilled })
	if !ok {
		t.Fatalf("no killed event for pid %d; events: %+v", r.pid, f.eventsOf(r.pid))
	}
	if ev.Mechanism != backstoprules.Mechanism || ev.Severity != audit.SeverityAlert {
		t.Errorf("mechanism %q severity %q", ev.Mechanism, ev.Severity)
	}
	if ev.Process.CgroupID != r.cgroup || ev.Sandbox.CgroupID != f.sbID {
		t.Errorf("event cgroup %d sandbox %d, want %d and %d", ev.Process.CgroupID, ev.Sandbox.CgroupID, r.cgroup, f.sbID)
	}
	// Requests submitted by an SQPOLL ring run in its iou-sqp thread.
	if ev.Process.Comm != "bshelper" && !strings.HasPrefix(ev.Process.Comm, "iou-sqp-") {
		t.Errorf("comm %q", ev.Process.Comm)
	}
	if check != nil {
		if err := check(ev); err != nil {
			t.Errorf("event %+v: %v", ev, err)
		}
	}
	return ev
}

func expectSurvived(t *testing.T, r result) {
	t.Helper()
	if r.killed || r.err != nil {
		t.Fatalf("outside the sandbox: killed=%v err=%v, output:\n%s", r.killed, r.err, r.out)
	}
}

func exe(name string) string {
	p, err := exec.LookPath(name)
	if err != nil {
		return ""
	}
	return p
}
