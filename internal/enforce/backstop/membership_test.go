package backstop_test

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/enforcetest"
	"github.com/watcherhq/watcher/internal/enforce/rules/backstoprules"
)

// The sandbox a syscall is judged for follows the task's cgroup exactly:
// whatever verdict an earlier syscall left cached (the per-cgroup
// membership, the verdict cache), a task that enters a sandbox is judged
// from its next syscall and one that leaves is not. Each case warms the
// caches first with a loop of opens, then moves the task (cgroup.procs
// written by itself or by another process, cgroup v1 and v2, clone3 with
// CLONE_INTO_CGROUP, exec) or reloads the sandbox set or the rules, then
// makes the call: the secret's read is killed inside, `ls /` is its benign
// neighbour.

// driven is a bshelper running commands (testdata/bshelper/cmds.go).
type driven struct {
	in    io.WriteCloser
	lines chan string
	pid   int
	done  chan struct{} // closed when the process was reaped
	// killed and werr say how it ended, once done is closed.
	killed bool
	werr   error
}

// drive starts bshelper cmds in cgroup cg.
func (f *fixture) drive(t *testing.T, cg string) *driven {
	t.Helper()
	cmd := enforcetest.Command(t, cg, helperBin, "cmds")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	// A pipe of our own, so Wait (run at once below) does not close the
	// read end under the scanner.
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	d := &driven{in: in, lines: make(chan string, 16), pid: cmd.Process.Pid, done: make(chan struct{})}
	go func() {
		defer pr.Close()
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			d.lines <- sc.Text()
		}
		close(d.lines)
	}()
	go func() {
		d.werr = cmd.Wait()
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
			d.killed = true
		}
		close(d.done)
	}()
	t.Cleanup(func() {
		in.Close()
		cmd.Process.Kill()
		<-d.done
	})
	return d
}

// wait waits for the process to end: whether SIGKILL ended it, and Wait's error.
func (d *driven) wait(t *testing.T) (bool, error) {
	t.Helper()
	select {
	case <-d.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("pid %d did not end", d.pid)
	}
	return d.killed, d.werr
}

// do sends a command and returns its reply; ok false when the process
// ended without one.
func (d *driven) do(t *testing.T, line string) (string, bool) {
	t.Helper()
	if _, err := fmt.Fprintln(d.in, line); err != nil {
		return "", false
	}
	select {
	case r, ok := <-d.lines:
		return r, ok
	case <-time.After(10 * time.Second):
		t.Fatalf("pid %d: no reply to %q", d.pid, line)
		return "", false
	}
}

// must sends a command that has to succeed with reply want.
func (d *driven) must(t *testing.T, line, want string) {
	t.Helper()
	if r, ok := d.do(t, line); !ok || r != want {
		t.Fatalf("pid %d: %q: reply %q (alive %v), want %q", d.pid, line, r, ok, want)
	}
}

// killedBy checks the process died of SIGKILL with a killed event of the
// sandbox cgroup sb (0: f.sbID).
func (f *fixture) killedBy(t *testing.T, d *driven, sb uint64) {
	t.Helper()
	killed, err := d.wait(t)
	if !killed {
		t.Fatalf("pid %d not killed (%v)", d.pid, err)
	}
	if sb == 0 {
		sb = f.sbID
	}
	ev, ok := f.waitEvent(t, d.pid, func(ev audit.Event) bool { return ev.Verdict == audit.VerdictKilled })
	if !ok {
		t.Fatalf("no killed event for pid %d; events %+v", d.pid, f.eventsOf(d.pid))
	}
	if ev.Sandbox.CgroupID != sb {
		t.Errorf("killed event's sandbox %d, want %d", ev.Sandbox.CgroupID, sb)
	}
}

func (d *driven) quit(t *testing.T) {
	t.Helper()
	fmt.Fprintln(d.in, "quit")
	if killed, err := d.wait(t); killed || err != nil {
		t.Fatalf("pid %d: killed %v, %v", d.pid, killed, err)
	}
}

func procs(cg string) string { return filepath.Join(cg, "cgroup.procs") }

func writePid(t *testing.T, cg string, pid int) {
	t.Helper()
	if err := os.WriteFile(procs(cg), []byte(strconv.Itoa(pid)), 0); err != nil {
		t.Fatal(err)
	}
}

const warm = "loop 300 "

func TestMembershipMoveIn(t *testing.T) {
	f := newFixture(t, nil)
	// The task writes cgroup.procs itself and opens at once.
	d := f.drive(t, f.leaf(t, f.outside))
	d.must(t, warm+f.secret, "looped") // outside: allowed, verdict cached
	if r, ok := d.do(t, "moveopen "+procs(f.leaf(t, f.sandbox))+" "+f.secret); ok {
		t.Fatalf("secret read after moving into the sandbox: %q", r)
	}
	f.killedBy(t, d, 0)

	n := f.drive(t, f.leaf(t, f.outside))
	n.must(t, warm+f.secret, "looped")
	n.must(t, "moveopen "+procs(f.leaf(t, f.sandbox))+" /", "opened")
	n.must(t, warm+"/", "looped")
	n.quit(t)

	// Moved by another process (this test), between two of its calls.
	d = f.drive(t, f.leaf(t, f.outside))
	d.must(t, warm+f.secret, "looped")
	writePid(t, f.leaf(t, f.sandbox), d.pid)
	if r, ok := d.do(t, "open "+f.secret); ok {
		t.Fatalf("secret read after being moved into the sandbox: %q", r)
	}
	f.killedBy(t, d, 0)
}

