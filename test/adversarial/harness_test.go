package adversarial

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/agent"
	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/control"
	"github.com/watcherhq/watcher/internal/launch"
	"github.com/watcherhq/watcher/internal/launch/ia32"
	"github.com/watcherhq/watcher/internal/plan"
	"github.com/watcherhq/watcher/internal/policy"
	"github.com/watcherhq/watcher/internal/testkit/e2etest"
	"github.com/watcherhq/watcher/internal/testkit/poll"
)

// The test binary plays three roles: the test itself, the agent
// (ADV_ROLE=agent: internal/agent exactly as `watcher run` starts it, in its
// own process so attacks on it are real), and the attacker (ADV_ROLE=attack).
// One static binary, so the same suite runs in the qemu guest.
func TestMain(m *testing.M) {
	// First: under watcher exec this binary is also the launcher's child.
	launch.Init()
	switch os.Getenv("ADV_ROLE") {
	case "agent":
		agentMain()
	case "attack":
		attackMain()
	}
	os.Exit(m.Run())
}

// agentMain runs the agent until SIGTERM/SIGINT (as `watcher run` does) or
// until stdin closes, writing every event as a JSON line to ADV_EVENTS and
// the layer table to ADV_LAYERS.
func agentMain() {
	fail := func(err error) { fmt.Fprintln(os.Stderr, "agent:", err); os.Exit(1) }
	path := os.Getenv("ADV_POLICY")
	pol, err := policy.Load(path)
	if err != nil {
		fail(err)
	}
	evf, err := os.Create(os.Getenv("ADV_EVENTS"))
	if err != nil {
		fail(err)
	}
	var mu sync.Mutex
	w := bufio.NewWriter(evf)
	enc := json.NewEncoder(w)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	a, err := agent.Start(ctx, agent.Options{Policy: pol, PolicyPath: path, OnEvent: func(e audit.Event) {
		mu.Lock()
		enc.Encode(e)
		w.Flush()
		mu.Unlock()
	}})
	if err != nil {
		fail(err)
	}
	lb, _ := json.Marshal(a.Layers())
	if err := os.WriteFile(os.Getenv("ADV_LAYERS"), lb, 0o600); err != nil {
		fail(err)
	}
	fmt.Println("READY")
	go func() { io.Copy(io.Discard, os.Stdin); stop() }()
	// As `watcher run`: a signal a sandbox sent is ignored.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	go func() {
		for sig := range sigs {
			if a.SignalledBySandbox(sig.(syscall.Signal)) {
				fmt.Fprintln(os.Stderr, "agent: ignored a signal from a sandbox:", sig)
				continue
			}
			stop()
		}
	}()
	<-ctx.Done()
	a.Stop()
	fmt.Fprintln(os.Stderr, "agent: stopped")
	os.Exit(0)
}

// bed is one agent's private world (e2etest.World) and the attack
// fixtures in it.
type bed struct {
	*e2etest.World
	t                  *testing.T
	id                 string
	self               string // copy of this binary outside /tmp (exec rules)
	base, ws, scratch  string
	secretDir, tgt     string
	shadow             string // file of an exact rule (adv-shadow)
	cgroup, cgAbs      string // sandbox root (relative, absolute)
	outside            string // a cgroup outside every sandbox
	pinDir, socketDir  string
	ledger, policyPath string
	events, layersPath string
	pol                *policy.Policy
	agent              *e2etest.Process
	agentIn            io.WriteCloser
	agentLog           *e2etest.SafeBuffer
	agentOOM           string // the agent's oom_score_adj once up (it lowers its own)
	layer              string // "lsm", "fmod_ret" or "backstop": what enforces file rules
	hostSock           string // a unix socket outside the workspace (a host service's stand-in)
	leafSeq            int
}

const (
	secretContent = "ADV-SECRET-7f3a9c"
	victimContent = "ADV-ORIGINAL-CONTENT\n"
)

