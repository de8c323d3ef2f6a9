package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/watcherhq/watcher/internal/control"
	"github.com/watcherhq/watcher/internal/textesc"
)

func init() {
	register("check", command{Summary: "run the canary now: prove each sandbox still refuses what its policy forbids", Run: runCheck})
}

func runCheck(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	socket := fs.String("socket", control.DefaultSocket, "agent's control socket")
	asJSON := fs.Bool("json", false, "print the reports as JSON")
	timeout := fs.Duration("timeout", 5*time.Minute, "how long to wait for the runs")
	if err := parseFlags(fs, args, stderr, `Usage: watcher check [flags] [SANDBOX]

Runs the canary of SANDBOX (default: every sandbox) now, in the running agent.
Short-lived probes, each in a fresh leaf cgroup of the sandbox, try one
operation the policy forbids per rule class it enables (read a honeytoken
under a blocked path, write outside the workspace, mount, ptrace, bpf(), a
DNS query for an unlisted name, a connect to an address the DNS proxy never
answered) and one it allows where there is a natural neighbour (read a file,
write in the workspace). Each runs twice: placed as a container runtime
places a process (its pid written into the leaf's cgroup.procs; only the
kernel hooks apply) and through watcher exec's launcher (seccomp and Landlock
too). A check passes when the outcome is what the policy and the layer table
say (denied with an errno, killed by the backstop where no layer refuses, or
allowed) and, for forbidden operations, the matching event reached the
ledger. The agent also runs the canary at start, after every policy reload
and every canary.interval (policy); failures are alerts, the metric
watcher_canary_failures_total{sandbox,check}, a non-zero 'watcher status' and,
with on_canary_failure: freeze, a frozen sandbox.

Columns: SANDBOX, PATH (runtime or exec), CHECK, TARGET, EXPECTED, GOT,
LAYER (the mechanism that acted, from the event; the layer table's when no
event came), EVENT (yes: in the ledger; no: missing; -: none expected),
RESULT. Exit 0 when every check passed, 1 when one failed.`); err != nil {
		return helpOK(err)
	}
	if fs.NArg() > 1 {
		return &exitError{Code: 2, Err: errors.New("check takes at most one sandbox name")}
	}
	reps, err := control.NewClient(*socket).Check(fs.Arg(0), *timeout)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.Encode(reps)
	} else {
		printCanary(stdout, reps)
	}
	var failed []string
	for _, r := range reps {
		if r.Failures > 0 {
			failed = append(failed, fmt.Sprintf("%s (%d)", r.Sandbox, r.Failures))
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("canary failed in %s", strings.Join(failed, ", "))
	}
	return nil
}

// printCanary is the check table. A probe's target, error detail and the
// cgroups frozen can name what a sandbox created, so every field is escaped
// for the terminal with textesc.String.
func printCanary(w io.Writer, reps []control.CanaryReport) {
	q := textesc.String
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SANDBOX\tPATH\tCHECK\tTARGET\tEXPECTED\tGOT\tLAYER\tEVENT\tRESULT")
	for _, rep := range reps {
		if rep.Skipped != "" {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\t-\t-\tskipped: %s\n", q(rep.Sandbox), q(rep.Skipped))
		}
		for _, r := range rep.Results {
			res := "ok"
			if !r.OK {
				res = "FAIL"
				if r.Detail != "" {
					res += ": " + q(r.Detail)
				}
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", q(rep.Sandbox), q(r.Path), q(r.Check), q(r.Target), q(r.Expected), q(r.Got), q(r.Layer), q(r.Event), res)
		}
	}
	tw.Flush()
	for _, rep := range reps {
		if len(rep.Frozen) > 0 {
			fmt.Fprintf(w, "\nsandbox %s frozen (on_canary_failure: freeze): %s; watcher thaw %s\n", q(rep.Sandbox), q(strings.Join(rep.Frozen, ", ")), q(rep.Sandbox))
		}
	}
}
