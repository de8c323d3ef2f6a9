package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/limits"
)

// threadBomb starts threads until the kernel refuses one and prints how
// many ran: a fork bomb made of threads (each is a task for pids.max),
// cheap in memory, that ends by itself.
const threadBomb = `
import threading
threading.stack_size(65536)
stop = threading.Event()
n = 0
try:
    while n < 20000:
        threading.Thread(target=stop.wait, daemon=True).start()
        n += 1
except RuntimeError:
    pass
print("threads=%d" % n, flush=True)
stop.set()
`

// TestExecDefaultPIDsLimit: a sandbox on the restricted preset, with no
// limits of its own, gets the preset's pids limit: a command that keeps
// starting threads stops at 4096 tasks (the kernel refuses the next
// clone, the run reports the hit on stderr and in the ledger), and the
// host can still start processes; an ordinary command beside it prints
// no limits line (nothing it would not print without the limit).
func TestExecDefaultPIDsLimit(t *testing.T) {
	h, err := limits.Detect()
	if err != nil || h.Mechanism(limits.PIDs) == limits.None {
		t.Skipf("no pids controller on this host (%v)", err)
	}
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 is not installed (scripts/setup.sh installs it)")
	}
	tb := newTestbed(t, "", "{enabled: false}")

	out, code := tb.watcher("exec", "--policy", tb.policy, "--", "sh", "-c", "echo plain")
	if code != 0 || !strings.Contains(out, "plain") || strings.Contains(out, "watcher: limits") {
		t.Fatalf("plain command: exit %d, want 0 and no limits line:\n%s", code, out)
	}

	script := filepath.Join(tb.ws, "bomb.py")
	if err := os.WriteFile(script, []byte(threadBomb), 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	out, code = tb.watcher("exec", "--policy", tb.policy, "--kill", "2m", "--", py, script)
	t.Logf("thread bomb (%s): exit %d\n%s", time.Since(start).Round(time.Millisecond), code, out)
	m := regexp.MustCompile(`threads=(\d+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("the bomb printed no count (exit %d):\n%s", code, out)
	}
	n, _ := strconv.Atoi(m[1])
	if n >= 4096 || n < 4000 {
		t.Errorf("%d threads started, want just under the preset's 4096 tasks", n)
	}
	if !regexp.MustCompile(`watcher: limits .*pids\.max_hits=[1-9]\d* pids\.max=4096`).MatchString(out) {
		t.Errorf("no pids limit hit reported on stderr:\n%s", out)
	}
	for i := 0; i < 3; i++ {
		if b, err := exec.Command("/bin/true").CombinedOutput(); err != nil {
			t.Fatalf("host could not start a process after the bomb: %v %s", err, b)
		}
	}
}

// TestExecPrivateAgentLedgerBusy: a second `watcher exec` without an
// agent, while another holds the ledger, fails with a message that says
// what to do, and leaves nothing behind (its pins, sockets and cgroups
// are removed although its agent never started).
func TestExecPrivateAgentLedgerBusy(t *testing.T) {
	tb := newTestbed(t, "", "{enabled: false}")
	if err := os.MkdirAll(tb.ledger, 0o700); err != nil {
		t.Fatal(err)
	}
	lock, err := os.OpenFile(filepath.Join(tb.ledger, "LOCK"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(tb.bin, "exec", "--policy", tb.policy, "--", "sh", "-c", "echo ran")
	b, err := cmd.CombinedOutput()
	out := string(b)
	if err == nil || strings.Contains(out, "ran\n") || !strings.Contains(out, "in use by another process") ||
		!strings.Contains(out, "watcher run") {
		t.Errorf("exec with the ledger held: %v, want a failure naming the busy ledger and the agent:\n%s", err, out)
	}
	// Its private agent's pins are named after its pid.
	pins := filepath.Join(filepath.Dir(tb.pinDir), "watcher-exec-"+strconv.Itoa(cmd.Process.Pid))
	if _, err := os.Stat(pins); err == nil {
		t.Errorf("the failed private agent left its pins in %s", pins)
		enforce.Unpin(pins)
	}
	// The benign neighbour: once the ledger is free the same command runs.
	unix.Flock(int(lock.Fd()), unix.LOCK_UN)
	if out, code := tb.watcher("exec", "--policy", tb.policy, "--", "sh", "-c", "echo ran"); code != 0 || !strings.Contains(out, "ran") {
		t.Errorf("exec with the ledger free: exit %d:\n%s", code, out)
	}
}

// TestExecRemovesStalePrivateAgentPins: the pins of a private agent
// whose `watcher exec` was SIGKILLed (its pinned links would keep the
// programs attached for good) are removed by the next private agent; a
// live one's are left alone.
func TestExecRemovesStalePrivateAgentPins(t *testing.T) {
	tb := newTestbed(t, "", "{enabled: false}")
	parent := filepath.Dir(tb.pinDir)
	dead := exec.Command("/bin/true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	live := exec.Command("sleep", "60")
	if err := live.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { live.Process.Kill(); live.Wait() }()
	stale := filepath.Join(parent, "watcher-exec-"+strconv.Itoa(dead.Process.Pid))
	alive := filepath.Join(parent, "watcher-exec-"+strconv.Itoa(live.Process.Pid))
	for _, d := range []string{stale, alive} {
		if err := os.MkdirAll(filepath.Join(d, "maps"), 0o700); err != nil {
			t.Fatal(err)
		}
		m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Pin(filepath.Join(d, "maps", "test_map")); err != nil {
			t.Fatal(err)
		}
		m.Close()
		t.Cleanup(func() { enforce.Unpin(d) })
	}
	if out, code := tb.watcher("exec", "--policy", tb.policy, "--", "true"); code != 0 {
		t.Fatalf("exec: exit %d\n%s", code, out)
	} else if !strings.Contains(out, "removed the pins of a private agent that was killed") {
		t.Errorf("exec did not say it removed the stale pins:\n%s", out)
	}
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale pins of dead pid %d still there: %v", dead.Process.Pid, err)
	}
	if _, err := os.Stat(filepath.Join(alive, "maps", "test_map")); err != nil {
		t.Errorf("a live private agent's pins were touched: %v", err)
	}
}
