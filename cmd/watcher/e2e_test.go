package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/launch"
	"github.com/watcherhq/watcher/internal/tail"
	"github.com/watcherhq/watcher/internal/testkit/e2etest"
	"github.com/watcherhq/watcher/internal/testkit/poll"
)

func TestMain(m *testing.M) {
	launch.Init()
	code := m.Run()
	e2etest.RemoveBinaries() // the helper binaries built once for all tests
	os.Exit(code)
}

// watcherBinary builds the real binary once: the end-to-end tests run it as
// separate processes, exactly as an operator would. WATCHER_BIN names one
// built already (the qemu guest has no Go toolchain: test/vm/run.sh).
func watcherBinary(t *testing.T) string {
	if bin := os.Getenv("WATCHER_BIN"); bin != "" {
		return bin
	}
	return e2etest.Binary(t, ".")
}

// testbed is one agent's private world (e2etest.World) and the watcher
// binary that runs in it.
type testbed struct {
	*e2etest.World
	t         *testing.T
	bin       string
	dir       string // the agent's directory: sockets, ledger, state
	policy    string
	pinDir    string
	cgroup    string // sandbox root, relative to the cgroup2 mount
	cgAbs     string
	ws        string
	metrics   string
	socketDir string
	ledger    string
	agent     *e2etest.Process
	agentLog  *e2etest.SafeBuffer
	agentArgs []string
}

func freePort(t *testing.T) int { return e2etest.FreePort(t) }

func newTestbed(t *testing.T, extraSandboxYAML string, escape string) *testbed {
	t.Helper()
	w := e2etest.New(t, "e2e")
	tb := &testbed{World: w, t: t, bin: watcherBinary(t), dir: w.AgentDir, pinDir: w.PinDir, cgroup: w.Cgroup,
		cgAbs: w.CgAbs, socketDir: w.SocketDir, ledger: w.Ledger, agentLog: &e2etest.SafeBuffer{}}
	w.OwnCgroup(tb.cgAbs + "-benign")
	// The benign workload runs what it builds in its workspace (not under
	// /tmp, where the restricted preset kills execs).
	tb.ws = filepath.Join(w.Base, "ws")
	tb.metrics = "127.0.0.1:" + strconv.Itoa(freePort(t))
	os.MkdirAll(tb.ws, 0o755)
	pol := w.PolicyHead(tb.metrics) + fmt.Sprintf(`  - name: agents
    select: {cgroups: [%s]}
    preset: restricted
    workspace: [%s]
    escape: %s
%s`, tb.cgroup, tb.ws, escape, extraSandboxYAML)
	tb.policy = filepath.Join(tb.dir, "policy.yaml")
	if err := os.WriteFile(tb.policy, []byte(pol), 0o600); err != nil {
		t.Fatal(err)
	}
	return tb
}

// agentReadyTimeout bounds an agent's start: seconds on a host, up to two
// minutes in the qemu guest (TCG), where its loads are emulated.
const agentReadyTimeout = 3 * time.Minute

// startAgent runs `watcher run` on the testbed's policy and waits until
// watcher status answers.
func (tb *testbed) startAgent() {
	t := tb.t
	t.Helper()
	cmd := exec.Command(tb.bin, append([]string{"run", "--policy", tb.policy, "--quiet"}, tb.agentArgs...)...)
	tb.agent = e2etest.Start(t, cmd)
	tb.agentLog = tb.agent.Log
	err := tb.agent.WaitReady(agentReadyTimeout, func() bool {
		return exec.Command(tb.bin, "status", "--socket", tb.ControlSocket()).Run() == nil
	})
	if err != nil {
		t.Fatalf("agent did not come up: %v", err)
	}
}

func (tb *testbed) stopAgent(sig syscall.Signal) {
	if tb.agent == nil {
		return
	}
	if !tb.agent.Stop(sig) {
		tb.t.Errorf("agent did not stop on %v:\n%s", sig, tb.agentLog)
	}
	tb.agent = nil
}

