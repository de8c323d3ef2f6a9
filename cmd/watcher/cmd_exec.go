package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/watcherhq/watcher/internal/agent"
	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/control"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/gateway"
	"github.com/watcherhq/watcher/internal/launch"
	"github.com/watcherhq/watcher/internal/launch/ia32"
	"github.com/watcherhq/watcher/internal/ledger"
	"github.com/watcherhq/watcher/internal/limits"
	"github.com/watcherhq/watcher/internal/plan"
	"github.com/watcherhq/watcher/internal/policy"
	"github.com/watcherhq/watcher/pkg/toolproto"
	"golang.org/x/sys/unix"
)

func init() {
	register("exec", command{Summary: "run one command in a fresh sandbox cgroup under the policy", Run: runExec})
}

func runExec(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return runExecHooked(ctx, args, stdout, stderr, nil)
}

// execHooks let another command run its process through exec's path (the
// same agent, cage and record): `watcher mcp wrap` relays a server's
// stdio and follows its events.
type execHooks struct {
	// Stdin and Stdout replace the command's.
	Stdin  io.Reader
	Stdout io.Writer
	// Ready is called once the cage is set, before the command starts.
	Ready func(execEnv)
	// OnEvent gets each refusal (or record-mode would-refuse) of the
	// sandbox while the command runs.
	OnEvent func(audit.Event)
	// OnLeaf is called with the command's leaf cgroup once it is in it.
	OnLeaf func(leaf string)
}

// execEnv is what a hooked command learns of its cage.
type execEnv struct {
	Policy  *policy.Policy
	Sandbox *policy.Sandbox
	// Record appends an event to the ledger (the agent's).
	Record func(audit.Event) error
	// Hold holds a call for `watcher approve` (the private agent's
	// gateway, or the running agent's through its control socket);
	// ApprovalsSocket is where that command reaches it.
	Hold            func(ctx context.Context, p gateway.Pending, timeout time.Duration) toolproto.Answer
	ApprovalsSocket string
	// ExecParent is the sandbox cgroup the command's leaf is made in.
	ExecParent string
}

// leafTap tells a hook the leaf, then passes on to the limits' hook.
type leafTap struct {
	inner launch.LeafHook
	on    func(string)
}

func (t leafTap) Enter(leaf string, pid int) error {
	if t.on != nil {
		t.on(leaf)
	}
	if t.inner != nil {
		return t.inner.Enter(leaf, pid)
	}
	return nil
}

func (t leafTap) Exit(leaf string) {
	if t.inner != nil {
		t.inner.Exit(leaf)
	}
}

