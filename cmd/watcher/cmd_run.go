package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/watcherhq/watcher/internal/agent"
	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/control"
)

func init() {
	register("run", command{Summary: "run the agent: enforce the policy, resolve DNS, write the ledger", Run: runAgent})
}

func runAgent(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	policyPath := fs.String("policy", "", "policy file (YAML); empty: the built-in default policy")
	requireLSM := fs.Bool("require-lsm", false, "refuse to start when a blocking rule has no BPF LSM program to enforce it")
	logJSON := fs.Bool("log-json", false, "log as JSON instead of text")
	quiet := fs.Bool("quiet", false, "do not log every alert, only agent events")
	tilesAddr := fs.String("serve-tiles", "", "serve the ledger read-only as C2SP tlog-tiles (checkpoint, hash tiles, entry bundles) on this host:port, for monitors and mirrors; off by default")
	var containers listFlag
	fs.Var(&containers, "container", "also cage this container in the policy's first sandbox (docker://ID, containerd://ID, cri-o://ID, pod://UID; repeatable)")
	if err := parseFlags(fs, args, stderr, `Usage: watcher run [flags]

Runs the agent in the foreground until SIGTERM or SIGINT. It mounts bpffs,
securityfs and tracefs when missing, loads and pins the BPF programs (or
adopts the pins of a previous agent, with no gap in enforcement), registers
the sandbox cgroups of the policy (and new ones matching its globs or
container ids as they appear), starts the DNS proxy, the ledger, the live
event socket, the control socket and the metrics endpoint, and prints which
layer enforces each rule on this kernel. SIGHUP reloads the policy; a bad
policy is refused and the old one stays.`); err != nil {
		return helpOK(err)
	}
	// A soft memory limit keeps the agent's heap small on busy hosts (the
	// GC works harder instead); GOMEMLIMIT in the environment overrides it.
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(64 << 20)
	}
	var h slog.Handler = slog.NewTextHandler(stderr, nil)
	if *logJSON {
		h = slog.NewJSONHandler(stderr, nil)
	}
	log := slog.New(h)
	// Signals are handled here rather than through ctx: one a sandboxed
	// process sent (the kill backstop counts those in the kernel) is
	// ignored, so a sandbox cannot stop or reload the agent. The agent's
	// context is therefore not the caller's, which main cancels on any
	// SIGTERM or SIGINT: a sandbox's signal would stop the agent's event
	// reader, DNS and egress loops while it went on answering status.
	// Registered before the start: a termination request that arrives
	// while the agent starts cannot be judged (the backstop may not count
	// signals yet), so it is reported and ignored rather than obeyed, and
	// a sandbox cannot stop an agent that is starting either.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGHUP, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)
	a, err := agent.Start(context.WithoutCancel(ctx), agent.Options{
		PolicyPath: *policyPath, RequireLSM: *requireLSM, Containers: containers,
		OnEvent: func(e audit.Event) { logEvent(log, &e, *quiet) },
	})
	if err != nil {
		return err
	}
	printLayers(stdout, a.Layers())
	if *tilesAddr != "" {
		srv, addr, err := serveTiles(*tilesAddr, a.Policy().Agent.LedgerDir)
		if err != nil {
			a.Stop()
			return err
		}
		defer srv.Close()
		log.Info("serving the ledger as tlog-tiles", "addr", addr)
	}
	log.Info("agent running", "pid", os.Getpid(), "dns", a.DNSAddr().String(),
		"ledger", a.Policy().Agent.LedgerDir, "socket_dir", a.Policy().Agent.SocketDir,
		"metrics", a.Policy().Agent.MetricsAddr, "startup", agent.FormatStartup(a.Startup()))

	if s, ok := startupSignal(sigs); ok {
		log.Warn("ignored a signal that arrived during start-up (its sender cannot be told apart then): send it again to stop", "signal", s.String())
	}
	for sig := range sigs {
		s := sig.(syscall.Signal)
		if a.SignalledBySandbox(s) {
			log.Warn("ignored a signal sent from a sandbox", "signal", s.String())
			continue
		}
		if s == syscall.SIGHUP {
			if err := a.Reload(); err != nil {
				log.Error("reload", "err", err)
			}
			continue
		}
		break
	}
	log.Info("stopping: programs stay pinned and keep enforcing")
	return a.Stop()
}

// startupSignal drains the signals queued while the agent started and
// returns the first termination request among them (a SIGHUP then needs
// no reload: the policy was just read).
func startupSignal(sigs <-chan os.Signal) (first syscall.Signal, ok bool) {
	for {
		select {
		case sig := <-sigs:
			if s := sig.(syscall.Signal); s != syscall.SIGHUP && !ok {
				first, ok = s, true
			}
		default:
			return first, ok
		}
	}
}

// listFlag collects a repeatable flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func printLayers(w io.Writer, layers []control.Layer) {
	fmt.Fprintln(w, "Enforcement on this kernel:")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  RULE\tLAYER\tNOTE")
	for _, l := range layers {
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", l.Rule, l.Mechanism, l.Note)
	}
	tw.Flush()
}

// logEvent logs agent events always, and alerts unless quiet.
func logEvent(log *slog.Logger, e *audit.Event, quiet bool) {
	switch {
	case e.Kind == audit.KindAgent && e.Rule == agent.RuleNetnsListeners && e.Severity != audit.SeverityAlert:
		// Listeners opened and closed in sandboxes' network namespaces:
		// routine, as often as containers come and go.
		log.Debug(e.Message, "kind", e.Kind)
	case e.Kind == audit.KindAgent || e.Kind == audit.KindLoss || e.Kind == audit.KindEscape:
		// The message is the record's message (one msg key); a multi-line
		// one (the layer table, printed on stdout as a table) is logged by
		// its first line.
		msg, rest, multi := strings.Cut(e.Message, "\n")
		attrs := []any{"kind", e.Kind}
		if e.Sandbox.Name != "" {
			attrs = append(attrs, "sandbox", e.Sandbox.Name)
		}
		if e.Loss != nil {
			attrs = append(attrs, "stage", e.Loss.Stage, "lost", e.Loss.Count)
		}
		if multi {
			attrs = append(attrs, "more_lines", strings.Count(rest, "\n")+1, "full_text", "ledger")
		}
		if msg == "" {
			msg = string(e.Kind)
		}
		log.Warn(msg, attrs...)
	case !quiet && e.IsAlert():
		log.Info("alert", "sandbox", e.Sandbox.Name, "kind", e.Kind, "verdict", e.Verdict,
			"pid", e.Process.TGID, "comm", e.Process.Comm, "what", detailText(e), "rule", e.Rule, "by", e.Mechanism)
	}
}