func (tb *testbed) watcher(args ...string) (string, int) {
	cmd := exec.Command(tb.bin, args...)
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		tb.t.Fatalf("watcher %v: %v", args, err)
	}
	return string(out), code
}

// tailJSON runs `watcher tail -o json ARGS` against the agent until the
// test ends and sends each event keep accepts (nil: all) on the channel,
// which closes when tail ends. Give the client a moment to register its
// filter before the events it must see.
func (tb *testbed) tailJSON(keep func(audit.Event) bool, args ...string) <-chan audit.Event {
	t := tb.t
	t.Helper()
	cmd := exec.Command(tb.bin, append(append([]string{"tail", "-o", "json"}, args...), "--socket", tb.EventsSocket())...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	events := make(chan audit.Event, 100)
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var e audit.Event
			if json.Unmarshal(sc.Bytes(), &e) == nil && (keep == nil || keep(e)) {
				events <- e
			}
		}
		close(events)
	}()
	return events
}

// inSandbox runs a shell script in a fresh cgroup below cgAbs, as a
// container runtime would start a process there (no seccomp/Landlock).
func inSandbox(t *testing.T, cgAbs, name, script string, env ...string) *exec.Cmd {
	t.Helper()
	cmd := e2etest.InCgroup(t, cgAbs, name, "/bin/sh", "-c", script)
	cmd.Env = append([]string{"PATH=/usr/local/go/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, env...)
	return cmd
}

// TestEndToEnd: agent binary, watcher exec, watcher tail -o json, the
// ledger and the metrics endpoint, checked from outside.
func TestEndToEnd(t *testing.T) {
	tb := newTestbed(t, "", "{enabled: false}")
	tb.startAgent()

	// A live tail client, filtered to denials.
	lines := tb.tailJSON(nil, "--verdict", "denied,killed")
	time.Sleep(300 * time.Millisecond) // the tail client registers its filter

	out, code := tb.watcher("exec", "--socket", filepath.Join(tb.socketDir, "control.sock"), "--label", "call-42", "--", "cat", "/etc/shadow")
	if code == 0 || strings.Contains(out, "root:") {
		t.Fatalf("cat /etc/shadow in the sandbox: exit %d, output:\n%s", code, out)
	}
	if !strings.Contains(out, "label=call-42") {
		t.Errorf("verdict line lacks the label:\n%s", out)
	}

	var got *audit.Event
	timeout := time.After(10 * time.Second)
	for got == nil {
		select {
		case e, ok := <-lines:
			if !ok {
				t.Fatal("tail ended early")
			}
			if e.File != nil && e.File.Path == "/etc/shadow" && e.Sandbox.Labels["label"] == "call-42" {
				got = &e
			}
		case <-timeout:
			t.Fatalf("no denial of /etc/shadow labelled call-42 reached watcher tail; agent log:\n%s", tb.agentLog)
		}
	}
	if got.Sandbox.Name != "agents" || got.Process.Comm != "cat" || got.Verdict != audit.VerdictDenied {
		t.Errorf("event %+v: want sandbox agents, comm cat, verdict denied", got)
	}

	// A process started in the sandbox by someone else (a container): the
	// kernel hooks alone stop it.
	cmd := inSandbox(t, tb.cgAbs, "c1", "cat /etc/shadow; echo 1 > /proc/sys/vm/overcommit_ratio")
	cout, _ := cmd.CombinedOutput()
	if strings.Contains(string(cout), "root:") {
		t.Fatalf("container process read /etc/shadow:\n%s", cout)
	}

	// The metric moved.
	resp, err := http.Get("http://" + tb.metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	m := regexp.MustCompile(`watcher_events_total\{kind="file_open",sandbox="agents",verdict="(denied|killed)"\} (\d+)`).FindSubmatch(body)
	if m == nil || string(m[2]) == "0" {
		t.Fatalf("watcher_events_total for denied file opens missing or zero:\n%s", grepLines(body, "watcher_events_total"))
	}

	if !regexp.MustCompile(`watcher_bpf_prog_runs_total\{prog="[a-z_]+"\} [1-9]`).Match(body) {
		t.Errorf("no per-program BPF run counts:\n%s", grepLines(body, "watcher_bpf"))
	}

	// watcher status works as a readiness probe.
	if out, code := tb.watcher("status", "--socket", filepath.Join(tb.socketDir, "control.sock")); code != 0 || !strings.Contains(out, "agents") {
		t.Errorf("status exit %d:\n%s", code, out)
	}

	tb.stopAgent(syscall.SIGTERM)
	if out, code := tb.watcher("verify", tb.ledger); code != 0 {
		t.Fatalf("verify after a clean stop: exit %d\n%s", code, out)
	}
	out, code = tb.watcher("ledger", "cat", "--json", "--kind", "file_open", tb.ledger)
	if code != 0 || !strings.Contains(out, `"/etc/shadow"`) || !strings.Contains(out, "call-42") {
		t.Fatalf("ledger lacks the denial (exit %d):\n%s", code, out)
	}
	if _, code := tb.watcher("status", "--socket", filepath.Join(tb.socketDir, "control.sock")); code == 0 {
		t.Error("status succeeded with the agent stopped")
	}
}

func grepLines(b []byte, s string) string {
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestAgentKilledMidLoop: SIGKILL the agent during a loop of forbidden
// operations and restart it: the pinned programs keep enforcing, no
// forbidden operation succeeds, and the ledger verifies afterwards.
func TestAgentKilledMidLoop(t *testing.T) {
	tb := newTestbed(t, "", "{enabled: false}")
	tb.startAgent()
	loop := inSandbox(t, tb.cgAbs, "loop", `i=0; while [ $i -lt 150 ]; do cat /etc/shadow; i=$((i+1)); sleep 0.02; done; echo loop-done`)
	var out bytes.Buffer
	loop.Stdout, loop.Stderr = &out, &out
	if err := loop.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(700 * time.Millisecond)
	tb.stopAgent(syscall.SIGKILL)
	time.Sleep(1 * time.Second) // no agent at all: only the pins enforce
	tb.startAgent()
	if err := loop.Wait(); err != nil {
		t.Fatalf("loop: %v\n%s", err, out.String())
	}
	if strings.Contains(out.String(), "root:") || !strings.Contains(out.String(), "loop-done") {
		t.Fatalf("a forbidden read succeeded while the agent was down, or the loop did not finish:\n%s", out.String())
	}
	tb.stopAgent(syscall.SIGTERM)
	if vout, code := tb.watcher("verify", tb.ledger); code != 0 {
		t.Fatalf("verify after SIGKILL and restart: exit %d\n%s", code, vout)
	}
	cat, _ := tb.watcher("ledger", "cat", "--json", "--kind", "file_open", tb.ledger)
	if n := strings.Count(cat, `"/etc/shadow"`); n < 100 {
		t.Errorf("ledger holds %d of the ~150 refused reads (events during the gap are read from the pinned ring by the next agent)", n)
	}
}

// TestEscapeWatchFreezes: a scripted escape sequence freezes its sandbox;
// a benign workload (a Go build, a Python script, git) in another sandbox
// is untouched.
func TestEscapeWatchFreezes(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git not installed")
	}
	benign := fmt.Sprintf(`  - name: benign
    select: {cgroups: [%s-benign]}
    preset: restricted
    workspace: [%s]
    escape: {enabled: true, threshold: 100, window: 60s, action: freeze}
`, "CGROUP", "WS")
	// The sandbox-wide scope (the default freezes only the leaf that
	// earned the score: TestEscapeFreezesOnlyTheLeaf).
	tb := newTestbed(t, benign, "{enabled: true, threshold: 100, window: 60s, action: freeze, scope: sandbox}")
	pol, _ := os.ReadFile(tb.policy)
	pol = bytes.ReplaceAll(pol, []byte("CGROUP"), []byte(tb.cgroup))
	pol = bytes.ReplaceAll(pol, []byte("WS"), []byte(tb.ws))
	os.WriteFile(tb.policy, pol, 0o600)
	tb.startAgent()

	// The benign workload first, in its own sandbox.
	ws := tb.ws
	os.WriteFile(filepath.Join(ws, "main.go"), []byte("package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"hello\") }\n"), 0o644)
	os.WriteFile(filepath.Join(ws, "go.mod"), []byte("module hello\n\ngo 1.22\n"), 0o644)
	os.WriteFile(filepath.Join(ws, "script.py"), []byte("import json, hashlib\nprint(json.dumps({'h': hashlib.sha256(b'x').hexdigest()}))\n"), 0o644)
	os.MkdirAll(filepath.Join(ws, ".tmp"), 0o755)
	benignScript := `set -e; cd "$WS"
go build -o "$WS/hello" . && "$WS/hello"
python3 script.py
git init -q . && git add . && git -c user.name=t -c user.email=t@e commit -qm init && git log --oneline | wc -l`
	cmd := inSandbox(t, tb.cgAbs+"-benign", "work", benignScript, "WS="+ws, "HOME="+ws, "GOCACHE="+ws+"/.gocache",
		"GOTMPDIR="+ws+"/.tmp", "TMPDIR="+ws+"/.tmp", "GOFLAGS=-mod=mod", "GOPROXY=off", "GOTOOLCHAIN=local")
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "hello") {
		led, _ := tb.watcher("ledger", "cat", tb.ledger)
		t.Fatalf("benign workload failed in its sandbox: %v\n%s\nledger:\n%s", err, out, led)
	}

	// The scripted escape, each step refused or killed.
	escapeScript := `cat /etc/shadow; cat /proc/1/environ; mount -t tmpfs none /mnt; echo 1 > /proc/sys/kernel/core_pattern;
cat /root/.ssh/id_rsa; echo $$ > /sys/fs/cgroup/unified/cgroup.procs; nsenter -t 1 -m true; sleep 5`
	esc := inSandbox(t, tb.cgAbs, "esc", escapeScript)
	esc.WaitDelay = 10 * time.Second // a frozen child holding the output pipe never hangs the test
	esc.Start()
	defer func() {
		// Killed frozen or not (the escape watch may freeze again after a thaw).
		if err := cgroupfs.KillWait(tb.cgAbs, 10*time.Second); err != nil {
			t.Errorf("empty the sandbox: %v", err)
		}
		esc.Process.Kill()
		esc.Wait()
	}()

	if !poll.Within(15*time.Second, func() bool {
		data, _ := os.ReadFile(filepath.Join(tb.cgAbs, "cgroup.freeze"))
		return strings.TrimSpace(string(data)) == "1"
	}) {
		out, _ := tb.watcher("ledger", "cat", tb.ledger)
		t.Fatalf("sandbox not frozen after the escape sequence; ledger:\n%s\nagent log:\n%s", out, tb.agentLog)
	}
	st, _ := tb.watcher("status", "--json", "--socket", filepath.Join(tb.socketDir, "control.sock"))
	if !regexp.MustCompile(`"name": "agents",[^}]*"frozen": true`).MatchString(st) {
		t.Errorf("status does not show agents frozen:\n%s", st)
	}
	if regexp.MustCompile(`"name": "benign",[^}]*"frozen": true`).MatchString(st) {
		t.Errorf("benign sandbox frozen:\n%s", st)
	}
	if out, code := tb.watcher("thaw", "--socket", filepath.Join(tb.socketDir, "control.sock"), "agents"); code != 0 {
		t.Fatalf("thaw: %d %s", code, out)
	}
	if data, _ := os.ReadFile(filepath.Join(tb.cgAbs, "cgroup.freeze")); strings.TrimSpace(string(data)) != "0" {
		t.Fatal("sandbox still frozen after watcher thaw")
	}
	// The alert with its evidence is in the ledger.
	tb.stopAgent(syscall.SIGTERM)
	out, _ := tb.watcher("ledger", "cat", "--json", "--kind", "escape", tb.ledger)
	if !strings.Contains(out, "frozen") {
		t.Fatalf("no escape alert in the ledger:\n%s", out)
	}
}

var _ = context.Background
var _ = tail.DefaultSocket

// TestReloadAndMountUndo: a bad policy edit is refused and enforcement
// stays; a good edit (record mode) takes effect without a restart; a mount
// the kill backstop could only kill after the fact is undone by the agent.
func TestReloadAndMountUndo(t *testing.T) {
	tb := newTestbed(t, "", "{enabled: false}")
	tb.startAgent()
	ctl := filepath.Join(tb.socketDir, "control.sock")
	good, _ := os.ReadFile(tb.policy)

	// The mount: killed, and (where it happened) undone.
	mnt := filepath.Join(tb.ws, "mnt")
	os.MkdirAll(mnt, 0o755)
	out, _ := inSandbox(t, tb.cgAbs, "m", "mount -t tmpfs none "+mnt+" && echo after-mount").CombinedOutput()
	if strings.Contains(string(out), "after-mount") {
		t.Fatalf("mount in the sandbox was not stopped:\n%s", out)
	}
	if !poll.Within(10*time.Second, func() bool {
		mi, _ := os.ReadFile("/proc/self/mountinfo")
		return !strings.Contains(string(mi), " "+mnt+" ")
	}) {
		exec.Command("umount", "-l", mnt).Run()
		t.Fatalf("the killed process's tmpfs is still mounted at %s", mnt)
	}

	// A broken edit: refused, the old policy stays in force.
	os.WriteFile(tb.policy, append(append([]byte{}, good...), []byte("bogus_field: 1\n")...), 0o600)
	if out, code := tb.watcher("reload", "--socket", ctl); code == 0 || !strings.Contains(out, "bogus_field") {
		t.Fatalf("reload of a broken policy: exit %d\n%s", code, out)
	}
	if out, _ := inSandbox(t, tb.cgAbs, "r1", "cat /etc/shadow").CombinedOutput(); strings.Contains(string(out), "root:") {
		t.Fatalf("enforcement lapsed after a refused reload:\n%s", out)
	}

	// A good edit (record mode), picked up from the file change alone.
	rec := strings.Replace(string(good), "    preset: restricted\n", "    preset: restricted\n    mode: record\n", 1)
	os.WriteFile(tb.policy, []byte(rec), 0o600)
	var recOut []byte
	if !poll.Within(10*time.Second, func() bool {
		recOut, _ = inSandbox(t, tb.cgAbs, fmt.Sprintf("r%d", time.Now().UnixNano()), "cat /etc/shadow").CombinedOutput()
		return strings.Contains(string(recOut), "root:")
	}) {
		t.Fatalf("record mode not in force after editing the policy file:\n%s\n%s", recOut, tb.agentLog)
	}
	tb.stopAgent(syscall.SIGTERM)
	cat, _ := tb.watcher("ledger", "cat", "--json", tb.ledger)
	for _, want := range []string{"undo_mount", "policy reload refused", "policy reloaded", `"verdict":"recorded"`} {
		if !strings.Contains(cat, want) {
			t.Errorf("ledger lacks %q", want)
		}
	}
}

// TestContainerFlag: `watcher run --container docker://ID` cages a Docker
// container found by the runtime's cgroup naming, even one started after
// the agent.
func TestContainerFlag(t *testing.T) {
	tb := newTestbed(t, "", "{enabled: false}")
	b := make([]byte, 32)
	rand.Read(b)
	id := hex.EncodeToString(b)
	slice := filepath.Join(filepath.Dir(tb.cgAbs), "system.slice")
	scope := filepath.Join(slice, "docker-"+id+".scope")
	if _, err := os.Stat(slice); err != nil {
		t.Cleanup(func() { cgroupfs.Remove(slice) }) // only when the test made it
	}
	t.Cleanup(func() { cgroupfs.Remove(scope) })
	tb.agentArgs = []string{"--container", "docker://" + id[:12]}
	tb.startAgent()
	if err := cgroupfs.Create(scope); err != nil { // the container starts after the agent
		t.Fatal(err)
	}
	caged := poll.Within(15*time.Second, func() bool {
		out, _ := inSandbox(t, scope, fmt.Sprintf("p%d", time.Now().UnixNano()), "cat /etc/shadow && echo READ").CombinedOutput()
		return !strings.Contains(string(out), "READ")
	})
	if !caged {
		t.Fatalf("the container's cgroup was never caged:\n%s", tb.agentLog)
	}
}

// TestExecTimeoutsAndBreaker: graded timeouts end a hanging command with
// cgroup.kill, and after circuit_breaker consecutive hard timeouts the
// sandbox refuses further runs, across separate watcher exec invocations.
func TestExecTimeoutsAndBreaker(t *testing.T) {
	tb := newTestbed(t, "", "{enabled: false}\n    exec: {timeouts: {warn: 100ms, term: 2s, kill: 3s}, circuit_breaker: 2}")
	tb.startAgent()
	ctl := filepath.Join(tb.socketDir, "control.sock")
	// A command that ignores SIGTERM: only the cgroup kill ends it. The
	// term timeout leaves it time to set its trap: the clock starts at
	// release, before the helper's own setup and sh's start, which took
	// over 200 ms on a loaded CI machine.
	hang := []string{"exec", "--socket", ctl, "--", "sh", "-c", "trap '' TERM; sleep 30"}
	for i := 0; i < 2; i++ {
		start := time.Now()
		out, code := tb.watcher(hang...)
		if code == 0 || !strings.Contains(out, "timeout-kill") {
			t.Fatalf("run %d: exit %d, want a hard timeout:\n%s", i, code, out)
		}
		if d := time.Since(start); d > 20*time.Second {
			t.Fatalf("run %d took %v: the kill timeout did not end it", i, d)
		}
	}
	out, code := tb.watcher("exec", "--socket", ctl, "--", "sh", "-c", "printf %s%s RA N")
	if code != 126 || strings.Contains(out, "RAN") || !strings.Contains(out, "refused") {
		t.Fatalf("third run after 2 hard timeouts: exit %d, want 126 and nothing run:\n%s", code, out)
	}
}

// TestReloadDropsSandbox: a reload that removes a sandbox releases its
// cgroup: processes there are no longer caged.
func TestReloadDropsSandbox(t *testing.T) {
	tb := newTestbed(t, "", "{enabled: false}")
	tb.startAgent()
	if out, _ := inSandbox(t, tb.cgAbs, "a", "cat /etc/shadow && echo READ").CombinedOutput(); strings.Contains(string(out), "READ") {
		t.Fatalf("sandbox not enforced before the reload:\n%s", out)
	}
	// The same policy with the sandbox selecting another cgroup.
	pol, _ := os.ReadFile(tb.policy)
	moved := strings.Replace(string(pol), "select: {cgroups: ["+tb.cgroup+"]}", "select: {cgroups: ["+tb.cgroup+"-exec]}", 1)
	os.WriteFile(tb.policy, []byte(moved), 0o600)
	if out, code := tb.watcher("reload", "--socket", filepath.Join(tb.socketDir, "control.sock")); code != 0 {
		t.Fatalf("reload: %d %s", code, out)
	}
	if out, _ := inSandbox(t, tb.cgAbs, "b", "cat /etc/shadow >/dev/null && echo READ").CombinedOutput(); !strings.Contains(string(out), "READ") {
		t.Fatalf("the cgroup dropped from the policy is still caged:\n%s\n%s", out, tb.agentLog)
	}
	if out, _ := inSandbox(t, tb.cgAbs+"-exec", "c", "cat /etc/shadow && echo READ").CombinedOutput(); strings.Contains(string(out), "READ") {
		t.Fatalf("the newly selected cgroup is not caged:\n%s", out)
	}
}
