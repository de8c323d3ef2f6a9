package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/watcherhq/watcher/internal/agent"
	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/control"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/launch"
	"github.com/watcherhq/watcher/internal/policy"
)

func init() {
	register("exec", command{Summary: "run one command in a fresh sandbox cgroup under the policy", Run: runExec})
}

func runExec(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("exec", flag.ContinueOnError)
	policyPath := fs.String("policy", "", "policy file; implies a private agent for this command")
	preset := fs.String("preset", "", "run under this preset (read-only, restricted, dev, ops); implies a private agent")
	sandboxName := fs.String("sandbox", "", "sandbox of the policy to run in (default: the first)")
	label := fs.String("label", "", "label for this run (e.g. a tool-call id): names the leaf cgroup and tags its events")
	workspace := fs.String("workspace", "", "read-write workspace directory (default: the current directory with --preset)")
	warn := fs.Duration("warn", -1, "warn after this long (default: the sandbox's policy)")
	term := fs.Duration("term", -1, "SIGTERM the command after this long (default: the sandbox's policy)")
	kill := fs.Duration("kill", -1, "kill the whole cgroup after this long (default: the sandbox's policy)")
	socket := fs.String("socket", control.DefaultSocket, "control socket of a running agent")
	quiet := fs.Bool("q", false, "do not print the verdict line")
	if err := parseFlags(fs, args, stderr, `Usage: watcher exec [flags] -- CMD [ARGS...]

Runs CMD in a fresh leaf cgroup of a sandbox, with a seccomp filter and a
Landlock ruleset from the sandbox's policy applied before exec (inherited by
every descendant, impossible to lift), under the kernel hooks of the agent.
When an agent is running, its policy applies; otherwise (or with --policy or
--preset) a private agent runs for the duration of the command.
Graded timeouts: a warning at --warn, SIGTERM at --term, cgroup.kill at
--kill; after the sandbox's circuit_breaker consecutive hard timeouts further
runs are refused. Exits with the command's exit code (128+signal when it was
killed) and prints a one-line verdict on stderr.`); err != nil {
		return helpOK(err)
	}
	argv := fs.Args()
	if len(argv) == 0 {
		return &exitError{Code: 2, Err: errors.New("exec needs a command: watcher exec [flags] -- CMD [ARGS...]")}
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))

	private := *policyPath != "" || *preset != ""
	var pol *policy.Policy
	var plan *agent.Plan
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
	switch {
	case *preset != "":
		pol, err = presetPolicy(*preset, *workspace)
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

	var a *agent.Agent
	if running {
		if plan, err = agent.Compile(pol, agent.Env{LSM: map[string]error{}}, agent.NewRuleTable()); err != nil {
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
		pol.Agent.PinDir = filepath.Join(filepath.Dir(pol.Agent.PinDir), "watcher-exec-"+id)
		pol.Agent.SocketDir = filepath.Join(pol.Agent.SocketDir, "exec-"+id)
		pol.Agent.MetricsAddr = ""
		pol.Agent.DNS.Listen = "127.0.0.1:0"
		a, err = agent.Start(ctx, agent.Options{Policy: pol, PolicyPath: *policyPath, RecordExecDenials: true, OnEvent: func(e audit.Event) {
			if e.Kind != audit.KindAgent && e.IsAlert() {
				log.Info("alert", "kind", e.Kind, "verdict", e.Verdict, "comm", e.Process.Comm, "what", detailText(&e), "rule", e.Rule, "by", e.Mechanism)
			}
		}})
		if err != nil {
			return fmt.Errorf("start private agent: %w", err)
		}
		defer func() {
			a.Stop()
			enforce.Unpin(pol.Agent.PinDir)
			os.RemoveAll(pol.Agent.SocketDir)
		}()
		plan = a.Plan()
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
	breaker, saveBreaker := loadBreaker(pol, sb)
	v, runErr := launch.Run(ctx, launch.Config{
		Path: argv[0], Args: argv[1:], Env: os.Environ(),
		Stdin: os.Stdin, Stdout: stdout, Stderr: stderr,
		Sandbox: sb.Name, CgroupParent: agent.ExecParents(pol, sb)[0], Label: *label,
		Restrictions: plan.Launch[sb.Name], Timeouts: tm, Breaker: breaker, Isolation: iso,
	})
	saveBreaker()
	if !*quiet {
		fmt.Fprintln(stderr, v.String())
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
	if workspace == "" {
		workspace, _ = os.Getwd()
	}
	src := fmt.Sprintf("version: 1\nsandboxes:\n  - name: exec\n    select: {cgroups: [/watcher]}\n    preset: %q\n    workspace: [%q]\n", preset, workspace)
	return policy.Parse("--preset "+preset, []byte(src))
}

// loadBreaker restores the sandbox's consecutive hard timeouts from a
// state file, so the circuit breaker holds across invocations.
func loadBreaker(pol *policy.Policy, sb *policy.Sandbox) (*launch.Breaker, func()) {
	b := launch.NewBreaker(sb.Exec.CircuitBreaker)
	if sb.Exec.CircuitBreaker <= 0 {
		return b, func() {}
	}
	state := filepath.Join(filepath.Dir(pol.Agent.LedgerDir), "breaker-"+sb.Name)
	if data, err := os.ReadFile(state); err == nil {
		n, _ := strconv.Atoi(strings.TrimSpace(string(data)))
		for i := 0; i < n; i++ {
			b.Record(sb.Name, true)
		}
	}
	return b, func() {
		os.MkdirAll(filepath.Dir(state), 0o700)
		os.WriteFile(state, []byte(strconv.Itoa(b.Consecutive(sb.Name))), 0o600)
	}
}

var _ = time.Second
