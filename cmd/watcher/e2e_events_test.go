package main

import (
	"bufio"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/ledger"
	"github.com/watcherhq/watcher/internal/testkit/e2etest"
	"github.com/watcherhq/watcher/internal/testkit/poll"
)

// floodBinary builds testdata/flood once, without cgo: it must not link
// cilium/ebpf (the kill backstop answers bpf(2) in a sandbox with SIGKILL).
func floodBinary(t *testing.T) string { return e2etest.Binary(t, "./testdata/flood", "CGO_ENABLED=0") }

// ledgerEvents reads every record of a (closed) ledger.
func ledgerEvents(t *testing.T, dir string) []audit.Event {
	t.Helper()
	r, err := ledger.NewReader(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var out []audit.Event
	for {
		rec, err := r.Next()
		if err != nil {
			break
		}
		out = append(out, rec.Event)
	}
	return out
}

// vmHWM is a process's peak resident memory in KiB.
func vmHWM(pid int) int {
	data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	m := regexp.MustCompile(`VmHWM:\s+(\d+) kB`).FindSubmatch(data)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(string(m[1]))
	return n
}

// TestAlertsSurviveFlood: a sandbox floods routine events (the syscall
// stream of an open loop) and a million refused connects, and in the middle
// and at the end does a distinct forbidden operation (reading /etc/shadow).
// Both records reach the ledger; the refused connects are folded into few
// records whose counts add up exactly to what the process saw; no alert is
// dropped in user space; the agent's memory stays bounded.
func TestAlertsSurviveFlood(t *testing.T) {
	tb := newTestbed(t, "", "{enabled: false}\n    audit: {syscalls: true, sample_rate: 1}")
	// The restricted preset kills execs from /tmp: run it from the workspace.
	flood := filepath.Join(tb.ws, "flood")
	if data, err := os.ReadFile(floodBinary(t)); err != nil || os.WriteFile(flood, data, 0o755) != nil {
		t.Fatalf("copy flood: %v", err)
	}
	tb.startAgent()
	agentPID := tb.agent.Pid()
	port := freePort(t) // loopback, not in the policy: refused by the connect hook

	const connects = 1_000_000
	script := fmt.Sprintf(`F=%s
$F open /etc/hostname 400000 > "$OUT/open" &
$F connect 127.0.0.1:%d %d > "$OUT/connect" &
sleep 0.2; cat /etc/shadow; wait
cat /etc/shadow; cat "$OUT/open" "$OUT/connect"`, flood, port, connects)
	cmd := inSandbox(t, tb.cgAbs, "flood", script, "OUT="+tb.ws)
	out, _ := cmd.CombinedOutput()
	if strings.Contains(string(out), "root:") {
		t.Fatalf("/etc/shadow was read:\n%s", out)
	}
	m := regexp.MustCompile(`connect pid=(\d+) eperm=(\d+) ok=(\d+) other=(\d+)`).FindStringSubmatch(string(out))
	if m == nil {
		t.Fatalf("flood output:\n%s", out)
	}
	floodPID, _ := strconv.Atoi(m[1])
	eperm, _ := strconv.ParseUint(m[2], 10, 64)
	if eperm != connects {
		t.Fatalf("flood: %d of %d connects refused, want all:\n%s", eperm, connects, out)
	}
	peak := vmHWM(agentPID)
	tb.stopAgent(syscall.SIGTERM)

	var folded, connectRecords, shadow uint64
	losses := map[string]uint64{}
	for _, e := range ledgerEvents(t, tb.ledger) {
		switch {
		case e.Kind == audit.KindNet && e.Net != nil && e.Net.Port == uint16(port) && e.Process.TGID == uint32(floodPID):
			if e.Verdict != audit.VerdictDenied {
				t.Errorf("connect record with verdict %s", e.Verdict)
			}
			folded += e.Count()
			connectRecords++
			if r := e.Repeat; r != nil && (r.First.IsZero() || r.Last.Before(r.First)) {
				t.Errorf("burst record with times %v..%v", r.First, r.Last)
			}
		case e.Kind == audit.KindFileOpen && e.File != nil && e.File.Path == "/etc/shadow" && e.Process.Comm == "cat":
			shadow++
		case e.Kind == audit.KindLoss && e.Loss != nil:
			losses[e.Loss.Stage] += e.Loss.Count
		}
	}
	t.Logf("%d refused connects in %d records; /etc/shadow records %d; losses %v; agent peak RSS %d MiB",
		folded, connectRecords, shadow, losses, peak>>10)
	if shadow < 2 {
		t.Errorf("%d records of the two /etc/shadow reads, want 2 (one in the flood, one after it)", shadow)
	}
	if losses["queue_alert"] != 0 {
		t.Errorf("alerts lost: %v", losses)
	}
	if folded+losses["ringbuf_alert"] != eperm {
		t.Errorf("ledger counts %d refused connects (+%d lost in the kernel ring), the process saw %d", folded, losses["ringbuf_alert"], eperm)
	}
	if connectRecords > 1000 {
		t.Errorf("%d records for one repeated refusal: not folded", connectRecords)
	}
	if peak > 256<<10 {
		t.Errorf("agent peak RSS %d MiB, want at most 256", peak>>10)
	}
}

// randomFrom returns n random characters of alphabet.
func randomFrom(alphabet string, n int) string {
	b := make([]byte, n)
	rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b)
}

