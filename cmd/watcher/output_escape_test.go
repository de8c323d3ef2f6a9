package main

// Output nobody can forge (issue 26): a sandbox names processes, paths,
// arguments, DNS names and tool arguments; the operator's human-readable
// outputs must show them escaped (no control sequence erases or hides a
// line, no event spans two lines), keep printable UTF-8 as it is, and the
// JSON outputs must keep the exact text.

import (
	"bytes"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/control"
	"github.com/watcherhq/watcher/internal/gateway"
	"github.com/watcherhq/watcher/internal/ledger"
	"github.com/watcherhq/watcher/internal/workspace"
)

const (
	// evil erases its line and hides what follows (ESC[G ESC[K ESC[8m),
	// breaks the line (\n, \r, and NEL U+0085, a C1 control), reverses
	// the text after it (U+202E) and is not UTF-8 (\xff).
	evil = "x\x1b[G\x1b[K\x1b[8mhid\nden\rline\u202eevil\u0085c1\xffbad"
	// evilShown is how every output must show it (strconv.Quote, used for
	// some of ledger cat's fields, escapes these the same way).
	evilShown = `x\x1b[G\x1b[K\x1b[8mhid\nden\rline\u202eevil\u0085c1\xffbad`
	// evilJSON is evil as the ledger keeps it: JSON has no room for the
	// invalid byte (encoding/json writes U+FFFD).
	evilJSON = "x\x1b[G\x1b[K\x1b[8mhid\nden\rline\u202eevil\u0085c1\ufffdbad"
	// benign is printable UTF-8 that must reach the screen as it is.
	benign = "café-日本🦀e\u0301"
)

// checkShown fails when out holds a raw control or non-printing rune (but
// the line breaks between rows) or invalid UTF-8, or lacks want.
func checkShown(t *testing.T, what, out, want string) {
	t.Helper()
	if !utf8.ValidString(out) {
		t.Errorf("%s: invalid UTF-8 in\n%q", what, out)
	}
	for _, r := range out {
		if r != '\n' && !unicode.IsPrint(r) {
			t.Errorf("%s: raw %U in\n%q", what, r, out)
			break
		}
	}
	if !strings.Contains(out, want) {
		t.Errorf("%s: %q not shown in\n%s", what, want, out)
	}
}

// outputCase renders one output with name in every field a sandbox can
// influence.
type outputCase struct {
	name   string
	render func(name string) string
}