func runExecHooked(ctx context.Context, args []string, stdout, stderr io.Writer, hooks *execHooks) error {
	fs := flag.NewFlagSet("exec", flag.ContinueOnError)
	policyPath := fs.String("policy", "", "policy file; implies a private agent for this command")
	preset := fs.String("preset", "", "run under this preset (read-only, restricted, dev, ops); implies a private agent")
	sandboxName := fs.String("sandbox", "", "sandbox of the policy to run in (default: the first)")
	label := fs.String("label", "", "label for this run (e.g. a tool-call id): names the leaf cgroup and tags its events")
	workspace := fs.String("workspace", "", "the sandbox's workspace for this run, read-write wherever it lives (default with --preset or the built-in policy: the current directory); with a running agent it must be one of the sandbox's workspaces")
	proofPath := fs.String("proof", "", "write a C2SP tlog-proof bundle of this run's ledger records, with the witnesses' cosignatures, to this file (check it with watcher ledger check-proof)")
	fs.DurationVar(&proofWait, "proof-wait", proofWait, "with --proof, how long to wait for a checkpoint covering the run and the witnesses' cosignatures")
	reportPath := fs.String("report", "", "write what was refused during the run (with the policy lines that would allow it) to this file as JSON")
	warn := fs.Duration("warn", -1, "warn after this long (default: the sandbox's policy)")
	term := fs.Duration("term", -1, "SIGTERM the command after this long (default: the sandbox's policy)")
	kill := fs.Duration("kill", -1, "kill the whole cgroup after this long (default: the sandbox's policy)")
	socket := fs.String("socket", control.DefaultSocket, "control socket of a running agent")
	quiet := fs.Bool("q", false, "do not print the verdict line")
	asUser := fs.String("as-user", "", "run the command as UID:GID with no supplementary groups (setpriv, inside the cage; the run alone is granted CAP_SETUID and CAP_SETGID for that step, which the uid change then clears)")
	if err := parseFlags(fs, args, stderr, `Usage: watcher exec [flags] -- CMD [ARGS...]

Runs CMD in a fresh leaf cgroup of a sandbox, with a seccomp filter and a
Landlock ruleset from the sandbox's policy applied before exec (inherited by
every descendant, impossible to lift), under the kernel hooks of the agent.
Before exec CMD also loses every capability the sandbox's policy does not
grant (allow or record in operations.capabilities; bounding, permitted,
effective and inheritable sets, ambient cleared, no_new_privs), and gets
namespaces of its own: PID (with its own /proc: host processes are not
visible; a small init is PID 1, forwards signals and reaps), UTS (starting
with the host's names), IPC and mount. seccomp refuses TIOCSTI and TIOCLINUX
on every terminal; Landlock's IPC scope (kernels with Landlock ABI 6) refuses
signals and abstract unix socket connections to processes outside the
command's domain. The verdict line says what was in force: seccomp, landlock,
scope, caps (how many held), ns, nnp.
When an agent is running, its policy applies; otherwise (or with --policy or
--preset) a private agent runs for the duration of the command.
Graded timeouts: a warning at --warn, SIGTERM at --term, cgroup.kill at
--kill; after the sandbox's circuit_breaker consecutive hard timeouts further
runs are refused. Exits with the command's exit code (128+signal when it was
killed) and prints a one-line verdict on stderr, followed by a summary of
what was refused during the run: operation, path or address, rule, layer,
result (refused with an errno, or killed by the backstop where no layer
refuses with one) and the policy lines that would allow it. --report FILE
writes the same as JSON, with the run's --label.`); err != nil {
		return helpOK(err)
	}
	argv := fs.Args()
	if len(argv) == 0 {
		return &exitError{Code: 2, Err: errors.New("exec needs a command: watcher exec [flags] -- CMD [ARGS...]")}
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))

	private := *policyPath != "" || *preset != ""
	var pol *policy.Policy
	var execPlan *plan.Plan
	running := false
	if st, err := control.NewClient(*socket).Status(); err == nil {
		if private {
			return &exitError{Code: 2, Err: fmt.Errorf("an agent is running (pid %d) with its own policy: drop --policy/--preset, or stop it", st.PID)}
		}
		running = true
		if st.Policy != "" {
			*policyPath = st.Policy
		}
	}
	var err error
	ws := ""
	if *workspace != "" {
		if ws, err = workspaceDir(*workspace); err != nil {
			return &exitError{Code: 2, Err: err}
		}
	} else if !running && *policyPath == "" {
		// The built-in policy and presets take the current directory
		// (none when it is "/").
		ws, _ = workspaceDir("")
	}
	switch {
	case *preset != "":
		pol, err = presetPolicy(*preset, ws)
	case *policyPath != "":
		pol, err = policy.Load(*policyPath)
	default:
		pol = policy.Default()
	}
	if err != nil {
		return err
	}
	sb, err := pickSandbox(pol, *sandboxName)
	if err != nil {
		return err
	}
	if err := setWorkspace(sb, ws, *workspace != "", running); err != nil {
		return &exitError{Code: 2, Err: err}
	}

	col := &refusalCollector{sandbox: sb.Name}
	if hooks != nil {
		col.hook = hooks.OnEvent
	}
	var a *agent.Agent
	if running {
		stop, err := col.follow(filepath.Join(filepath.Dir(*socket), "events.sock"))
		if err != nil {
			log.Warn("the summary will not list refusals: cannot follow the agent's events", "err", err)
		}
		defer stop()
		if execPlan, err = plan.Compile(pol, plan.Env{LSM: map[string]error{}, IA32: ia32.Available()}, plan.NewRuleTable()); err != nil {
			return err
		}
		// The agent records what seccomp and Landlock refuse only once
		// told a command runs under them.
		if err := control.NewClient(*socket).PrepareExec(); err != nil {
			log.Warn("the agent will not record this command's seccomp and Landlock refusals", "err", err)
		}
	} else {
		// A private agent: its own pins, sockets and DNS port, removed at
		// the end; the policy's ledger.
		id := strconv.Itoa(os.Getpid())
		created := newCgroups(agent.ExecParents(pol, sb))
		removeStalePrivateAgents(log, filepath.Dir(pol.Agent.PinDir), pol.Agent.SocketDir)
		pol.Agent.PinDir = filepath.Join(filepath.Dir(pol.Agent.PinDir), "watcher-exec-"+id)
		pol.Agent.SocketDir = filepath.Join(pol.Agent.SocketDir, "exec-"+id)
		pol.Agent.MetricsAddr = ""
		pol.Agent.DNS.Listen = "127.0.0.1:0"
		a, err = agent.Start(ctx, agent.Options{Policy: pol, PolicyPath: *policyPath, RecordExecDenials: true, NoCanary: true, OnEvent: func(e audit.Event) {
			if col.add(e) {
				return // in the summary at the end
			}
			if e.Kind != audit.KindAgent && e.Mechanism != agent.MechanismMCPWrap && e.IsAlert() {
				log.Info("alert", "kind", e.Kind, "verdict", e.Verdict, "comm", e.Process.Comm, "what", detailText(&e), "rule", e.Rule, "by", e.Mechanism)
			}
		}})
		cleanup := func() {
			enforce.Unpin(pol.Agent.PinDir)
			os.RemoveAll(pol.Agent.SocketDir)
			created.remove()
		}
		if err != nil {
			cleanup()
			if errors.Is(err, ledger.ErrLocked) {
				// Parallel tool calls need one agent to share.
				err = fmt.Errorf("%w (another watcher exec is running without an agent and holds the ledger: run the agent, `watcher run`, for commands in parallel)", err)
			}
			return fmt.Errorf("start private agent: %w", err)
		}
		defer func() {
			a.Stop()
			cleanup()
		}()
		execPlan = a.Plan()
	}

	tm := launch.Timeouts{Warn: sb.Exec.Timeouts.Warn.Duration, Term: sb.Exec.Timeouts.Term.Duration, Kill: sb.Exec.Timeouts.Kill.Duration}
	if *warn >= 0 {
		tm.Warn = *warn
	}
	if *term >= 0 {
		tm.Term = *term
	}
	if *kill >= 0 {
		tm.Kill = *kill
	}
	tm.OnWarn = func() { log.Warn("command still running", "after", tm.Warn, "sandbox", sb.Name, "label", *label) }
	iso, err := overlayIsolation(pol, sb)
	if err != nil {
		return &exitError{Code: 126, Err: err}
	}
	iso.Namespaces |= launch.SubtreeNamespaces
	res := launch.ExecRestrictions(execPlan.Launch[sb.Name], sb)
	if *asUser != "" {
		if argv, res, err = runAsUser(*asUser, argv, res); err != nil {
			return &exitError{Code: 126, Err: err}
		}
	}
	lim, err := newExecLimits(sb, agent.ExecParents(pol, sb)[0], *label)
	if err != nil {
		return &exitError{Code: 126, Err: err}
	}
	breaker, saveBreaker := loadBreaker(pol, sb)
	proofFrom := runProofStart(a, *socket)
	var stdin io.Reader = os.Stdin
	leaf := lim.Hook()
	if hooks != nil {
		stdin, stdout = hooks.Stdin, hooks.Stdout
		leaf = leafTap{inner: leaf, on: hooks.OnLeaf}
		env := execEnv{Policy: pol, Sandbox: sb, ExecParent: agent.ExecParents(pol, sb)[0], Record: func(e audit.Event) error {
			if running {
				return control.NewClient(*socket).Record(e)
			}
			return a.Record(e)
		}}
		if a != nil && a.Gateway() != nil {
			env.Hold = a.Gateway().Hold
			env.ApprovalsSocket = filepath.Join(pol.Agent.SocketDir, "gateway.sock")
		}
		if running {
			env.Hold = func(ctx context.Context, p gateway.Pending, timeout time.Duration) toolproto.Answer {
				ans, err := control.NewClient(*socket).Hold(ctx, control.HoldRequest{Sandbox: p.Sandbox, Session: p.Session, CallID: p.CallID, Tool: p.Tool,
					Arguments: p.Arguments, ArgumentsSHA256: p.ArgumentsSHA256, Rule: p.Rule, Why: p.Why, Peer: p.Peer, Timeout: timeout})
				if err != nil {
					return toolproto.Answer{By: "watcher", Reason: "the running agent cannot hold the call: " + err.Error()}
				}
				return toolproto.Answer{Approved: ans.Approved, TimedOut: ans.TimedOut, By: ans.By, Reason: ans.Reason}
			}
			env.ApprovalsSocket = filepath.Join(filepath.Dir(*socket), "gateway.sock")
		}
		if hooks.Ready != nil {
			hooks.Ready(env)
		}
	}
	v, runErr := launch.Run(ctx, launch.Config{
		Path: argv[0], Args: argv[1:], Env: plan.SecretEnv(pol, sb.Name, os.Environ()),
		Stdin: stdin, Stdout: stdout, Stderr: stderr,
		Sandbox: sb.Name, CgroupParent: agent.ExecParents(pol, sb)[0], Label: *label,
		Restrictions: res, Timeouts: tm, Breaker: breaker, Isolation: iso, Leaf: leaf,
	})
	saveBreaker()
	if err := lim.Finish(stderr, func(e audit.Event) error {
		if running {
			return control.NewClient(*socket).Record(e)
		}
		return a.Record(e)
	}); err != nil {
		log.Warn("limit hits not recorded", "err", err)
	}
	// Every event of the run is in: the private agent drains its rings
	// when it stops; a running agent's stream gets the reader's deadline.
	if a != nil {
		a.Stop()
	} else {
		col.settle()
	}
	rep := col.report(pol, sb, v, argv)
	if !*quiet {
		fmt.Fprintln(stderr, v.String())
		if len(rep.Refusals) > 0 {
			rep.WriteSummary(stderr)
		}
	}
	if *reportPath != "" {
		if err := writeReport(*reportPath, rep); err != nil {
			return errors.Join(runErr, err)
		}
	}
	if *proofPath != "" {
		if err := writeRunProof(ctx, pol, running, *socket, v.CgroupID, proofFrom, *proofPath, stderr); err != nil {
			return errors.Join(runErr, err)
		}
	}
	switch {
	case v.Outcome == launch.OutcomeRefused || v.Outcome == launch.OutcomeFailed:
		if runErr == nil {
			runErr = fmt.Errorf("%s", v.Outcome)
		}
		return &exitError{Code: 126, Err: runErr}
	case runErr != nil:
		return runErr
	case v.Signal != 0:
		return &exitError{Code: 128 + int(v.Signal), Err: fmt.Errorf("command killed by signal %d", v.Signal)}
	case v.ExitCode != 0:
		return &exitError{Code: v.ExitCode, Err: fmt.Errorf("command exited with %d", v.ExitCode)}
	}
	return nil
}