// tailClient runs `watcher tail -o FORMAT` and collects its output lines.
type tailClient struct {
	cmd   *exec.Cmd
	mu    sync.Mutex
	lines []string
	done  chan struct{}
}

func startTail(t *testing.T, tb *testbed, format string) *tailClient {
	t.Helper()
	c := &tailClient{done: make(chan struct{})}
	c.cmd = exec.Command(tb.bin, "tail", "-o", format, "--socket", filepath.Join(tb.socketDir, "events.sock"))
	out, _ := c.cmd.StdoutPipe()
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.cmd.Process.Kill(); c.cmd.Wait() })
	go func() {
		defer close(c.done)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			c.mu.Lock()
			c.lines = append(c.lines, sc.Text())
			c.mu.Unlock()
		}
	}()
	return c
}

func (c *tailClient) text() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Join(c.lines, "\n")
}

// TestRedactedEverywhere: commands in a sandbox carry real secret formats
// in their arguments (a bearer token, an AWS key pair, a password in a URL,
// a GitHub token, a private key block, a --password flag). The exec records
// reach `watcher tail` (compact and JSON), the ledger, the metrics endpoint
// and the agent's log: none of them shows a secret, and tail and ledger show
// the same redacted arguments.
func TestRedactedEverywhere(t *testing.T) {
	tb := newTestbed(t, "", "{enabled: false}\n    audit: {exec: true}")
	tb.startAgent()
	jsonTail := startTail(t, tb, "json")
	compactTail := startTail(t, tb, "compact")
	time.Sleep(300 * time.Millisecond) // the tail clients register

	const alnum = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
	secrets := map[string]string{
		"bearer":     "eyJ" + randomFrom(alnum, 20) + "." + randomFrom(alnum, 24) + "." + randomFrom(alnum, 16),
		"aws_id":     "AKIA" + randomFrom("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", 16),
		"aws_secret": randomFrom(alnum+"/+", 40),
		"url_pw":     "pw" + randomFrom(alnum, 14),
		"github":     "ghp_" + randomFrom(alnum, 36),
		"pem_body":   "MIIEpAIBAAKCAQEA" + randomFrom(alnum+"+/", 48),
		"flag_pw":    "fp" + randomFrom(alnum, 12),
	}
	args := []string{
		"Authorization: Bearer " + secrets["bearer"],
		secrets["aws_id"],
		"AWS_SECRET_ACCESS_KEY=" + secrets["aws_secret"],
		"https://bob:" + secrets["url_pw"] + "@git.example.com/repo.git",
		secrets["github"],
		"-----BEGIN RSA PRIVATE KEY-----\n" + secrets["pem_body"] + "\n-----END RSA PRIVATE KEY-----",
	}
	var script strings.Builder
	for i := range args {
		fmt.Fprintf(&script, "/bin/echo \"$S%d\" >/dev/null\n", i)
	}
	script.WriteString("/bin/echo --password \"$FP\" >/dev/null\n")
	env := []string{"FP=" + secrets["flag_pw"]}
	for i, a := range args {
		env = append(env, fmt.Sprintf("S%d=%s", i, a))
	}
	if out, err := inSandbox(t, tb.cgAbs, "secrets", script.String(), env...).CombinedOutput(); err != nil {
		t.Fatalf("sandboxed commands: %v\n%s", err, out)
	}
	const want = 7 // echo execs
	echoes := func(lines string) int {
		return strings.Count(lines, `"exe":"/usr/bin/echo"`) + strings.Count(lines, `"exe":"/bin/echo"`)
	}
	if !poll.Within(15*time.Second, func() bool {
		return echoes(jsonTail.text()) >= want && strings.Count(compactTail.text(), "***") >= want
	}) {
		t.Fatalf("tail saw %d of %d echo execs (compact: %d redacted lines):\njson:\n%s\ncompact:\n%s",
			echoes(jsonTail.text()), want, strings.Count(compactTail.text(), "***"), jsonTail.text(), compactTail.text())
	}
	resp, err := http.Get("http://" + tb.metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metricsBody, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	tb.stopAgent(syscall.SIGTERM)
	ledgerOut, code := tb.watcher("ledger", "cat", "--json", "--kind", "exec", tb.ledger)
	if code != 0 {
		t.Fatalf("ledger cat: exit %d\n%s", code, ledgerOut)
	}
	seen := map[string]string{
		"tail -o json": jsonTail.text(), "tail -o compact": compactTail.text(), "ledger": ledgerOut,
		"metrics": string(metricsBody), "agent log": tb.agentLog.String(),
	}
	for where, text := range seen {
		for name, sec := range secrets {
			if strings.Contains(text, sec) {
				t.Errorf("%s shows the %s secret %q", where, name, sec)
			}
		}
	}
	// Tail and ledger carry the same redacted arguments.
	argsOf := func(text string) []string {
		var out []string
		for _, line := range strings.Split(text, "\n") {
			var e audit.Event
			if json.Unmarshal([]byte(line), &e) != nil || e.Kind != audit.KindExec || !strings.HasSuffix(e.Process.Exe, "/echo") {
				continue
			}
			if len(e.Redacted) == 0 {
				t.Errorf("echo exec without redacted fields: %s", line)
			}
			out = append(out, strings.Join(e.Process.Args, " "))
		}
		slices.Sort(out)
		return out
	}
	fromTail, fromLedger := argsOf(jsonTail.text()), argsOf(ledgerOut)
	if len(fromTail) != want || !slices.Equal(fromTail, fromLedger) {
		t.Errorf("redacted arguments differ:\ntail   %q\nledger %q", fromTail, fromLedger)
	}
	for _, a := range fromTail {
		if !strings.Contains(a, "***") {
			t.Errorf("arguments %q not redacted", a)
		}
	}
}

// TestEscapeFreezesOnlyTheLeaf: two `watcher exec` runs share the sandbox
// name (as every command does in the default policy). One attempts the
// escape sequence; the escape watch freezes its leaf only, and the other
// run's benign work keeps going after the freeze and completes.
func TestEscapeFreezesOnlyTheLeaf(t *testing.T) {
	tb := newTestbed(t, "", "{enabled: true, threshold: 100, window: 60s, action: freeze}")
	tb.startAgent()
	ctl := filepath.Join(tb.socketDir, "control.sock")
	count := filepath.Join(tb.ws, "count")

	benign := exec.Command(tb.bin, "exec", "--socket", ctl, "--label", "benign", "--", "sh", "-c",
		`i=0; while [ $i -lt 40 ]; do i=$((i+1)); echo $i >> "$0"; sleep 0.1; done; echo benign-done $i`, count)
	var benignOut strings.Builder
	benign.Stdout, benign.Stderr = &benignOut, &benignOut
	benignRun := startExec(t, benign, filepath.Join(tb.cgAbs, "exec-benign-*"))
	time.Sleep(500 * time.Millisecond)

	attack := exec.Command(tb.bin, "exec", "--socket", ctl, "--label", "attack", "--", "sh", "-c",
		`cat /etc/shadow; cat /proc/1/environ; mount -t tmpfs none /mnt; echo 1 > /proc/sys/kernel/core_pattern;
cat /root/.ssh/id_rsa; echo $$ > /sys/fs/cgroup/unified/cgroup.procs; nsenter -t 1 -m true; sleep 3`)
	var attackOut strings.Builder
	attack.Stdout, attack.Stderr = &attackOut, &attackOut
	// The attacker's leaf may be frozen when the test ends (again after
	// watcher thaw): startExec's cleanup ends it all the same.
	startExec(t, attack, filepath.Join(tb.cgAbs, "exec-attack-*"))

	frozenLeaf := func(label string) string {
		dirs, _ := filepath.Glob(filepath.Join(tb.cgAbs, "exec-"+label+"-*"))
		for _, d := range dirs {
			if data, _ := os.ReadFile(filepath.Join(d, "cgroup.freeze")); strings.TrimSpace(string(data)) == "1" {
				return d
			}
		}
		return ""
	}
	var leaf string
	if !poll.Within(20*time.Second, func() bool { leaf = frozenLeaf("attack"); return leaf != "" }) {
		out, _ := tb.watcher("ledger", "cat", tb.ledger)
		t.Fatalf("the attacking run was not frozen:\n%s\nledger:\n%s\nagent log:\n%s", attackOut.String(), out, tb.agentLog)
	}
	countAt := func() int { data, _ := os.ReadFile(count); return strings.Count(string(data), "\n") }
	atFreeze := countAt()
	if data, _ := os.ReadFile(filepath.Join(tb.cgAbs, "cgroup.freeze")); strings.TrimSpace(string(data)) == "1" {
		t.Error("the whole sandbox was frozen")
	}
	if l := frozenLeaf("benign"); l != "" {
		t.Errorf("the benign run's leaf %s was frozen", l)
	}
	select {
	case <-benignRun.ended:
		if err := benignRun.err; err != nil || !strings.Contains(benignOut.String(), "benign-done 40") {
			t.Fatalf("benign run: %v\n%s", err, benignOut.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("benign run did not finish after the attacker was frozen (%d steps at the freeze, %d now)", atFreeze, countAt())
	}
	if n := countAt(); n != 40 || atFreeze >= 40 {
		t.Errorf("benign steps: %d at the freeze, %d at the end; want it still running at the freeze and 40 at the end", atFreeze, n)
	}
	if st, _ := tb.watcher("status", "--json", "--socket", ctl); !regexp.MustCompile(`"name": "agents",[^}]*"frozen": true`).MatchString(st) {
		t.Errorf("status does not show the sandbox with a frozen leaf:\n%s", st)
	}
	if out, code := tb.watcher("thaw", "--socket", ctl, "agents"); code != 0 {
		t.Fatalf("thaw: %d %s", code, out)
	}
	// The thawed attacker may finish its sequence and be frozen again: then
	// a second escape record says so.
	data, _ := os.ReadFile(filepath.Join(leaf, "cgroup.freeze"))
	refrozen := strings.TrimSpace(string(data)) == "1"
	tb.stopAgent(syscall.SIGTERM)
	out, _ := tb.watcher("ledger", "cat", "--json", "--kind", "escape", tb.ledger)
	if !strings.Contains(out, "frozen: "+leaf) {
		t.Fatalf("no escape alert naming the frozen leaf %s in the ledger:\n%s", leaf, out)
	}
	if refrozen && strings.Count(out, "frozen: "+leaf) < 2 {
		t.Fatalf("leaf %s frozen after watcher thaw without a new escape alert:\n%s", leaf, out)
	}
}

// execRun is a `watcher exec` process a test started (startExec): ended
// is closed once Wait returned, with its error in err.
type execRun struct {
	ended chan struct{}
	err   error
}

// Bounds of startExec's cleanup.
const (
	execTermWait = 30 * time.Second // watcher exec ends a run, frozen leaf or not, on SIGTERM
	execKillWait = 15 * time.Second // after the leaf was killed and watcher exec SIGKILLed
)

// startExec starts a `watcher exec` run and waits for it in the
// background. At cleanup a run still going is ended, whatever state its
// leaf cgroups (leafGlob) are in, frozen by the escape watch included,
// and never waited for without a bound:
//   - SIGTERM, as an operator would: watcher exec kills the leaf (frozen
//     or not) and exits. Not ending within execTermWait is a failure;
//   - then the leaves are killed the way that works on a frozen cgroup
//     (cgroupfs.KillWait: cgroup.kill, and v1-frozen tasks thawed to die)
//     and watcher exec gets SIGKILL; WaitDelay bounds the wait for output
//     pipes a leftover process could still hold.
//
// It must run before the testbed's own cleanups (it is registered after
// them), while the leaves exist.
func startExec(t *testing.T, cmd *exec.Cmd, leafGlob string) *execRun {
	t.Helper()
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := &execRun{ended: make(chan struct{})}
	go func() {
		r.err = cmd.Wait()
		close(r.ended)
	}()
	t.Cleanup(func() {
		select {
		case <-r.ended:
			return
		default:
		}
		leafState := func() string {
			leaves, _ := filepath.Glob(leafGlob)
			var st []string
			for _, l := range leaves {
				frozen, _ := os.ReadFile(filepath.Join(l, "cgroup.freeze"))
				pids, _ := cgroupfs.SubtreeProcs(l, nil)
				st = append(st, fmt.Sprintf("%s (cgroup.freeze %s, pids %v)", l, strings.TrimSpace(string(frozen)), pids))
			}
			return strings.Join(st, ", ")
		}
		state := leafState()
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-r.ended:
			return
		case <-time.After(execTermWait):
			t.Errorf("watcher exec %v (pid %d) did not end %v after SIGTERM; its leaves before: %s; now: %s",
				cmd.Args[1:], cmd.Process.Pid, execTermWait, state, leafState())
		}
		leaves, _ := filepath.Glob(leafGlob)
		for _, l := range leaves {
			if err := cgroupfs.KillWait(l, execKillWait); err != nil {
				t.Errorf("kill leaf: %v", err)
			}
		}
		cmd.Process.Kill()
		select {
		case <-r.ended:
		case <-time.After(execKillWait):
			t.Errorf("watcher exec (pid %d) still not reaped %v after its leaves were killed and it got SIGKILL: giving up on it", cmd.Process.Pid, execKillWait)
		}
	})
	return r
}

// TestBreakerStateProtected: the circuit breaker's state file lives under
// the agent's protected files. After one hard timeout, a process in the
// sandbox tries to reset it. The strongest layer of this kernel stops it
// (on a host without BPF LSM the kill backstop, which acts when the open
// returns, after O_TRUNC may have emptied the file), the attempt is in the
// ledger, a benign write to the workspace next to it works, and the count
// survives: either intact (the breaker opens after the second hard timeout)
// or emptied, which fails closed (the breaker is open at once).
func TestBreakerStateProtected(t *testing.T) {
	tb := newTestbed(t, "", "{enabled: false}\n    exec: {timeouts: {warn: 100ms, term: 2s, kill: 3s}, circuit_breaker: 2}")
	tb.startAgent()
	ctl := filepath.Join(tb.socketDir, "control.sock")
	state := filepath.Join(tb.dir, "state", "breaker-agents")
	// term 2 s: time for sh to set its trap (see TestExecTimeoutsAndBreaker).
	hang := []string{"exec", "--socket", ctl, "--", "sh", "-c", "trap '' TERM; sleep 30"}
	if out, code := tb.watcher(hang...); code == 0 || !strings.Contains(out, "timeout-kill") {
		t.Fatalf("first run: exit %d, want a hard timeout:\n%s", code, out)
	}
	readState := func() string { data, _ := os.ReadFile(state); return strings.TrimSpace(string(data)) }
	if s := readState(); s != "1" {
		t.Fatalf("breaker state %s: %q, want 1", state, s)
	}

	benign := filepath.Join(tb.ws, "benign")
	script := fmt.Sprintf(`(echo 0 > %s; echo WROTE); echo ok > %s; cat %s`, state, benign, benign)
	out, _ := inSandbox(t, tb.cgAbs, "reset", script).CombinedOutput()
	if !strings.Contains(string(out), "ok") || strings.Contains(string(out), "WROTE") {
		t.Errorf("want the state write stopped and the workspace write done:\n%s", out)
	}
	switch s := readState(); s {
	case "1":
		if out, code := tb.watcher(hang...); code == 0 || !strings.Contains(out, "timeout-kill") {
			t.Fatalf("second run: exit %d, want a hard timeout:\n%s", code, out)
		}
	case "":
		t.Log("the kill came after O_TRUNC emptied the state: the breaker fails closed")
	default:
		t.Fatalf("breaker state changed by a sandboxed process to %q", s)
	}
	if out, code := tb.watcher("exec", "--socket", ctl, "--", "true"); code != 126 || !strings.Contains(out, "refused") {
		t.Fatalf("run after 2 hard timeouts (or a tampered state): exit %d, want 126:\n%s", code, out)
	}
	tb.stopAgent(syscall.SIGTERM)
	if led, _ := tb.watcher("ledger", "cat", "--kind", "file_open", tb.ledger); !strings.Contains(led, state) {
		t.Errorf("the write-open of %s is not in the ledger:\n%s", state, led)
	}
}
