package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/watcherhq/watcher/internal/control"
	"github.com/watcherhq/watcher/internal/gateway"
	"github.com/watcherhq/watcher/internal/textesc"
)

func init() {
	register("approvals", command{Summary: "list tool calls waiting for approval (policy action ask)", Run: runApprovals})
	register("approve", command{Summary: "approve a tool call waiting for approval", Run: func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
		return runDecide(ctx, "approve", true, args, stdout, stderr)
	}})
	register("deny", command{Summary: "deny a tool call waiting for approval (--reason required)", Run: func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
		return runDecide(ctx, "deny", false, args, stdout, stderr)
	}})
}

var defaultGatewaySocket = filepath.Join(filepath.Dir(control.DefaultSocket), "gateway.sock")

func runApprovals(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("approvals", flag.ContinueOnError)
	socket := fs.String("socket", defaultGatewaySocket, "the agent's approvals socket (SOCKET_DIR/gateway.sock)")
	asJSON := fs.Bool("json", false, "print the pending calls as JSON")
	if err := parseFlags(fs, args, stderr, `Usage: watcher approvals [flags]

Lists the tool calls the gateway holds for a human (the policy says ask),
oldest first, with their arguments and how long until they are denied.
Answer with 'watcher approve ID' or 'watcher deny ID --reason ...'.`); err != nil {
		return helpOK(err)
	}
	pend, err := gateway.AdminClient{Path: *socket}.List()
	if err != nil {
		return fmt.Errorf("approvals: %w", err)
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		for _, p := range pend {
			if err := enc.Encode(p); err != nil {
				return err
			}
		}
		return nil
	}
	if len(pend) == 0 {
		fmt.Fprintln(stdout, "no tool calls waiting for approval")
		return nil
	}
	return printApprovals(stdout, pend, time.Now())
}

// printApprovals is the table of pending calls: the agent names the call,
// the session, the tool and its arguments, so each is escaped for the
// terminal (one row per call, no control sequence).
func printApprovals(w io.Writer, pend []gateway.Pending, now time.Time) error {
	q := textesc.String
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tTOOL\tSESSION\tRULE\tWAITING\tDENIED IN\tARGUMENTS")
	for _, p := range pend {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", q(p.ID), q(p.Tool), q(p.Session), q(p.Rule),
			now.Sub(p.Since).Round(time.Second), p.Deadline.Sub(now).Round(time.Second), q(p.Arguments))
	}
	return tw.Flush()
}

func runDecide(ctx context.Context, name string, approve bool, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	socket := fs.String("socket", defaultGatewaySocket, "the agent's approvals socket (SOCKET_DIR/gateway.sock)")
	reason := fs.String("reason", "", "why (recorded in the ledger and returned to the agent)")
	by := fs.String("by", defaultApprover(), "your name, recorded beside the uid the kernel reports")
	verb := "Approves"
	if !approve {
		verb = "Denies"
	}
	pos, err := ledgerParse(fs, args, stderr, fmt.Sprintf(`Usage: watcher %s [flags] ID

%s a tool call waiting for approval. ID is SANDBOX/CALL_ID as 'watcher
approvals' prints it, or the CALL_ID alone when only one sandbox has it
pending. The ledger records who decided (the uid of this process, from the
kernel, and --by) and why.`, name, verb), 1)
	if err != nil {
		return err
	}
	if !approve && *reason == "" {
		return &exitError{Code: 2, Err: errors.New("deny needs --reason: the agent and the ledger are told why")}
	}
	if err := (gateway.AdminClient{Path: *socket}).Decide(pos[0], approve, *reason, *by); err != nil {
		return fmt.Errorf("%s %s: %w", name, pos[0], err)
	}
	if approve {
		fmt.Fprintf(stdout, "approved %s\n", textesc.String(pos[0]))
	} else {
		fmt.Fprintf(stdout, "denied %s\n", textesc.String(pos[0]))
	}
	return nil
}

func defaultApprover() string {
	if u := os.Getenv("SUDO_USER"); u != "" {
		return u
	}
	return os.Getenv("USER")
}
