package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/tail"
	"github.com/watcherhq/watcher/internal/textesc"
)

func init() {
	register("tail", command{Summary: "stream live events from the running agent", Run: runTail})
}

func runTail(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("tail", flag.ContinueOnError)
	fs.SetOutput(stderr)
	socket := fs.String("socket", tail.DefaultSocket, "agent's live-event socket")
	sandbox := fs.String("sandbox", "", "only these sandboxes (comma-separated names or cgroup ids)")
	kind := fs.String("kind", "", "only these kinds (comma-separated: file_open,ptrace,mount,dns,...)")
	verdict := fs.String("verdict", "", "only these verdicts (comma-separated: allowed,recorded,denied,killed)")
	since := fs.Duration("since", 0, "only events newer than this long ago (e.g. 5m)")
	output := fs.String("o", "compact", "output: compact (one colored line per event) or json (one object per line)")
	noColor := fs.Bool("no-color", false, "compact output without ANSI colors")
	ledgerDir := fs.String("ledger", "", "read the ledger in DIR instead of the live socket (see also -f)")
	follow := fs.Bool("f", false, "with --ledger: keep following the ledger as it grows")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: watcher tail [flags]\n\nStreams events from the running agent over its unix socket.\nWith --ledger DIR [-f], reads (and follows) the ledger instead.\n\nFlags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return &exitError{Code: 2, Err: err}
	}
	if *output != "compact" && *output != "json" {
		return &exitError{Code: 2, Err: fmt.Errorf("-o must be compact or json, not %q", *output)}
	}
	f := tail.Filter{Sandboxes: splitList(*sandbox)}
	for _, k := range splitList(*kind) {
		f.Kinds = append(f.Kinds, audit.Kind(k))
	}
	for _, v := range splitList(*verdict) {
		switch audit.Verdict(v) {
		case audit.VerdictAllowed, audit.VerdictRecorded, audit.VerdictDenied, audit.VerdictKilled:
		default:
			return &exitError{Code: 2, Err: fmt.Errorf("unknown verdict %q", v)}
		}
		f.Verdicts = append(f.Verdicts, audit.Verdict(v))
	}
	if *since > 0 {
		f.Since = time.Now().Add(-*since)
	}
	print := func(e *audit.Event) error {
		if *output == "json" {
			b, err := json.Marshal(e)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(stdout, "%s\n", b)
			return err
		}
		_, err := fmt.Fprintln(stdout, compactLine(e, !*noColor))
		return err
	}
	if *ledgerDir != "" {
		return tailLedger(ctx, *ledgerDir, *follow, &f, print)
	}
	st, err := tail.Dial(*socket, f)
	if err != nil {
		return err
	}
	go func() { <-ctx.Done(); st.Close() }()
	for {
		m, err := st.Next()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, io.EOF) {
				return errors.New("the agent closed the event stream")
			}
			return fmt.Errorf("read events: %w", err)
		}
		if m.Notice != "" {
			fmt.Fprintln(stderr, "watcher tail:", textesc.String(m.Notice))
			continue
		}
		if m.Event != nil {
			if err := print(m.Event); err != nil {
				return err
			}
		}
	}
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// compactLine renders an event like `tetra getevents -o compact`: one
// line, every field escaped for the terminal (a process named with escape
// sequences must not erase or hide its own line).
func compactLine(e *audit.Event, color bool) string {
	icon, paint := "·", ""
	switch e.Verdict {
	case audit.VerdictDenied:
		icon, paint = "⛔", "\x1b[31m"
	case audit.VerdictKilled:
		icon, paint = "💀", "\x1b[35m"
	case audit.VerdictRecorded:
		icon, paint = "📝", "\x1b[33m"
	}
	q := textesc.String
	var b strings.Builder
	if color && paint != "" {
		b.WriteString(paint)
	}
	fmt.Fprintf(&b, "%s %s %-8s %-10s", icon, e.Time.Format("15:04:05.000"), q(string(e.Verdict)), q(string(e.Kind)))
	sb := e.Sandbox.Name
	if sb == "" && e.Sandbox.CgroupID != 0 {
		sb = fmt.Sprint(e.Sandbox.CgroupID)
	}
	if c := e.Sandbox.Labels[audit.LabelCanary]; c != "" {
		// The self-test's probes: never an attack.
		sb += "/canary:" + c
	} else if l := e.Sandbox.Labels["label"]; l != "" {
		sb += "/" + l
	}
	if sb != "" {
		fmt.Fprintf(&b, " [%s]", q(sb))
	}
	if e.Process.TGID != 0 {
		fmt.Fprintf(&b, " %s(%d)", q(e.Process.Comm), e.Process.TGID)
	}
	b.WriteString(" " + eventDetail(e, q))
	if e.Rule != "" {
		fmt.Fprintf(&b, " rule=%s", q(e.Rule))
	}
	if e.Mechanism != "" {
		fmt.Fprintf(&b, " by=%s", q(e.Mechanism))
	}
	if r := e.Repeat; r != nil {
		fmt.Fprintf(&b, " repeated=%d over %s", r.Count, r.Last.Sub(r.First).Round(time.Millisecond))
	}
	if color && paint != "" {
		b.WriteString("\x1b[0m")
	}
	return b.String()
}

// detailText is an event's detail as it is, for slog (whose text handler
// quotes and escapes what needs it).
func detailText(e *audit.Event) string { return eventDetail(e, plain) }

func plain(s string) string { return s }

// eventDetail is an event's detail with each field passed through q
// (textesc.String for the terminal).
func eventDetail(e *audit.Event, q func(string) string) string {
	switch {
	case e.Tool != nil:
		return strings.TrimSpace(toolText(e.Tool, q))
	case e.File != nil:
		return q(e.File.Path)
	case e.Mount != nil:
		return strings.TrimSpace(q(e.Mount.Op) + " " + q(e.Mount.Source) + " " + q(e.Mount.Target))
	case e.Target != nil:
		return fmt.Sprintf("target=%d %s", e.Target.PID, q(e.Target.Comm))
	case e.DNS != nil:
		s := q(e.DNS.Name) + " " + q(e.DNS.QType)
		if e.DNS.Reason != "" {
			s += " (" + q(e.DNS.Reason) + ")"
		}
		return s
	case e.Net != nil:
		if e.Net.Name != "" {
			return fmt.Sprintf("%s %s:%d name %s %s", q(e.Net.Op), q(e.Net.Addr), e.Net.Port, q(e.Net.Name), q(e.Net.Reason))
		}
		return fmt.Sprintf("%s %s:%d %s", q(e.Net.Op), q(e.Net.Addr), e.Net.Port, q(e.Net.Reason))
	case e.Syscall != nil:
		return fmt.Sprintf("syscall %s(%d)", q(e.Syscall.Name), e.Syscall.Nr)
	case e.Loss != nil:
		return fmt.Sprintf("lost %d at %s", e.Loss.Count, q(e.Loss.Stage))
	case e.Workspace != nil, e.Limit != nil:
		return q(e.Message)
	case len(e.Process.Args) > 0:
		args := make([]string, len(e.Process.Args))
		for i, a := range e.Process.Args {
			args[i] = q(a)
		}
		return strings.Join(args, " ")
	}
	return q(e.Message)
}
