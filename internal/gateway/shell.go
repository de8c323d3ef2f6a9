package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/watcherhq/watcher/pkg/toolproto"
	"golang.org/x/sys/unix"
)

// execReport is the part of watcher exec's --report the gateway reads.
type execReport struct {
	Outcome  string              `json:"outcome"`
	ExitCode int                 `json:"exit_code"`
	Signal   string              `json:"signal"`
	Killed   bool                `json:"killed_by_backstop"`
	Refusals []toolproto.Refusal `json:"refusals"`
}

// shellSummary is the shell call's result in one line.
func shellSummary(r *toolproto.ShellResult) string {
	s := fmt.Sprintf("outcome=%s exit=%d stdout=%dB stderr=%dB", r.Outcome, r.ExitCode, r.StdoutBytes, r.StderrBytes)
	if r.Signal != "" {
		s += " signal=" + r.Signal
	}
	if r.RefusalSummary != "" {
		s += "; " + r.RefusalSummary
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
func (g *sandboxGateway) shell(ctx context.Context, cl *call, p shellParams) (any, *toolproto.Error) {
	cfg := g.m.cfg
	if cfg.ExecPath == "" {
		return nil, rpcErr(toolproto.CodeToolFailed, toolproto.TypeToolFailed, "shell is not available: the gateway has no watcher binary to run commands with")
	}
	sb := cl.sb
	tmp, err := os.MkdirTemp("", "watcher-shell-")
	if err != nil {
		return nil, rpcErr(toolproto.CodeToolFailed, toolproto.TypeToolFailed, "report dir: %v", err)
	}
	defer os.RemoveAll(tmp)
	reportPath := filepath.Join(tmp, "report.json")
	args := []string{"exec", "-q", "--sandbox", sb.Name, "--label", cl.act.CallID, "--report", reportPath}
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
	// A caller that is not root gets its own uid and gid for the command
	// (no supplementary groups): the gateway must not lend it root.
	if cl.cred == nil {
		return nil, rpcErr(toolproto.CodeToolFailed, toolproto.TypeToolFailed, "the caller's credentials are unknown: shell refused")
	}
	if cl.cred.Uid != 0 {
		if _, err := exec.LookPath("setpriv"); err != nil {
			return nil, rpcErr(toolproto.CodeToolFailed, toolproto.TypeToolFailed, "shell for a non-root caller needs setpriv (util-linux) to drop to its uid: %v", err)
		}
		args = append(args, "--as-user", strconv.Itoa(int(cl.cred.Uid))+":"+strconv.Itoa(int(cl.cred.Gid)))
	}
	args = append(args, "--")
	args = append(args, "/bin/sh", "-c", p.Command)
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
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, rpcErr(toolproto.CodeToolFailed, toolproto.TypeToolFailed, "start watcher exec: %v", err)
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
	err = cmd.Wait()
	close(done)
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		return nil, rpcErr(toolproto.CodeToolFailed, toolproto.TypeToolFailed, "watcher exec: %v", err)
	}
	res := &toolproto.ShellResult{Stdout: stdout.String(), StdoutBytes: stdout.total, StdoutTruncated: stdout.cut,
		Stderr: stderr.String(), StderrBytes: stderr.total, StderrTruncated: stderr.cut,
		DurationMS: time.Since(start).Milliseconds(), Refusals: []toolproto.Refusal{}}
	var rep execReport
	data, rerr := os.ReadFile(reportPath)
	if rerr == nil {
		rerr = json.Unmarshal(data, &rep)
	}
	if rerr != nil {
		// No report: watcher exec stopped before running anything.
		return nil, rpcErr(toolproto.CodeToolFailed, toolproto.TypeToolFailed, "the command did not run: %s", strings.TrimSpace(lastLine(stderr.String())))
	}
	res.Outcome, res.ExitCode, res.Signal, res.KilledByBackstop = rep.Outcome, rep.ExitCode, rep.Signal, rep.Killed
	if len(rep.Refusals) > 0 {
		res.Refusals = rep.Refusals
	}
	res.RefusalSummary = refusalSummary(res.Refusals)
	if res.Outcome == "refused" || res.Outcome == "failed" {
		// Nothing ran: say why, as a typed error the agent can act on.
		return nil, rpcErr(toolproto.CodeToolFailed, toolproto.TypeToolFailed, "the command did not run (%s): %s", res.Outcome, strings.TrimSpace(lastLine(stderr.String())))
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

func refusalSummary(rs []toolproto.Refusal) string {
	if len(rs) == 0 {
		return ""
	}
	var parts []string
	for i, r := range rs {
		if i == 5 {
			parts = append(parts, fmt.Sprintf("and %d more", len(rs)-5))
			break
		}
		what := r.Path
		if what == "" {
			what = r.Address
		}
		s := fmt.Sprintf("%s %s %s", r.Result, r.Operation, what)
		if r.Rule != "" {
			s += " (rule " + r.Rule + ", by " + r.Layer + ")"
		} else {
			s += " (by " + r.Layer + ")"
		}
		if r.Count > 1 {
			s += fmt.Sprintf(" x%d", r.Count)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "; ")
}

func errnoName(e unix.Errno) string {
	if n := unix.ErrnoName(e); n != "" {
		return n
	}
	return e.Error()
}
