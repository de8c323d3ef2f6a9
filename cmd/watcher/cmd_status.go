package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/watcherhq/watcher/internal/control"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/textesc"
)

func init() {
	register("status", command{Summary: "show the agent's health; non-zero exit when a required layer is missing", Run: runStatus})
	register("thaw", command{Summary: "thaw a sandbox frozen by the escape watch", Run: runThaw})
	register("reload", command{Summary: "ask the running agent to reload its policy (same as SIGHUP)", Run: runReload})
	register("unpin", command{Summary: "remove pinned programs and maps: enforcement stops", Run: runUnpin})
}

func parseFlags(fs *flag.FlagSet, args []string, stderr io.Writer, usage string) error {
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, usage+"\n\nFlags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return errHelpShown
		}
		return &exitError{Code: 2, Err: err}
	}
	return nil
}

func runStatus(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	socket := fs.String("socket", control.DefaultSocket, "agent's control socket")
	asJSON := fs.Bool("json", false, "print the status as JSON")
	showPosture := fs.Bool("posture", false, "print each sandbox cgroup's hardening as the kernel reports it (capabilities, no_new_privs,\nseccomp, user namespace, mounts of /, /tmp and the workspace, limits); exit 1 when one lacks\nan item its sandbox requires")
	programs := fs.Bool("programs", false, "measure each of the agent's BPF programs for --for (runs, ns per run, CPU)\nfrom the kernel's BPF statistics, turned on for that window only, and print a table")
	window := fs.Duration("for", 5*time.Second, "with --programs: how long to measure")
	pinDir := fs.String("pin-dir", enforce.DefaultPinDir, "with --programs: the agent's pin directory (agent.pin_dir)")
	if err := parseFlags(fs, args, stderr, "Usage: watcher status [flags]\n\nHealth at a glance. Exit 0 when the agent is up and every required layer is\navailable, 1 otherwise: usable as a readiness probe."); err != nil {
		return helpOK(err)
	}
	if *programs {
		return printProgramCosts(ctx, stdout, stderr, *pinDir, *window, *asJSON)
	}
	st, err := control.NewClient(*socket).Status()
	if err != nil {
		return err
	}
	if *showPosture {
		var lacking []string
		if *asJSON {
			lacking = postureJSON(stdout, &st)
		} else {
			lacking = printPosture(stdout, &st)
		}
		if len(lacking) > 0 {
			return fmt.Errorf("sandbox cgroups lack required hardening: %s", strings.Join(lacking, "; "))
		}
		return nil
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.Encode(st)
	} else {
		printStatus(stdout, &st)
	}
	if len(st.Missing) > 0 {
		return fmt.Errorf("required layers missing: %s", strings.Join(st.Missing, ", "))
	}
	if failed := canaryFailures(&st); len(failed) > 0 {
		return fmt.Errorf("canary failed (watcher check shows the table): %s", strings.Join(failed, "; "))
	}
	return nil
}

// canaryFailures lists, per sandbox, the checks its last canary run
// failed.
func canaryFailures(st *control.Status) []string {
	var out []string
	seen := map[string]bool{}
	for _, s := range st.Sandboxes {
		c := s.Canary
		if c == nil || c.Failures == 0 || seen[s.Name] {
			continue
		}
		seen[s.Name] = true
		var checks []string
		for _, r := range c.Results {
			if !r.OK {
				checks = append(checks, r.Path+"/"+r.Check)
			}
		}
		if c.Skipped != "" {
			checks = append(checks, c.Skipped)
		}
		out = append(out, s.Name+": "+strings.Join(checks, ", "))
	}
	return out
}

// printStatus is the status for people. Cgroup paths (a sandbox with a
// delegated cgroup names its children), notes and names are escaped for the
// terminal with textesc.String.
func printStatus(w io.Writer, st *control.Status) {
	q := textesc.String
	fmt.Fprintf(w, "agent       up, pid %d, since %s\n", st.PID, st.Started.Format("2006-01-02 15:04:05"))
	k := st.Kernel
	lsm := "active"
	if n := k.LSMLayer["fmod_ret"]; n > 0 {
		lsm = fmt.Sprintf("active, %d hook(s) as fmod_ret on security_* functions", n)
		if k.LSMLayer["lsm"] == 0 {
			lsm = fmt.Sprintf("not enabled; its %d hooks run as fmod_ret on security_* functions", n)
		}
	}
	if !k.BPFLSM {
		lsm = "unavailable: " + q(k.BPFLSMWhy)
	}
	fmt.Fprintf(w, "kernel      %s; BPF LSM %s\n", q(k.Release), lsm)
	fmt.Fprintf(w, "cgroup2     %s   bpffs %s   landlock ABI %d\n", q(k.Cgroup2), q(k.BPFFS), k.LandlockABI)
	fmt.Fprintf(w, "ledger      %s: %d records, head #%d %s", q(st.Ledger.Dir), st.Ledger.Records, st.Ledger.HeadSeq, q(short(st.Ledger.HeadHash)))
	if !st.Ledger.LastCheckpoint.IsZero() {
		fmt.Fprintf(w, ", checkpoint %s", st.Ledger.LastCheckpoint.Format("15:04:05"))
	}
	fmt.Fprintln(w)
	var losses []string
	for stage, n := range st.Losses {
		losses = append(losses, fmt.Sprintf("%s=%d", q(stage), n))
	}
	sort.Strings(losses)
	if len(losses) == 0 {
		losses = []string{"none"}
	}
	fmt.Fprintf(w, "losses      %s\n", strings.Join(losses, " "))
	fmt.Fprintf(w, "canary      %s\n\n", canarySummary(st))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SANDBOX\tMODE\tCGROUP\tFROZEN\tESCAPE\tDENIED\tKILLED\tRECORDED\tALLOWED")
	for _, s := range st.Sandboxes {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%v\t%.1f\t%d\t%d\t%d\t%d\n", q(s.Name), q(s.Mode), q(s.Path), s.Frozen, s.Escape,
			s.Events["denied"], s.Events["killed"], s.Events["recorded"], s.Events["allowed"])
	}
	tw.Flush()
	fmt.Fprintln(w)
	printMembers(w, st)
	printExports(w, st)
	printUsage(w, st)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RULE\tENFORCED BY\tNOTE")
	for _, l := range st.Layers {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", q(l.Rule), q(l.Mechanism), q(l.Note))
	}
	tw.Flush()
}