func TestMembershipMoveOut(t *testing.T) {
	// Moving a task out is itself an escape the backstop kills by
	// default; allowed here, so what is left to check is the judging.
	f := newFixture(t, func(r *backstoprules.Rules) { r.CgroupEscape = backstoprules.Rule{Action: enforce.ActionAllow} })
	d := f.drive(t, f.leaf(t, f.sandbox))
	d.must(t, warm+"/", "looped") // inside: membership and verdict cache warm
	writePid(t, f.leaf(t, f.outside), d.pid)
	d.must(t, "open "+f.secret, "opened")
	d.must(t, warm+f.secret, "looped")
	// And back in: judged again from the next call.
	writePid(t, f.leaf(t, f.nested), d.pid)
	d.must(t, warm+"/", "looped")
	if r, ok := d.do(t, "open "+f.secret); ok {
		t.Fatalf("secret read after moving back in: %q", r)
	}
	f.killedBy(t, d, 0)
}

func TestMembershipCgroupV1Move(t *testing.T) {
	// Sandboxes are cgroup v2 cgroups: a move in a v1 hierarchy changes
	// nothing, either way.
	v1 := "/sys/fs/cgroup/memory"
	if st, err := os.Stat(filepath.Join(v1, "cgroup.procs")); err != nil || st.IsDir() {
		t.Skipf("no cgroup v1 memory hierarchy at %s", v1)
	}
	f := newFixture(t, nil)
	dir := filepath.Join(v1, fmt.Sprintf("watcher-test-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for i := 0; i < 50 && os.Remove(dir) != nil; i++ {
			time.Sleep(100 * time.Millisecond)
		}
	})
	out := f.drive(t, f.leaf(t, f.outside))
	in := f.drive(t, f.leaf(t, f.sandbox))
	out.must(t, warm+f.secret, "looped")
	in.must(t, warm+"/", "looped")
	writePid(t, dir, out.pid)
	writePid(t, dir, in.pid)
	out.must(t, "open "+f.secret, "opened")
	in.must(t, "open /", "opened")
	if r, ok := in.do(t, "open "+f.secret); ok {
		t.Fatalf("secret read in the sandbox after a v1 move: %q", r)
	}
	f.killedBy(t, in, 0)
	out.quit(t)
}

func TestMembershipCloneIntoCgroup(t *testing.T) {
	f := newFixture(t, nil)
	d := f.drive(t, f.leaf(t, f.outside))
	d.must(t, warm+f.secret, "looped")
	// The child starts in the sandbox (clone3 CLONE_INTO_CGROUP): its
	// parent's verdict is not its own.
	d.must(t, "spawn "+f.leaf(t, f.sandbox)+" open "+f.secret, "child killed")
	d.must(t, "spawn "+f.leaf(t, f.sandbox)+" open /", "child ok")
	// And a child started outside from outside is not judged.
	d.must(t, "spawn "+f.leaf(t, f.outside)+" open "+f.secret, "child ok")
	d.quit(t)
}

func TestMembershipExec(t *testing.T) {
	cat := exe("cat")
	if cat == "" {
		t.Skip("no cat")
	}
	f := newFixture(t, nil)
	in := f.drive(t, f.leaf(t, f.sandbox))
	in.must(t, warm+"/", "looped")
	if r, ok := in.do(t, "exec "+cat+" "+f.secret); ok && strings.Contains(r, "SECRET") {
		t.Fatalf("cat read the secret in the sandbox: %q", r)
	}
	f.killedBy(t, in, 0)
	out := f.drive(t, f.leaf(t, f.outside))
	out.must(t, warm+f.secret, "looped")
	if r, ok := out.do(t, "exec "+cat+" "+f.secret); !ok || !strings.Contains(r, "SECRET") {
		t.Fatalf("cat outside: %q (alive %v)", r, ok)
	}
	if killed, err := out.wait(t); killed || err != nil {
		t.Fatalf("cat outside: killed %v, %v", killed, err)
	}
}

// A sandbox registered and removed while its tasks make calls in a loop.
func TestMembershipReloadSandboxes(t *testing.T) {
	f := newFixture(t, nil)
	p := f.leaf(t, f.outside) // not a sandbox yet
	spinner := f.drive(t, enforcetest.Child(t, p, "x"))
	neighbour := f.drive(t, enforcetest.Child(t, p, "y"))
	spinner.must(t, "spin "+f.secret, "spinning")
	neighbour.must(t, "spin /", "spinning")
	time.Sleep(100 * time.Millisecond)
	cg, err := f.eng.AddSandbox(p, 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.killedBy(t, spinner, cg)
	// The neighbour went on listing /; now outside again, the secret is
	// its to read.
	if err := f.eng.RemoveSandbox(cg); err != nil {
		t.Fatal(err)
	}
	neighbour.must(t, "open "+f.secret, "opened")
	neighbour.must(t, warm+f.secret, "looped")
	neighbour.quit(t)
}

// A rule set reloaded while a task opens the file it starts to refuse.
func TestMembershipReloadRules(t *testing.T) {
	f := newFixture(t, nil)
	other := filepath.Join(t.TempDir(), "other")
	if err := os.WriteFile(other, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	d := f.drive(t, f.leaf(t, f.sandbox))
	d.must(t, "spin "+other, "spinning") // allowed, so cached
	time.Sleep(100 * time.Millisecond)
	r := f.rules
	r.Paths = append(append([]backstoprules.PathRule{}, r.Paths...), backstoprules.PathRule{
		Path: other, Ops: backstoprules.OpRead, Rule: backstoprules.Rule{Action: enforce.ActionKill, ID: 78},
	})
	if err := f.bs.SetRules(r); err != nil {
		t.Fatal(err)
	}
	f.killedBy(t, d, 0)
	n := f.drive(t, f.leaf(t, f.sandbox))
	n.must(t, warm+"/", "looped")
	n.quit(t)
}