// testOutputs checks each output with the hostile name (escaped, no raw
// control, as many lines as with a plain name) and the benign one (as it
// is).
func testOutputs(t *testing.T, cases []outputCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			plainOut := c.render("plain")
			out := c.render(evil)
			checkShown(t, c.name, out, evilShown)
			if got, want := strings.Count(out, "\n"), strings.Count(plainOut, "\n"); got != want {
				t.Errorf("%d lines with the hostile name, %d with a plain one:\n%s", got, want, out)
			}
			nice := c.render(benign)
			checkShown(t, c.name, nice, benign)
			if strings.Contains(nice, `\`) {
				t.Errorf("printable UTF-8 escaped:\n%s", nice)
			}
		})
	}
}

// hostileEvents carry name in each kind's sandbox-influenced fields.
func hostileEvents(name string) []audit.Event {
	at := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	sb := audit.Sandbox{Name: "agents", Labels: map[string]string{"label": "call-" + name}}
	proc := audit.Process{PID: 7, TGID: 7, Comm: name, Args: []string{"sh", "-c", name}}
	ev := func(k audit.Kind, v audit.Verdict) audit.Event {
		return audit.Event{Time: at, Kind: k, Verdict: v, Severity: audit.SeverityAlert, Rule: "r", Mechanism: "lsm", Sandbox: sb, Process: proc}
	}
	var out []audit.Event
	e := ev(audit.KindFileOpen, audit.VerdictDenied)
	e.File = &audit.FileDetail{Path: "/work/" + name}
	out = append(out, e)
	e = ev(audit.KindExec, audit.VerdictAllowed)
	out = append(out, e)
	e = ev(audit.KindDNS, audit.VerdictDenied)
	e.DNS = &audit.DNSDetail{Name: name + ".example.", QType: "TXT", Reason: "looks like " + name}
	out = append(out, e)
	e = ev(audit.KindNet, audit.VerdictKilled)
	e.Net = &audit.NetDetail{Family: 1, Op: "connect", Addr: "/run/" + name, Reason: name}
	out = append(out, e)
	e = ev(audit.KindMount, audit.VerdictDenied)
	e.Mount = &audit.MountDetail{Op: "mount", Source: name, Target: "/mnt/" + name}
	out = append(out, e)
	e = ev(audit.KindPtrace, audit.VerdictDenied)
	e.Target = &audit.TargetDetail{PID: 8, Comm: name}
	out = append(out, e)
	e = ev(audit.KindAgent, audit.VerdictRecorded)
	e.Message = "message " + name
	out = append(out, e)
	e = ev(audit.KindTool, audit.VerdictDenied)
	e.Tool = &audit.ToolDetail{CallID: "id-" + name, Session: "s-" + name, Seq: 1, Tool: "t-" + name, Stage: "decision",
		Decision: "deny", By: name, Reason: name, Arguments: `{"cmd":"` + name + `"}`, Result: name}
	out = append(out, e)
	return out
}

func TestTailEscapesSandboxNames(t *testing.T) {
	var cases []outputCase
	for i, e := range hostileEvents("x") {
		for _, color := range []bool{false, true} {
			name := string(e.Kind)
			if color {
				name += "/color"
			}
			cases = append(cases, outputCase{name, func(n string) string {
				line := compactLine(&hostileEvents(n)[i], color)
				// The colors are ours: take them off, the rest must be
				// free of escapes.
				for _, c := range []string{"\x1b[31m", "\x1b[35m", "\x1b[33m", "\x1b[0m"} {
					line = strings.ReplaceAll(line, c, "")
				}
				return line + "\n"
			}})
		}
	}
	testOutputs(t, cases)
}

func TestLedgerCatEscapesSandboxNames(t *testing.T) {
	var cases []outputCase
	for i, e := range hostileEvents("x") {
		cases = append(cases, outputCase{string(e.Kind), func(n string) string {
			return recordText(&ledger.Record{Seq: 3, Event: hostileEvents(n)[i]}) + "\n"
		}})
	}
	testOutputs(t, cases)
}

// TestLedgerOutputsEndToEnd reads a ledger of hostile events with ledger
// cat, replay and tail --ledger: one line per record, escaped; --json keeps
// the records as stored.
func TestLedgerOutputsEndToEnd(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ledger")
	l, err := ledger.Open(dir, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	events := append(hostileEvents(evil), hostileEvents(benign)...)
	for _, e := range events {
		if _, _, err := l.Append(e); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	jsonOut, _, code := ledgerCLI(t, "ledger", "cat", "--json", dir)
	if code != 0 {
		t.Fatalf("cat --json: exit %d", code)
	}
	records := strings.Count(jsonOut, "\n")
	comms := 0
	for _, ln := range strings.Split(strings.TrimSpace(jsonOut), "\n") {
		rec, err := ledger.DecodeRecord([]byte(ln))
		if err != nil {
			t.Fatal(err)
		}
		if rec.Event.Process.Comm == evilJSON {
			comms++
		}
	}
	if comms != len(events)/2 {
		t.Errorf("--json: %d records keep the exact hostile name, want %d", comms, len(events)/2)
	}
	for _, args := range [][]string{
		{"ledger", "cat", dir},
		{"replay", dir},
		{"tail", "--ledger", dir, "--no-color"},
		{"tail", "--ledger", dir},
	} {
		out, errOut, code := ledgerCLI(t, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errOut)
		}
		what := strings.Join(args[:2], " ")
		if args[0] != "tail" {
			if n := strings.Count(out, "\n"); n != records {
				t.Errorf("%s: %d lines for %d records:\n%s", what, n, records, out)
			}
		} else {
			// tail shows the events (not the ledger's own records), in
			// color: take our colors off first.
			for _, c := range []string{"\x1b[31m", "\x1b[35m", "\x1b[33m", "\x1b[0m"} {
				out = strings.ReplaceAll(out, c, "")
			}
			if n := strings.Count(out, "\n"); n < len(events) || n > records {
				t.Errorf("%s: %d lines for %d events:\n%s", what, n, len(events), out)
			}
		}
		checkShown(t, what, out, strings.TrimSuffix(evilShown, `\xffbad`))
		checkShown(t, what, out, benign)
	}
}

func TestApprovalsEscapesSandboxNames(t *testing.T) {
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	testOutputs(t, []outputCase{{"approvals", func(n string) string {
		var b bytes.Buffer
		printApprovals(&b, []gateway.Pending{
			{ID: "agents/" + n, Sandbox: "agents", Session: n, CallID: n, Tool: n, Arguments: `{"path":"` + n + `"}`, Rule: "ask-" + n,
				Since: now.Add(-time.Minute), Deadline: now.Add(time.Minute)},
			{ID: "agents/plain", Sandbox: "agents", Session: "s", CallID: "plain", Tool: "read_file", Arguments: "{}", Rule: "ask",
				Since: now, Deadline: now.Add(time.Minute)},
		}, now)
		return b.String()
	}}})
}

func hostileStatus(n string) *control.Status {
	at := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	return &control.Status{PID: 1, Started: at,
		Kernel: control.KernelStatus{Release: "6.8", Cgroup2: "/sys/fs/cgroup", BPFFS: "/sys/fs/bpf", BPFLSM: true},
		Layers: []control.Layer{{Rule: "files", Mechanism: "lsm", Note: "note " + n}},
		Losses: map[string]uint64{"ringbuf_" + n: 1},
		Ledger: control.LedgerStatus{Dir: "/var/lib/watcher/ledger"},
		Sandboxes: []control.SandboxStatus{
			{Name: "agents", Path: "/sys/fs/cgroup/agents/" + n, Mode: "enforce", Events: map[string]uint64{"denied": 1},
				Usage:  &control.ResourceUsage{Mechanism: "cgroup2"},
				Canary: &control.CanaryReport{Time: at, Skipped: "frozen " + n},
				Posture: &audit.Posture{Cgroup: "agents/" + n, Procs: 1, Seccomp: "filter",
					Workspace: []audit.MountPosture{{Path: "/work/" + n}}, Missing: []string{"seccomp " + n}}},
			{Name: "plain", Path: "/sys/fs/cgroup/plain", Mode: "record",
				Canary: &control.CanaryReport{Time: at, Failures: 1, Results: []control.CanaryResult{{Check: "mount", Path: n}}}},
		},
	}
}

func TestStatusEscapesSandboxNames(t *testing.T) {
	testOutputs(t, []outputCase{
		{"status", func(n string) string {
			var b bytes.Buffer
			printStatus(&b, hostileStatus(n))
			return b.String()
		}},
		{"status --posture", func(n string) string {
			var b bytes.Buffer
			lacking := printPosture(&b, hostileStatus(n))
			// runStatus's error, as main prints it.
			return b.String() + errorText(fmt.Errorf("sandbox cgroups lack required hardening: %s", strings.Join(lacking, "; "))) + "\n"
		}},
		{"status canary error", func(n string) string {
			return errorText(fmt.Errorf("canary failed (watcher check shows the table): %s", strings.Join(canaryFailures(hostileStatus(n)), "; "))) + "\n"
		}},
	})
}

func TestCheckEscapesSandboxNames(t *testing.T) {
	testOutputs(t, []outputCase{{"check", func(n string) string {
		var b bytes.Buffer
		printCanary(&b, []control.CanaryReport{
			{Sandbox: "agents", Results: []control.CanaryResult{
				{Check: "file_read_blocked", Path: "runtime", Target: "/etc/" + n, Expected: "denied", Got: "allowed " + n, Layer: "lsm", Event: "no", Detail: "read " + n},
				{Check: "dns", Path: "exec", Target: n + ".example", Expected: "denied", Got: "denied", Layer: "dnsproxy", Event: "yes", OK: true},
			}, Failures: 1, Frozen: []string{"/sys/fs/cgroup/agents/" + n}},
			{Sandbox: "plain", Skipped: "frozen " + n},
		})
		return b.String()
	}}})
}

func TestWorkspaceDiffEscapesSandboxNames(t *testing.T) {
	testOutputs(t, []outputCase{{"workspace diff", func(n string) string {
		var b bytes.Buffer
		printChanges(&b, []workspace.Change{
			{Kind: workspace.Added, Path: "/work/" + n, Size: 3},
			{Kind: workspace.Deleted, Path: "/work/" + n + "-dir", Dir: true},
			{Kind: workspace.Changed, Path: "/work/plain", Size: 1},
		})
		return b.String()
	}}})
}