func short(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	return h
}

// helpOK turns a shown --help into success.
func helpOK(err error) error {
	if errors.Is(err, errHelpShown) {
		return nil
	}
	return err
}

func runThaw(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("thaw", flag.ContinueOnError)
	socket := fs.String("socket", control.DefaultSocket, "agent's control socket")
	if err := parseFlags(fs, args, stderr, "Usage: watcher thaw SANDBOX\n\nThaws a sandbox the escape watch froze."); err != nil {
		return helpOK(err)
	}
	if fs.NArg() != 1 {
		return &exitError{Code: 2, Err: errors.New("thaw needs exactly one sandbox name")}
	}
	if err := control.NewClient(*socket).Thaw(fs.Arg(0)); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "sandbox %s thawed\n", textesc.String(fs.Arg(0)))
	return nil
}

func runReload(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("reload", flag.ContinueOnError)
	socket := fs.String("socket", control.DefaultSocket, "agent's control socket")
	if err := parseFlags(fs, args, stderr, "Usage: watcher reload\n\nReloads the policy; a bad policy is refused and the old one stays."); err != nil {
		return helpOK(err)
	}
	if err := control.NewClient(*socket).Reload(); err != nil {
		return err
	}
	fmt.Fprintln(stdout, "policy reloaded")
	return nil
}

func runUnpin(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("unpin", flag.ContinueOnError)
	pinDir := fs.String("pin-dir", enforce.DefaultPinDir, "bpffs directory with watcher's pins")
	socket := fs.String("socket", control.DefaultSocket, "agent's control socket")
	force := fs.Bool("force", false, "unpin even while an agent is running")
	if err := parseFlags(fs, args, stderr, "Usage: watcher unpin [flags]\n\nRemoves watcher's pinned programs, links and maps. Enforcement stops once\nno agent holds them: this is how watcher is uninstalled."); err != nil {
		return helpOK(err)
	}
	if _, err := control.NewClient(*socket).Status(); err == nil && !*force {
		return errors.New("an agent is running: stop it first, or pass --force")
	}
	if err := enforce.Unpin(*pinDir); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "removed pins under %s\n", *pinDir)
	return nil
}

// canarySummary is the status line of the sandboxes' last canary runs.
func canarySummary(st *control.Status) string {
	q := textesc.String
	var parts []string
	seen := map[string]bool{}
	for _, s := range st.Sandboxes {
		c := s.Canary
		if seen[s.Name] {
			continue
		}
		seen[s.Name] = true
		switch {
		case c == nil:
			parts = append(parts, q(s.Name)+": not run yet")
		case c.Skipped != "" && c.Failures == 0:
			parts = append(parts, fmt.Sprintf("%s: skipped at %s (%s)", q(s.Name), c.Time.Format("15:04:05"), q(c.Skipped)))
		case c.Failures > 0:
			parts = append(parts, fmt.Sprintf("%s: FAILED %d of %d at %s", q(s.Name), c.Failures, len(c.Results), c.Time.Format("15:04:05")))
		default:
			parts = append(parts, fmt.Sprintf("%s: %d checks passed at %s", q(s.Name), len(c.Results), c.Time.Format("15:04:05")))
		}
	}
	if len(parts) == 0 {
		return "no sandboxes"
	}
	return strings.Join(parts, "; ")
}

// printMembers names the containers in the sandboxes (pod, namespace,
// container, id), when any sandbox holds one. Names come from container
// labels: escaped.
func printMembers(w io.Writer, st *control.Status) {
	q := textesc.String
	var rows []string
	for _, s := range st.Sandboxes {
		m := s.Member
		if len(m) == 0 {
			continue
		}
		who := "container"
		if pod := m["k8s.pod.name"]; pod != "" {
			who = "pod " + q(m["k8s.namespace.name"]) + "/" + q(pod)
			if c := m["k8s.container.name"]; c != "" {
				who += " container " + q(c)
			}
		}
		rows = append(rows, fmt.Sprintf("%s\t%s\t%.12s", q(s.Name), who, q(m["container.id"])))
	}
	if len(rows) == 0 {
		return
	}
	sort.Strings(rows)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SANDBOX\tMEMBER\tCONTAINER")
	for _, r := range rows {
		fmt.Fprintln(tw, r)
	}
	tw.Flush()
	fmt.Fprintln(w)
}

// printExports shows the OTLP exporters' counters, when there are any.
func printExports(w io.Writer, st *control.Status) {
	if len(st.Exports) == 0 {
		return
	}
	q := textesc.String
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "EXPORT\tENDPOINT\tSENT\tQUEUED\tFILTERED\tTHROTTLED\tDROPPED\tREJECTED\tFAILURES\tLAST ERROR")
	for _, x := range st.Exports {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\n", q(x.Name), q(x.Endpoint), x.Sent, x.Queued,
			x.Filtered, x.Throttled, x.Dropped, x.Rejected, x.Failures, q(x.LastError))
	}
	tw.Flush()
	fmt.Fprintln(w)
}
