package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/audit"
)

// ShellResult is what a shell call returns.
type ShellResult struct {
	// Outcome is watcher exec's: exited, signaled, timeout-term,
	// timeout-kill, refused (breaker open), failed (nothing ran), canceled.
	Outcome  string `json:"outcome"`
	ExitCode int    `json:"exit_code"`
	Signal   string `json:"signal,omitempty"`
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
	// StdoutBytes and StderrBytes are the full sizes; the text is cut at
	// the sandbox's max_output_bytes.
	StdoutBytes     int64 `json:"stdout_bytes"`
	StderrBytes     int64 `json:"stderr_bytes"`
	StdoutTruncated bool  `json:"stdout_truncated,omitempty"`
	StderrTruncated bool  `json:"stderr_truncated,omitempty"`
	// Refusals are the kernel's refusals (and kills) of the command's
	// processes, from the events labelled with the call id.
	Refusals []Refusal `json:"refusals"`
	// RefusalSummary says in one line what was refused and why.
	RefusalSummary string `json:"refusal_summary,omitempty"`
	// Events counts every kernel event seen with the call's label.
	Events     int    `json:"events"`
	Verdict    string `json:"verdict"`
	DurationMS int64  `json:"duration_ms"`
}

// Refusal is one refused operation of a shell call.
type Refusal struct {
	Kind      string `json:"kind"`
	Verdict   string `json:"verdict"`
	What      string `json:"what"`
	Rule      string `json:"rule,omitempty"`
	Mechanism string `json:"mechanism,omitempty"`
	Comm      string `json:"comm,omitempty"`
	PID       uint32 `json:"pid,omitempty"`
}

func (r *ShellResult) summary() string {
	s := fmt.Sprintf("outcome=%s exit=%d stdout=%dB stderr=%dB events=%d refusals=%d", r.Outcome, r.ExitCode, r.StdoutBytes, r.StderrBytes, r.Events, len(r.Refusals))
	if r.Signal != "" {
		s += " signal=" + r.Signal
	}
	return s
}

// shellEnv is the environment of shell calls: nothing of the agent's.
func shellEnv(home, callID string) []string {
	return []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + home,
		"LANG=C.UTF-8", "WATCHER_CALL_ID=" + callID}
}

// shell runs the command through `watcher exec` (the sandbox's leaf
// cgroup, seccomp and Landlock, graded timeouts, the breaker) with the call
// id as label, so every kernel event of the command carries it.
func (g *sandboxGateway) shell(ctx context.Context, cl *call, p shellParams) (any, *Error) {
	cfg := g.m.cfg
	if cfg.ExecPath == "" {
		return nil, rpcErr(CodeToolFailed, TypeToolFailed, "shell is not available: the gateway has no watcher binary to run commands with")
	}
	sb := cl.sb
	args := []string{"exec", "--sandbox", sb.Name, "--label", cl.act.CallID}
	if cfg.ControlSocket != "" {
		args = append(args, "--socket", cfg.ControlSocket)
	}
	limit := sb.Tools.ShellTimeout.Duration
	if p.TimeoutSeconds > 0 {
		if req := time.Duration(p.TimeoutSeconds * float64(time.Second)); limit == 0 || req < limit {
			limit = req
		}
	}
	if limit > 0 {
		// SIGTERM at the limit, the cgroup killed shortly after.
		grace := min(max(limit/10, time.Second), 10*time.Second)
		args = append(args, "--warn", "0", "--term", limit.String(), "--kill", (limit + grace).String())
	}
	args = append(args, "--", "/bin/sh", "-c", p.Command)
	dir := "/"
	if len(sb.Workspace) > 0 {
		dir = sb.Workspace[0]
	}
	cmd := exec.Command(cfg.ExecPath, args...)
	cmd.Dir = dir
	cmd.Env = shellEnv(dir, cl.act.CallID)
	max := sb.Tools.MaxOutputBytes
	stdout, stderr := &capWriter{max: max}, &capWriter{max: max, tail: true}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	col := g.m.watch.begin(cl.act.CallID)
	defer g.m.watch.end(cl.act.CallID)
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, rpcErr(CodeToolFailed, TypeToolFailed, "start watcher exec: %v", err)
	}
	// The caller leaving (or the gateway stopping) ends the command the
	// way watcher exec ends it on SIGTERM: the whole cgroup is killed.
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			cmd.Process.Signal(syscall.SIGTERM)
		case <-done:
		}
	}()
	err := cmd.Wait()
	close(done)
	res := &ShellResult{Stdout: stdout.String(), StdoutBytes: stdout.total, StdoutTruncated: stdout.cut,
		StderrBytes: stderr.total, DurationMS: time.Since(start).Milliseconds()}
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		return nil, rpcErr(CodeToolFailed, TypeToolFailed, "watcher exec: %v", err)
	}
	// watcher exec's last stderr line is its verdict.
	errText, verdict := splitVerdict(stderr, cl.act.CallID)
	res.Stderr, res.Verdict = errText, verdict
	if !stderr.cut {
		res.StderrBytes = int64(len(errText))
	}
	res.StderrTruncated = stderr.cut
	res.Outcome = verdictWord(verdict)
	res.ExitCode = code
	if strings.Contains(verdict, " signal=") {
		f := verdictField(verdict, "signal")
		res.Signal, res.ExitCode = f, code
	}
	if res.Outcome == "" {
		res.Outcome = "failed"
	}
	res.Events, res.Refusals = col.settle()
	res.RefusalSummary = refusalSummary(res.Refusals)
	if res.Outcome == "refused" || res.Outcome == "failed" {
		// Nothing ran: say why, as a typed error the agent can act on.
		msg := strings.TrimSpace(lastLine(res.Stderr))
		if msg == "" {
			msg = verdict
		}
		return nil, rpcErr(CodeToolFailed, TypeToolFailed, "the command did not run (%s): %s", res.Outcome, msg)
	}
	return res, nil
}