func pickSandbox(pol *policy.Policy, name string) (*policy.Sandbox, error) {
	if len(pol.Sandboxes) == 0 {
		return nil, errors.New("the policy has no sandboxes")
	}
	if name == "" {
		return &pol.Sandboxes[0], nil
	}
	if sb := pol.Sandbox(name); sb != nil {
		return sb, nil
	}
	var names []string
	for _, s := range pol.Sandboxes {
		names = append(names, s.Name)
	}
	return nil, fmt.Errorf("no sandbox %q in the policy (have: %s)", name, strings.Join(names, ", "))
}

// presetPolicy builds a one-sandbox policy from a preset.
func presetPolicy(preset, workspace string) (*policy.Policy, error) {
	src := fmt.Sprintf("version: 1\nsandboxes:\n  - name: exec\n    select: {cgroups: [/watcher]}\n    preset: %q\n", preset)
	if workspace != "" {
		src += fmt.Sprintf("    workspace: [%q]\n", workspace)
	}
	return policy.Parse("--preset "+preset, []byte(src))
}

// loadBreaker restores the sandbox's consecutive hard timeouts from a
// state file, so the circuit breaker holds across invocations.
func loadBreaker(pol *policy.Policy, sb *policy.Sandbox) (*launch.Breaker, func()) {
	b := launch.NewBreaker(sb.Exec.CircuitBreaker)
	if sb.Exec.CircuitBreaker <= 0 {
		return b, func() {}
	}
	// Under the agent's protected files: a sandboxed command cannot reset it.
	state := agent.BreakerFile(pol, sb.Name)
	if data, err := os.ReadFile(state); err == nil {
		n, err := strconv.Atoi(strings.TrimSpace(string(data)))
		if err != nil || n < 0 {
			// Emptied or garbled: where the kill backstop is the layer, a
			// write-open with O_TRUNC empties a file before the kill.
			// Fail closed: the breaker stays open until an operator
			// removes the file.
			n = sb.Exec.CircuitBreaker
		}
		for i := 0; i < n; i++ {
			b.Record(sb.Name, true)
		}
	}
	return b, func() {
		os.MkdirAll(filepath.Dir(state), 0o700)
		os.WriteFile(state, []byte(strconv.Itoa(b.Consecutive(sb.Name))), 0o600)
	}
}