func newBed(t *testing.T) *bed {
	t.Helper()
	w := e2etest.New(t, "adv")
	b := &bed{World: w, t: t, id: w.ID, base: w.Base}
	base := b.base
	b.ws = filepath.Join(base, "ws")
	b.secretDir = filepath.Join(base, "secret")
	b.tgt = filepath.Join(base, "etc")
	b.shadow = filepath.Join(base, "pw", "shadow")
	scratch, err := os.MkdirTemp("/tmp", "watcher-adv-scratch-")
	if err != nil {
		t.Fatal(err)
	}
	b.scratch = scratch
	t.Cleanup(func() { os.RemoveAll(scratch) })
	for _, d := range []string{b.ws, b.secretDir, b.tgt, filepath.Dir(b.shadow), filepath.Join(base, "bin"), w.SocketDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.Chmod(b.ws, 0o777)
	os.WriteFile(filepath.Join(b.ws, "hello"), []byte("hello from the workspace\n"), 0o644)
	b.resetSecrets()
	b.resetTarget()
	os.WriteFile(b.shadow, []byte(secretContent+"-shadow\n"), 0o600)

	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// In the workspace: under watcher exec, Landlock lets the sandbox
	// read and run only system directories and the workspace.
	os.MkdirAll(filepath.Join(b.ws, ".adv"), 0o755)
	b.self = filepath.Join(b.ws, ".adv", "adversarial.test")
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(b.self, data, 0o755); err != nil {
		t.Fatal(err)
	}

	b.cgroup, b.cgAbs = w.Cgroup, w.CgAbs
	b.outside = w.CgAbs + "-outside"
	w.OwnCgroup(b.outside)
	if err := cgroupfs.Create(b.outside); err != nil {
		t.Fatal(err)
	}
	b.pinDir, b.socketDir, b.ledger = w.PinDir, w.SocketDir, w.Ledger
	b.events = filepath.Join(base, "events.jsonl")
	b.layersPath = filepath.Join(base, "layers.json")
	pol := w.PolicyHead("") + fmt.Sprintf(`  - name: adv
    select: {cgroups: [%s]}
    preset: restricted
    workspace: [%s]
    escape: {enabled: false}
    files:
      - {name: adv-secrets, path: %s/, match: prefix, access: any, action: block}
      - {name: adv-shadow, path: %s, match: exact, access: any, action: block}
`, b.cgroup, b.ws, b.secretDir, b.shadow)
	b.policyPath = filepath.Join(base, "policy.yaml")
	if err := os.WriteFile(b.policyPath, []byte(pol), 0o600); err != nil {
		t.Fatal(err)
	}
	if b.pol, err = policy.Load(b.policyPath); err != nil {
		t.Fatal(err)
	}
	// Before the world's cgroups, pins and directories go.
	t.Cleanup(func() {
		b.stopAgent()
		for _, m := range []string{"m32", "bind"} {
			unix_unmount(filepath.Join(b.ws, m))
		}
	})
	// A host service's socket outside the workspace (docker.sock,
	// resolved's varlink): connects to it are refused.
	os.MkdirAll(filepath.Join(base, "hostsvc"), 0o755)
	b.hostSock = filepath.Join(base, "hostsvc", "svc.sock")
	ln, err := net.Listen("unix", b.hostSock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("HOST-SERVICE\n"))
			c.Close()
		}
	}()
	b.startAgent()
	// Created after the agent started: a prefix rule protects files that
	// did not exist when the rules were written.
	os.WriteFile(filepath.Join(b.secretDir, "late"), []byte(secretContent+"-late\n"), 0o600)
	return b
}

func unix_unmount(dir string) {
	for i := 0; i < 4 && isMounted(dir); i++ {
		syscall.Unmount(dir, syscall.MNT_DETACH)
	}
}

// resetSecrets puts the protected files back (rename-read moves one away
// where only the backstop stops it after the fact).
func (b *bed) resetSecrets() {
	os.WriteFile(filepath.Join(b.secretDir, "key"), []byte(secretContent+"\n"), 0o600)
	os.WriteFile(filepath.Join(b.secretDir, "key2"), []byte(secretContent+"-2\n"), 0o600)
}

// resetTarget recreates the write-protected directory outside every
// writable place.
func (b *bed) resetTarget() {
	os.RemoveAll(b.tgt)
	os.MkdirAll(b.tgt, 0o755)
	v := filepath.Join(b.tgt, "victim")
	os.WriteFile(v, []byte(victimContent), 0o644)
	old := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	os.Chtimes(v, old, old)
}