func lastLine(s string) string {
	s = strings.TrimRight(s, "\n")
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// splitVerdict finds watcher exec's verdict line (the last with this
// call's label; after it only exec's own exit message may follow) and
// returns the command's stderr without exec's lines.
func splitVerdict(w *capWriter, callID string) (string, string) {
	lines := strings.Split(strings.TrimRight(string(w.tailBytes()), "\n"), "\n")
	mark := " label=" + callID + " "
	for i := len(lines) - 1; i >= 0 && i >= len(lines)-3; i-- {
		l := lines[i]
		if !strings.HasPrefix(l, "watcher: ") || !strings.Contains(l, mark) {
			continue
		}
		text := w.String()
		if !w.cut {
			if j := strings.LastIndex(text, l); j >= 0 {
				text = text[:j]
			}
		}
		return text, l
	}
	return w.String(), ""
}

func verdictWord(v string) string {
	f := strings.Fields(v)
	if len(f) < 2 {
		return ""
	}
	return f[1]
}

func verdictField(v, key string) string {
	for _, f := range strings.Fields(v) {
		if val, ok := strings.CutPrefix(f, key+"="); ok {
			return val
		}
	}
	return ""
}

// capWriter keeps the first max bytes (and, with tail, the last 4 KiB, so
// the verdict line is found however long the output).
type capWriter struct {
	max   int
	buf   bytes.Buffer
	total int64
	cut   bool
	tail  bool
	last  []byte
}

func (w *capWriter) Write(p []byte) (int, error) {
	w.total += int64(len(p))
	if room := w.max - w.buf.Len(); room > 0 {
		w.buf.Write(p[:min(room, len(p))])
	}
	if w.buf.Len() >= w.max && w.total > int64(w.max) {
		w.cut = true
	}
	if w.tail {
		w.last = append(w.last, p...)
		if len(w.last) > 4096 {
			w.last = append([]byte(nil), w.last[len(w.last)-4096:]...)
		}
	}
	return len(p), nil
}

func (w *capWriter) String() string { return w.buf.String() }

func (w *capWriter) tailBytes() []byte {
	if w.tail {
		return w.last
	}
	return w.buf.Bytes()
}

// labelWatch gathers the kernel events of running shell calls by label.
type labelWatch struct {
	mu sync.Mutex
	m  map[string]*collector
}

func newLabelWatch() *labelWatch { return &labelWatch{m: map[string]*collector{}} }

type collector struct {
	mu       sync.Mutex
	events   int
	refusals []Refusal
	last     time.Time
}

// maxRefusals caps the refusals returned per call (all are in the ledger).
const maxRefusals = 50

func (w *labelWatch) begin(label string) *collector {
	c := &collector{last: time.Now()}
	w.mu.Lock()
	w.m[label] = c
	w.mu.Unlock()
	return c
}

func (w *labelWatch) end(label string) {
	w.mu.Lock()
	delete(w.m, label)
	w.mu.Unlock()
}

func (w *labelWatch) observe(label string, e *audit.Event) {
	w.mu.Lock()
	c := w.m[label]
	w.mu.Unlock()
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.events++
	c.last = time.Now()
	if (e.Verdict == audit.VerdictDenied || e.Verdict == audit.VerdictKilled) && len(c.refusals) < maxRefusals {
		c.refusals = append(c.refusals, Refusal{Kind: string(e.Kind), Verdict: string(e.Verdict), What: eventWhat(e),
			Rule: e.Rule, Mechanism: e.Mechanism, Comm: e.Process.Comm, PID: e.Process.TGID})
	}
}

// settle waits until the command's events stopped arriving (the agent
// reads the kernel's rings every 50 ms): 250 ms without one, at most 2 s.
func (c *collector) settle() (int, []Refusal) {
	deadline := time.Now().Add(2 * time.Second)
	for {
		c.mu.Lock()
		quiet := time.Since(c.last) > 250*time.Millisecond
		c.mu.Unlock()
		if quiet || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.events, append([]Refusal{}, c.refusals...)
}

func refusalSummary(rs []Refusal) string {
	if len(rs) == 0 {
		return ""
	}
	var parts []string
	for i, r := range rs {
		if i == 5 {
			parts = append(parts, fmt.Sprintf("and %d more", len(rs)-5))
			break
		}
		s := fmt.Sprintf("%s %s %s", r.Verdict, r.Kind, r.What)
		if r.Rule != "" {
			s += " (rule " + r.Rule + ", by " + r.Mechanism + ")"
		}
		parts = append(parts, s)
	}
	return "the kernel refused: " + strings.Join(parts, "; ")
}

// eventWhat names the object of a kernel event.
func eventWhat(e *audit.Event) string {
	switch {
	case e.File != nil:
		return e.File.Path
	case e.Net != nil:
		return fmt.Sprintf("%s %s:%d", e.Net.Op, e.Net.Addr, e.Net.Port)
	case e.DNS != nil:
		return e.DNS.Name
	case e.Mount != nil:
		return e.Mount.Op + " " + e.Mount.Target
	case e.Syscall != nil:
		if e.Syscall.Name != "" {
			return e.Syscall.Name
		}
		return "syscall " + strconv.FormatInt(e.Syscall.Nr, 10)
	case e.Target != nil:
		return "pid " + strconv.Itoa(int(e.Target.PID))
	}
	return e.Message
}

func errnoName(e unix.Errno) string {
	if n := unix.ErrnoName(e); n != "" {
		return n
	}
	return e.Error()
}
