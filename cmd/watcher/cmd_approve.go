package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

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
	show := fs.String("show", "", "print the full arguments of the pending call `ID` (SANDBOX/CALL_ID or CALL_ID) and their SHA-256")
	if err := parseFlags(fs, args, stderr, `Usage: watcher approvals [flags]

Lists the tool calls the gateway holds for a human (the policy says ask),
oldest first, with their arguments and how long until they are denied.
Arguments longer than the table shows are cut there and marked LONG; those
with control or invisible characters are marked CTRL (every field is shown
escaped). --show ID prints one call's arguments whole, exactly the bytes the
tool will run with, and their SHA-256; 'watcher approve --sha256 SUM ID'
approves those bytes only. Answer with 'watcher approve ID' or 'watcher
deny ID --reason ...'.`); err != nil {
		return helpOK(err)
	}
	if fs.NArg() != 0 {
		return &exitError{Code: 2, Err: fmt.Errorf("approvals takes no arguments (did you mean --show %s?)", textesc.String(fs.Arg(0)))}
	}
	pend, err := gateway.AdminClient{Path: *socket}.List()
	if err != nil {
		return fmt.Errorf("approvals: %w", err)
	}
	if *show != "" {
		p, err := findPending(pend, *show)
		if err != nil {
			return err
		}
		if *asJSON {
			return json.NewEncoder(stdout).Encode(p)
		}
		return showPending(stdout, p, time.Now())
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

// approvalsArgsWidth is how many columns of escaped arguments a row of
// the approvals table shows; longer ones are cut and marked LONG.
const approvalsArgsWidth = 100

// printApprovals is the table of pending calls: the agent names the call,
// the session, the tool and its arguments, so each is escaped for the
// terminal (one row per call, no control sequence). Long arguments are cut
// (marked LONG, with their size), arguments holding control or invisible
// characters marked CTRL; --show prints a call's arguments whole.
func printApprovals(w io.Writer, pend []gateway.Pending, now time.Time) error {
	q := textesc.String
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tTOOL\tSESSION\tRULE\tWAITING\tDENIED IN\tMARKS\tARGUMENTS")
	for _, p := range pend {
		shown, long := cutEscaped(p.Arguments, approvalsArgsWidth)
		var marks []string
		if long {
			marks = append(marks, fmt.Sprintf("LONG(%dB)", len(p.Arguments)))
			shown += " …(cut)"
		}
		if argsHaveControl(p.Arguments) {
			marks = append(marks, "CTRL")
		}
		if len(marks) == 0 {
			marks = []string{"-"}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", q(p.ID), q(p.Tool), q(p.Session), q(p.Rule),
			now.Sub(p.Since).Round(time.Second), p.Deadline.Sub(now).Round(time.Second), strings.Join(marks, ","), shown)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w, "LONG: arguments cut in this table; CTRL: control or invisible characters (shown escaped).\n"+
		"'watcher approvals --show ID' prints a call's arguments whole with their SHA-256.")
	return err
}

// showPending prints one pending call with its arguments whole: escaped
// for the terminal in one block between markers, with their size and
// SHA-256 (of the exact bytes, which the tool runs with).
func showPending(w io.Writer, p gateway.Pending, now time.Time) error {
	q := textesc.String
	sum := p.ArgumentsSHA256
	if sum == "" { // a gateway that did not say: the bytes shown
		h := sha256.Sum256([]byte(p.Arguments))
		sum = hex.EncodeToString(h[:])
	}
	var marks []string
	if _, long := cutEscaped(p.Arguments, approvalsArgsWidth); long {
		marks = append(marks, "LONG (cut in the table)")
	}
	if argsHaveControl(p.Arguments) {
		marks = append(marks, "CTRL (control or invisible characters: read the escapes)")
	}
	if len(marks) == 0 {
		marks = []string{"-"}
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "call:\t%s\n", q(p.ID))
	fmt.Fprintf(tw, "tool:\t%s\n", q(p.Tool))
	fmt.Fprintf(tw, "session:\t%s\n", q(p.Session))
	fmt.Fprintf(tw, "rule:\t%s (%s)\n", q(p.Rule), q(p.Why))
	if p.Peer != "" {
		fmt.Fprintf(tw, "caller:\t%s\n", q(p.Peer))
	}
	fmt.Fprintf(tw, "waiting:\t%s, denied in %s\n", now.Sub(p.Since).Round(time.Second), p.Deadline.Sub(now).Round(time.Second))
	fmt.Fprintf(tw, "arguments:\t%d bytes, SHA-256 %s\n", len(p.Arguments), sum)
	fmt.Fprintf(tw, "marks:\t%s\n", strings.Join(marks, ", "))
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "----- arguments: the exact bytes, escaped for the terminal (\\\\ is one backslash, \\xNN a byte, \\uNNNN a character, \\n a line break) -----\n%s\n----- end of arguments -----\n"+
		"Approve these bytes only: watcher approve --sha256 %s %s\n", q(p.Arguments), sum, q(p.ID))
	return err
}