func (b *bed) startAgent() {
	t := b.t
	cmd := exec.Command(b.self, "-test.run=^$")
	cmd.Env = append(os.Environ(), "ADV_ROLE=agent", "ADV_POLICY="+b.policyPath, "ADV_EVENTS="+b.events, "ADV_LAYERS="+b.layersPath)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	b.agent, b.agentIn = e2etest.Start(t, cmd), in
	b.agentLog = b.agent.Log
	var ready atomic.Bool
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if sc.Text() == "READY" {
				ready.Store(true)
			}
		}
	}()
	// Loading every program takes minutes under qemu's emulation.
	if err := b.agent.WaitReady(300*time.Second, ready.Load); err != nil {
		t.Fatalf("agent did not start: %v", err)
	}
	oom, err := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", b.agent.Pid()))
	if err != nil {
		t.Fatalf("agent's oom_score_adj: %v", err)
	}
	b.agentOOM = strings.TrimSpace(string(oom))
	var layers []control.Layer
	lb, err := os.ReadFile(b.layersPath)
	if err != nil || json.Unmarshal(lb, &layers) != nil {
		t.Fatalf("layers: %v", err)
	}
	b.layer = "backstop"
	for _, l := range layers {
		if strings.Contains(l.Rule, "adv-secrets") && (l.Mechanism == plan.MechLSM || l.Mechanism == plan.MechFmodRet) {
			b.layer = l.Mechanism
		}
	}
}

func (b *bed) stopAgent() {
	if b.agent == nil {
		return
	}
	b.agentIn.Close() // the agent stops when its stdin closes
	b.agent.Stop(nil)
	b.agent = nil
}

// agentState returns "" when the agent runs normally, else what is wrong.
func (b *bed) agentState() string {
	if b.agent == nil {
		return "not started"
	}
	// Give signals in flight (a SIGTERM the kernel delivered) time to act.
	time.Sleep(150 * time.Millisecond)
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", b.agent.Pid()))
	if err != nil {
		return "gone"
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return "unreadable stat"
	}
	switch st := s[i+2]; st {
	case 'T', 't':
		return "stopped"
	case 'Z', 'X':
		return "exited"
	}
	return ""
}

// ensureAgent restarts an agent an attack took down, so later rows run.
func (b *bed) ensureAgent() {
	if b.agentState() == "" {
		return
	}
	if b.agent != nil {
		b.agent.Kill()
		b.agent = nil
	}
	b.startAgent()
}

// outcome of one attacker run.
type outcome struct {
	path    string // "sandbox" or "exec"
	result  string // achieved, refused, killed, child-killed, n/a, failed
	out     string
	pids    []int
	cgroup  uint64 // leaf cgroup id ("sandbox" path)
	label   string // leaf label ("exec" path)
	started time.Time
}

func (o *outcome) parsePIDs() {
	for _, l := range strings.Split(o.out, "\n") {
		if p, ok := strings.CutPrefix(l, "PID "); ok {
			if n, err := strconv.Atoi(strings.TrimSpace(p)); err == nil {
				o.pids = append(o.pids, n)
			}
		}
	}
}

func resultOf(code int, signaled syscall.Signal) string {
	if signaled == syscall.SIGKILL {
		return "killed"
	}
	switch code {
	case exitAchieved:
		return "achieved"
	case exitRefused:
		return "refused"
	case exitChildKilled:
		return "child-killed"
	case exitNA:
		return "n/a"
	}
	return fmt.Sprintf("failed(exit %d, signal %d)", code, int(signaled))
}

func (b *bed) attackEnv(tech, arg string) []string {
	return []string{"ADV_ROLE=attack", "ADV_TECH=" + tech, "ADV_ARG=" + arg, "ADV_WS=" + b.ws, "ADV_SECRET=" + b.secretDir,
		"ADV_TGT=" + b.tgt, "ADV_SCRATCH=" + b.scratch, "ADV_OUTSIDE=" + b.outside,
		"ADV_AGENT=" + strconv.Itoa(b.agent.Pid()), "ADV_HOSTSOCK=" + b.hostSock, "PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
}

// inSandbox runs technique tech in a fresh leaf cgroup of the sandbox,
// placed as a container runtime places a process (no seccomp, no
// Landlock): it starts outside, then joins the leaf through cgroup.procs
// (this binary's package initialisers call bpf(), which the backstop would
// take for the attack).
func (b *bed) inSandbox(tech, arg string) outcome {
	t := b.t
	b.leafSeq++
	leaf := filepath.Join(b.cgAbs, fmt.Sprintf("c%d", b.leafSeq))
	if err := cgroupfs.Create(leaf); err != nil {
		t.Fatal(err)
	}
	o := outcome{path: "sandbox", started: time.Now()}
	o.cgroup, _ = cgroupfs.ID(leaf)
	cmd := exec.Command(b.self, "-test.run=^$")
	cmd.Env = append(b.attackEnv(tech, arg), "ADV_JOIN="+filepath.Join(leaf, "cgroup.procs"))
	cmd.Dir = b.ws
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	timer := time.AfterFunc(60*time.Second, func() { cgroupfs.Kill(leaf) })
	cmd.Wait()
	timer.Stop()
	o.out = out.String()
	var sig syscall.Signal
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		sig = ws.Signal()
	}
	o.result = resultOf(cmd.ProcessState.ExitCode(), sig)
	o.parsePIDs()
	if len(o.pids) == 0 {
		o.pids = []int{cmd.Process.Pid}
	}
	cgroupfs.Kill(leaf)
	return o
}