// workspaceDir resolves the workspace of a run: the directory given, or
// the current one, as the kernel sees it (symlinks resolved, since the
// layers judge resolved paths).
func workspaceDir(dir string) (string, error) {
	if dir == "" {
		wd, err := os.Getwd()
		if err != nil {
			return "", fmt.Errorf("workspace: %w", err)
		}
		dir = wd
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("workspace: %w", err)
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return "", fmt.Errorf("workspace: %w", err)
	}
	st, err := os.Stat(real)
	if err != nil {
		return "", fmt.Errorf("workspace: %w", err)
	}
	if !st.IsDir() {
		return "", fmt.Errorf("workspace %s is not a directory", real)
	}
	if real == "/" {
		return "", errors.New("workspace /: every path would be writable; run from (or pass --workspace) a project directory")
	}
	return real, nil
}

// setWorkspace makes ws the sandbox's workspace for this run. A running
// agent's kernel rules know only its policy's workspaces, so there ws must
// be one of them.
func setWorkspace(sb *policy.Sandbox, ws string, explicit, running bool) error {
	if ws == "" {
		return nil
	}
	if running {
		for _, w := range sb.Workspace {
			if filepath.Clean(w) == ws {
				return nil
			}
		}
		have := strings.Join(sb.Workspace, ", ")
		if have == "" {
			have = "none"
		}
		return fmt.Errorf("--workspace %s: the running agent's sandbox %s has other workspaces (%s); add it to the policy's workspace list and reload, or stop the agent to run with a private one", ws, sb.Name, have)
	}
	if !explicit && len(sb.Workspace) > 0 {
		return nil // the policy names its own
	}
	sb.Workspace = []string{ws}
	return nil
}