// findPending is the pending call id names: SANDBOX/CALL_ID, or a CALL_ID
// pending in one sandbox only.
func findPending(pend []gateway.Pending, id string) (gateway.Pending, error) {
	var hits []gateway.Pending
	for _, p := range pend {
		if p.ID == id {
			return p, nil
		}
		if p.CallID == id {
			hits = append(hits, p)
		}
	}
	switch len(hits) {
	case 0:
		return gateway.Pending{}, fmt.Errorf("approvals: no pending call %s (it may have been answered or timed out)", textesc.String(id))
	case 1:
		return hits[0], nil
	}
	return gateway.Pending{}, fmt.Errorf("approvals: call id %s is pending in several sandboxes: name it SANDBOX/%s", textesc.String(id), textesc.String(id))
}

// cutEscaped is s escaped for the terminal, cut to at most width bytes of
// the escaped form (never inside an escape), and whether it was cut.
func cutEscaped(s string, width int) (string, bool) {
	full := textesc.String(s)
	if len(full) <= width {
		return full, false
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		_, size := utf8.DecodeRuneInString(s[i:])
		e := textesc.String(s[i : i+size])
		if b.Len()+len(e) > width {
			break
		}
		b.WriteString(e)
		i += size
	}
	return b.String(), true
}

// argsHaveControl reports whether the arguments hold a control or
// non-printing character, raw or as a JSON escape (in a key or a string).
func argsHaveControl(args string) bool {
	unsafe := func(s string) bool {
		for _, r := range s {
			if r == utf8.RuneError || !unicode.IsPrint(r) {
				return true
			}
		}
		return false
	}
	dec := json.NewDecoder(strings.NewReader(args))
	dec.UseNumber()
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return false
		}
		if err != nil {
			// Not JSON (the gateway refuses such arguments): judge the raw text.
			return unsafe(args)
		}
		if s, ok := tok.(string); ok && unsafe(s) {
			return true
		}
	}
}

func runDecide(ctx context.Context, name string, approve bool, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	socket := fs.String("socket", defaultGatewaySocket, "the agent's approvals socket (SOCKET_DIR/gateway.sock)")
	reason := fs.String("reason", "", "why (recorded in the ledger and returned to the agent)")
	by := fs.String("by", defaultApprover(), "your name, recorded beside the uid the kernel reports")
	sum := fs.String("sha256", "", "decide only if the call's arguments have this SHA-256 (as 'watcher approvals --show ID' prints it)")
	verb := "Approves"
	if !approve {
		verb = "Denies"
	}
	pos, err := ledgerParse(fs, args, stderr, fmt.Sprintf(`Usage: watcher %s [flags] ID

%s a tool call waiting for approval. ID is SANDBOX/CALL_ID as 'watcher
approvals' prints it, or the CALL_ID alone when only one sandbox has it
pending. The ledger records who decided (the uid of this process, from the
kernel, and --by) and why. With --sha256, only a call whose arguments are
the bytes 'watcher approvals --show ID' printed is decided.`, name, verb), 1)
	if err != nil {
		return err
	}
	if !approve && *reason == "" {
		return &exitError{Code: 2, Err: errors.New("deny needs --reason: the agent and the ledger are told why")}
	}
	if *sum != "" {
		if b, err := hex.DecodeString(*sum); err != nil || len(b) != sha256.Size {
			return &exitError{Code: 2, Err: fmt.Errorf("--sha256 wants %d hex digits, as 'watcher approvals --show ID' prints them", 2*sha256.Size)}
		}
	}
	if err := (gateway.AdminClient{Path: *socket}).DecideExact(pos[0], *sum, approve, *reason, *by); err != nil {
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