// viaExec runs technique tech as `watcher exec` does: seccomp, Landlock
// and no_new_privs from the sandbox's plan, in a fresh leaf of the exec
// parent, under the running agent's kernel hooks.
func (b *bed) viaExec(tech, arg string) outcome {
	t := b.t
	sb := b.pol.Sandbox("adv")
	// IA32 as the agent sets it: the exec plan reflects this kernel.
	execPlan, err := plan.Compile(b.pol, plan.Env{LSM: map[string]error{}, IA32: ia32.Available()}, plan.NewRuleTable())
	if err != nil {
		t.Fatal(err)
	}
	// Every run announces itself, as watcher exec does: the agent keeps
	// the recording tracepoints only while commands run.
	if err := control.NewClient(filepath.Join(b.socketDir, "control.sock")).PrepareExec(); err != nil {
		t.Logf("PrepareExec: %v", err)
	}
	b.leafSeq++
	o := outcome{path: "exec", started: time.Now(), label: fmt.Sprintf("adv-%s-%d", b.id, b.leafSeq)}
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	v, runErr := launch.Run(ctx, launch.Config{
		Path: b.self, Args: []string{"-test.run=^$"}, Env: b.attackEnv(tech, arg), Dir: b.ws,
		Stdout: &out, Stderr: &out, Sandbox: sb.Name, CgroupParent: agent.ExecParents(b.pol, sb)[0],
		Label: o.label, Restrictions: launch.ExecRestrictions(execPlan.Launch[sb.Name], sb), Executable: b.self,
		Isolation: launch.Isolation{Namespaces: launch.SubtreeNamespaces},
		Timeouts:  launch.Timeouts{Kill: 60 * time.Second},
	})
	o.out = out.String()
	o.cgroup = v.CgroupID
	switch {
	case v.Outcome == launch.OutcomeRefused || v.Outcome == launch.OutcomeFailed:
		o.result = fmt.Sprintf("failed(launch %s: %v)", v.Outcome, runErr)
	default:
		o.result = resultOf(v.ExitCode, syscall.Signal(v.Signal))
	}
	o.parsePIDs()
	return o
}

// eventsFor returns the non-allowed events of an attacker run (its pids,
// its leaf cgroup or its label), waiting up to a few seconds for them.
func (b *bed) eventsFor(o outcome, want func(audit.Event) bool) []audit.Event {
	var got []audit.Event
	poll.Within(4*time.Second, func() bool {
		got = nil
		data, _ := os.ReadFile(b.events)
		for _, line := range bytes.Split(data, []byte("\n")) {
			var e audit.Event
			if len(line) == 0 || json.Unmarshal(line, &e) != nil || e.Verdict == audit.VerdictAllowed || e.Kind == audit.KindAgent {
				continue
			}
			mine := o.cgroup != 0 && e.Process.CgroupID == o.cgroup
			if o.label != "" && e.Sandbox.Labels["label"] == o.label {
				mine = true
			}
			for _, p := range o.pids {
				if int(e.Process.TGID) == p || int(e.Process.PPID) == p {
					mine = true
				}
			}
			if mine && (want == nil || want(e)) {
				got = append(got, e)
			}
		}
		return len(got) > 0
	})
	return got
}

func isMounted(dir string) bool {
	data, _ := os.ReadFile("/proc/self/mountinfo")
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.Fields(l)
		if len(f) > 4 && f[4] == dir {
			return true
		}
	}
	return false
}