// execCgroups are the sandbox cgroups a private agent creates: removed
// when it stops (an empty cgroup only: another run still inside keeps it).
type execCgroups []string

// newCgroups lists which of the exec parents do not exist yet.
func newCgroups(parents []string) execCgroups {
	var out execCgroups
	for _, cg := range parents {
		abs, err := cgroupfs.Abs(cg)
		if err != nil {
			continue
		}
		if _, err := os.Stat(abs); errors.Is(err, os.ErrNotExist) {
			out = append(out, abs)
		}
	}
	return out
}

func (c execCgroups) remove() {
	for _, abs := range c {
		// rmdir: fails, and keeps it, while a run is inside.
		if os.Remove(abs) != nil {
			continue
		}
		// The v1 twins the limits made (hybrid hosts).
		if h, err := limits.Detect(); err == nil {
			if root, err := cgroupfs.Mountpoint(); err == nil {
				h.RemoveV1Tree(strings.TrimPrefix(abs, root))
			}
		}
	}
}

// removeStalePrivateAgents removes the pins and sockets of private agents
// whose `watcher exec` was killed before it could (SIGKILL, a crash):
// their pinned links would keep the programs attached, and the host on
// their slow path, for good. A directory is stale when no process has
// the pid in its name.
func removeStalePrivateAgents(log *slog.Logger, pinParent, socketDir string) {
	dirs, _ := filepath.Glob(filepath.Join(pinParent, "watcher-exec-*"))
	for _, d := range dirs {
		pid, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(d), "watcher-exec-"))
		if err != nil || pid <= 0 || pid == os.Getpid() || !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
			continue
		}
		if err := enforce.Unpin(d); err != nil {
			log.Warn("stale private agent pins not removed", "dir", d, "err", err)
			continue
		}
		os.RemoveAll(filepath.Join(socketDir, "exec-"+strconv.Itoa(pid)))
		log.Info("removed the pins of a private agent that was killed", "dir", d)
	}
}

// runAsUser drops the command to uid:gid with setpriv inside the cage.
// Default-deny privilege leaves the command no CAP_SETUID or CAP_SETGID, so
// this run alone gets them for setpriv's step; setresuid to a non-zero uid
// clears the permitted and effective sets, and no_new_privs keeps them
// cleared.
func runAsUser(spec string, argv []string, res launch.Restrictions) ([]string, launch.Restrictions, error) {
	u, g, ok := strings.Cut(spec, ":")
	uid, uerr := strconv.ParseUint(u, 10, 32)
	gid, gerr := strconv.ParseUint(g, 10, 32)
	if !ok || uerr != nil || gerr != nil {
		return nil, res, fmt.Errorf("--as-user %q: want UID:GID (numbers)", spec)
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		return nil, res, fmt.Errorf("--as-user needs setpriv (util-linux): %w", err)
	}
	caps := launch.CapSet(0)
	if res.Capabilities != nil {
		caps = *res.Capabilities
	}
	caps |= 1<<unix.CAP_SETUID | 1<<unix.CAP_SETGID
	res.Capabilities = &caps
	pre := []string{setpriv, "--reuid=" + strconv.FormatUint(uid, 10), "--regid=" + strconv.FormatUint(gid, 10), "--clear-groups", "--"}
	return append(pre, argv...), res, nil
}
