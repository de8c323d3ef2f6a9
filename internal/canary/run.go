package canary

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/control"
	"github.com/watcherhq/watcher/internal/launch"
	"github.com/watcherhq/watcher/internal/ledger"
	"github.com/watcherhq/watcher/internal/policy"
)

// LeafPrefix starts the names of the runtime-placed probes' leaf cgroups
// (the exec path's are watcher exec leaves, exec-canary-CHECK-...).
const LeafPrefix = "canary-"

// Target is one sandbox to test.
type Target struct {
	Policy  *policy.Policy
	Sandbox *policy.Sandbox
	// Layers is the layer table in force (which mechanism enforces each
	// rule on this host).
	Layers []control.Layer
	// Parent is the sandbox cgroup (absolute) the runtime-path leaves are
	// created below.
	Parent string
	// ExecParent is the cgroup watcher exec creates its leaves below, and
	// Restrictions the launcher applies; Exec runs the exec path too.
	ExecParent   string
	Restrictions launch.Restrictions
	Exec         bool
	// Reason says what started the run (start, reload, interval, check).
	Reason string
	// Checks, when set, limits the run to the checks of these names (the
	// agent runs every check the plan has).
	Checks []string
}

// Runner runs canaries. Its zero value is not usable: LedgerDir is
// required.
type Runner struct {
	// Executable is the binary the probes re-execute (it must call Init
	// and launch.Init first thing); empty means os.Executable().
	Executable string
	// LedgerDir is where the matching events must arrive.
	LedgerDir string
	// From returns the ledger sequence number to search from (the
	// head before the probes ran); nil searches the whole ledger.
	From func() uint64
	// Mark is called with each probe's leaf cgroup id before the probe
	// acts, and with each DNS name a probe queries, so the agent marks
	// their events as the canary's (never an attack, never scored).
	Mark func(cgroupID uint64, dnsName, check string)
	// Fixture, when set, is called with each path the run is about to
	// create (honeytokens, their directories, files probes write), so the
	// agent's inode watch does not rewrite the file rules for its own
	// fixtures: a rewrite would repair a broken rule table before the
	// probes could find it broken.
	Fixture func(path string)
	// Admit lets sandbox reach addr as if the DNS proxy had answered it
	// (the fronting check's address). Nil: the fronting check is skipped.
	Admit func(sandbox string, addr netip.Addr) error
	// EventWait bounds the wait for the events of a run (default 15s; a
	// run ends as soon as every event is in, so only a missing event
	// waits that long).
	EventWait time.Duration
	// ProbeTimeout bounds one probe (default 15s).
	ProbeTimeout time.Duration
	// PrepareExec, when set, is called before each probe through watcher
	// exec, as `watcher exec` calls the agent before each command: the
	// agent records seccomp and Landlock refusals only for a while after
	// that call, and a run slowed down by a loaded host outlasted one
	// call at its start (the exec probes' refusals went unrecorded).
	PrepareExec func() error
}

// pending is a probe that ran and whose event is awaited.
type pending struct {
	res     *control.CanaryResult
	check   Check
	leaf    uint64
	dnsName string
	mech    string // of the event that matched
	seq     uint64 // of the event that matched
	// beforeProxy says a DNS probe's query failed with an errno: it
	// never reached the DNS proxy, so no DNS event will come. refusal
	// describes the kernel's event of the refusal from the probe's leaf,
	// once found (none when nothing refused it: no proxy listening).
	beforeProxy bool
	refusal     string
	refusalMech string
	// otherReason says the DNS proxy refused the probe's query for
	// another reason than the policy's (Check.Reason).
	otherReason bool
}

// Run tests one sandbox and returns the report. An error means the run
// could not be set up (no leaf, no scratch directory); check failures are
// in the report.
func (r *Runner) Run(ctx context.Context, t Target) (control.CanaryReport, error) {
	rep := control.CanaryReport{Sandbox: t.Sandbox.Name, Time: time.Now(), Reason: t.Reason}
	self := r.Executable
	if self == "" {
		var err error
		if self, err = os.Executable(); err != nil {
			return rep, fmt.Errorf("canary: find own binary: %w", err)
		}
	}
	var from uint64
	if r.From != nil {
		from = r.From()
	}
	scratch, err := os.MkdirTemp("", scratchPrefix())
	if err != nil {
		return rep, fmt.Errorf("canary: %w", err)
	}
	defer os.RemoveAll(scratch)
	suffix := randomHex(6)
	checks := Plan(t.Policy, t.Sandbox, t.Layers, scratch, suffix)
	if len(t.Checks) > 0 {
		checks = slices.DeleteFunc(checks, func(c Check) bool { return !slices.Contains(t.Checks, c.Name) })
	}
	checks = slices.DeleteFunc(checks, func(c Check) bool {
		if c.Op != opFronted {
			return false
		}
		if r.Admit == nil {
			return true
		}
		// An admission that fails leaves the probe to fail: the report
		// says so rather than skipping the check.
		r.Admit(t.Sandbox.Name, netip.MustParseAddrPort(c.Target).Addr())
		return false
	})
	fx, err := prepare(self, checks, scratch, r.Fixture)
	defer fx.cleanup()
	if err != nil {
		return rep, err
	}

	paths := []string{PathRuntime}
	if t.Exec && t.Sandbox.Mode != policy.ModeRecord {
		paths = append(paths, PathExec)
	}
	rep.Results = make([]control.CanaryResult, 0, len(paths)*len(checks))
	var waits, probes []*pending
	for _, path := range paths {
		for _, c := range checks {
			if ctx.Err() != nil {
				return rep, ctx.Err()
			}
			c = fx.fill(c, path)
			// Capacity is reserved: p.res stays valid.
			rep.Results = append(rep.Results, control.CanaryResult{Check: c.Name, Path: path, Target: c.Target,
				Expected: c.Expected(path), Layer: c.Mechanism, Event: "-"})
			p := &pending{res: &rep.Results[len(rep.Results)-1], check: c}
			if c.Op == opDNS {
				p.dnsName = strings.ToLower(c.Target)
				r.mark(0, p.dnsName, c.Name)
			}
			p.res.Got, p.res.Detail, p.leaf = r.probe(ctx, self, t, c, path)
			fx.afterProbe(c)
			p.otherReason = c.Reason != "" && p.res.Got == Denied && !strings.HasSuffix(p.res.Detail, " "+c.Reason)
			// A DNS check's refusal is the proxy's answer (NXDOMAIN with
			// its RFC 8914 reason). An errno means the query never reached
			// the proxy: the redirect to it is what failed, whatever the
			// errno, and the run says which kernel layer refused.
			p.beforeProxy = c.Op == opDNS && errnoOf(p.res.Got) != ""
			probes = append(probes, p)
			if c.NeedsEvent() || p.beforeProxy {
				if c.NeedsEvent() {
					p.res.Event = "no"
				}
				waits = append(waits, p)
			}
		}
	}
	r.awaitEvents(ctx, t.Sandbox.Name, from, waits)
	for _, p := range probes {
		res := p.res
		res.OK = outcomeOf(res.Got) == res.Expected && res.Event != "no" && !p.beforeProxy && !p.otherReason
		if p.otherReason {
			res.Detail += "; the proxy refused it, but not as " + strconv.Quote(p.check.Reason) + ": the check proves nothing"
		}
		if p.beforeProxy {
			res.Detail = p.beforeProxyDetail()
			if p.refusalMech != "" {
				res.Layer = p.refusalMech
			}
		}
		if !res.OK {
			rep.Failures++
		}
	}
	return rep, nil
}

// errnoOf returns the errno of a probe outcome ("denied (EPERM)" gives
// "EPERM"), "" when it has none.
func errnoOf(got string) string {
	_, rest, ok := strings.Cut(got, " (")
	if !ok {
		return ""
	}
	return strings.TrimSuffix(rest, ")")
}

// beforeProxyDetail says that a DNS probe's query failed before the DNS
// proxy saw it, and what refused it when its event was found.
func (p *pending) beforeProxyDetail() string {
	msg := "the query failed with " + errnoOf(p.res.Got) + " (" + p.res.Detail + ") before the DNS proxy saw it"
	if p.refusal != "" {
		return msg + ": refused by " + p.refusal
	}
	return msg + " (no refusal event from the probe's cgroup)"
}

func (r *Runner) mark(id uint64, name, check string) {
	if r.Mark != nil {
		r.Mark(id, name, check)
	}
}

// outcomeOf turns "denied (EPERM)" into "denied".
func outcomeOf(got string) string {
	s, _, _ := strings.Cut(got, " ")
	return s
}

// probe runs one check on one path and returns what happened, a detail,
// and the leaf cgroup's id.
func (r *Runner) probe(ctx context.Context, self string, t Target, c Check, path string) (got, detail string, leafID uint64) {
	timeout := r.ProbeTimeout
	if timeout <= 0 {
		timeout = 15 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	env := []string{envProbe + "=" + encodeSpec(probeSpec{Op: c.Op, Target: c.Target, PID: c.pid()}), "PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	var out, errOut bytes.Buffer
	var killed bool
	var exitErr error
	if path == PathExec {
		if r.PrepareExec != nil {
			if err := r.PrepareExec(); err != nil {
				return "error", "prepare watcher exec: " + err.Error(), 0
			}
		}
		hook := &markHook{mark: func(id uint64) { leafID = id; r.mark(id, "", c.Name) }}
		v, err := launch.Run(ctx, launch.Config{Path: self, Env: env, Stdout: &out, Stderr: &errOut,
			Sandbox: t.Sandbox.Name, CgroupParent: t.ExecParent, Label: "canary-" + c.Name,
			Restrictions: t.Restrictions, Timeouts: launch.Timeouts{Kill: timeout}, Executable: self,
			InProcess: true, Leaf: hook})
		if err != nil {
			return "error", "watcher exec: " + err.Error(), leafID
		}
		killed = v.Signal == syscall.SIGKILL && !v.Killed
		if v.Killed {
			return "error", "timed out after " + timeout.String(), leafID
		}
		if v.ExitCode != 0 && !killed {
			exitErr = fmt.Errorf("exit %d (%s)", v.ExitCode, v.Outcome)
		}
	} else {
		leaf := filepath.Join(t.Parent, LeafPrefix+c.Name+"-"+randomHex(4))
		if err := os.Mkdir(leaf, 0o755); err != nil {
			return "error", "create leaf cgroup: " + err.Error(), 0
		}
		defer cgroupfs.Remove(leaf)
		leafID, _ = cgroupfs.ID(leaf)
		r.mark(leafID, "", c.Name)
		k, err := runPlaced(ctx, self, env, leaf, &out, &errOut)
		killed = k
		if err != nil && !killed {
			if ctx.Err() != nil {
				return "error", "timed out after " + timeout.String(), leafID
			}
			exitErr = err
		}
	}
	if killed {
		return Killed, "SIGKILL", leafID
	}
	var res probeResult
	if err := json.Unmarshal(bytes.TrimSpace(out.Bytes()), &res); err != nil || res.Result == "" {
		msg := strings.TrimSpace(errOut.String())
		if exitErr != nil {
			msg = exitErr.Error() + ": " + msg
		}
		return "error", "no result from the probe: " + msg, leafID
	}
	switch res.Result {
	case Denied:
		if res.Errno != "" {
			return Denied + " (" + res.Errno + ")", res.Detail, leafID
		}
		return Denied, res.Detail, leafID
	case Allowed:
		return Allowed, res.Detail, leafID
	}
	if res.Errno != "" {
		return "error (" + res.Errno + ")", res.Detail, leafID
	}
	return "error", res.Detail, leafID
}

// runPlaced starts the probe outside the sandbox, writes its pid into the
// leaf's cgroup.procs (as runc does), lets it act and waits.
func runPlaced(ctx context.Context, self string, env []string, leaf string, stdout, stderr io.Writer) (killed bool, err error) {
	goR, goW, err := os.Pipe()
	if err != nil {
		return false, fmt.Errorf("canary: %w", err)
	}
	defer goW.Close()
	readyR, readyW, err := os.Pipe()
	if err != nil {
		goR.Close()
		return false, fmt.Errorf("canary: %w", err)
	}
	defer readyR.Close()
	cmd := exec.CommandContext(ctx, self)
	cmd.Args = []string{probeArg0}
	cmd.Env = append(env, envWait+"=1")
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.ExtraFiles = []*os.File{goR, readyW}
	cmd.WaitDelay = 2 * time.Second
	err = cmd.Start()
	goR.Close()
	readyW.Close()
	if err != nil {
		return false, fmt.Errorf("start probe: %w", err)
	}
	// The binary's package initialisers (cilium/ebpf calls bpf()) run
	// before the probe says it is ready: not inside the sandbox.
	var b [1]byte
	if n, _ := readyR.Read(b[:]); n != 1 {
		cmd.Process.Kill()
		cmd.Wait()
		return false, errors.New("the probe exited before it was ready")
	}
	if err := cgroupfs.MovePID(leaf, cmd.Process.Pid); err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return false, err
	}
	goW.Write([]byte{1})
	goW.Close()
	err = cmd.Wait()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL && ctx.Err() == nil {
		return true, nil
	}
	return false, err
}

// markHook marks the exec path's leaf once the probe is in it.
type markHook struct{ mark func(uint64) }

func (h *markHook) Enter(leaf string, _ int) error {
	id, err := cgroupfs.ID(leaf)
	if err != nil {
		return err
	}
	h.mark(id)
	return nil
}
func (h *markHook) Exit(string) {}

// awaitEvents reads the ledger from seq from until every pending probe's
// event is there or EventWait passed. Alerts are committed to the ledger
// at once; the wait covers the kernel reader's batching deadline.
func (r *Runner) awaitEvents(ctx context.Context, sandbox string, from uint64, waits []*pending) {
	if len(waits) == 0 {
		return
	}
	wait := r.EventWait
	if wait <= 0 {
		wait = 15 * time.Second
	}
	deadline := time.Now().Add(wait)
	for {
		left := scanLedger(r.LedgerDir, sandbox, from, waits)
		if left == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, p := range waits {
		if p.mech != "" {
			p.res.Event = "yes"
			p.res.Layer = p.mech
		}
	}
}

// done says the probe's wait is over: its event matched or, for a DNS
// query the kernel refused, the refusal's event was found (the DNS
// event cannot come: the proxy never saw the query).
func (p *pending) done() bool { return p.mech != "" || p.refusal != "" }

// scanLedger marks the pending probes whose event is in the ledger and
// returns how many are still missing.
func scanLedger(dir, sandbox string, from uint64, waits []*pending) int {
	rd, err := ledger.NewReaderFrom(dir, from)
	if err != nil {
		return len(waits)
	}
	defer rd.Close()
	for {
		rec, err := rd.Next()
		if err != nil {
			break
		}
		if rec.Seq < from {
			continue
		}
		ev := &rec.Event
		used := false
		for _, p := range waits {
			used = used || (p.mech != "" && p.seq == rec.Seq)
		}
		for _, p := range waits {
			if !used && p.mech == "" && !p.beforeProxy && matches(p, ev, sandbox) {
				// One event proves one probe.
				p.mech, p.seq, used = ev.Mechanism, rec.Seq, true
				if p.mech == "" {
					p.mech = string(ev.Kind)
				}
			}
			if p.beforeProxy && p.refusal == "" && refusalOf(p, ev) {
				p.refusalMech = ev.Mechanism
				p.refusal = describeRefusal(ev)
			}
		}
	}
	left := 0
	for _, p := range waits {
		if !p.done() {
			left++
		}
	}
	return left
}

// refusalOf says ev is the kernel's refusal of the DNS probe p's query:
// a socket, connect or send refused in p's leaf (by the cgroup or LSM
// socket hooks, or, under watcher exec, seccomp).
func refusalOf(p *pending, ev *audit.Event) bool {
	if p.leaf == 0 || ev.Process.CgroupID != p.leaf || (ev.Verdict != audit.VerdictDenied && ev.Verdict != audit.VerdictKilled) {
		return false
	}
	switch ev.Kind {
	case audit.KindNet, audit.KindSocket:
		return true
	case audit.KindSyscall:
		if sc := ev.Syscall; sc != nil {
			switch sc.Name {
			case "socket", "connect", "write", "sendto", "sendmsg":
				return true
			}
		}
	}
	return false
}

// describeRefusal names the layer and reason of a refusal event.
func describeRefusal(ev *audit.Event) string {
	var parts []string
	for _, s := range []string{ev.Mechanism, string(ev.Kind)} {
		if s != "" {
			parts = append(parts, s)
		}
	}
	what := strings.Join(parts, " ")
	if n := ev.Net; n != nil {
		what += " " + n.Op
		if n.Addr != "" {
			what += fmt.Sprintf(" to %s:%d", n.Addr, n.Port)
		}
		if n.Reason != "" {
			what += ": " + n.Reason
		}
	}
	if sc := ev.Syscall; sc != nil && ev.Net == nil {
		what += " " + sc.Name
	}
	if ev.Rule != "" {
		what += " (rule " + ev.Rule + ")"
	}
	return what
}

// matches says ev is the event of probe p: from its leaf cgroup (or, for
// DNS, about its name in its sandbox), with the verdict the policy asks.
func matches(p *pending, ev *audit.Event, sandbox string) bool {
	switch ev.Verdict {
	case audit.VerdictDenied, audit.VerdictKilled:
		if p.check.Recorded {
			return false
		}
	case audit.VerdictRecorded:
		if !p.check.Recorded {
			return false
		}
	default:
		return false
	}
	if p.dnsName != "" {
		return ev.Kind == audit.KindDNS && ev.DNS != nil && ev.Sandbox.Name == sandbox &&
			strings.TrimSuffix(strings.ToLower(ev.DNS.Name), ".") == p.dnsName &&
			(p.check.Reason == "" || ev.DNS.Reason == p.check.Reason)
	}
	return p.leaf != 0 && ev.Process.CgroupID == p.leaf
}

// fixtures are what the checks need besides the probe: honeytokens,
// files to read, a mount point, a listener nobody was given, a ptrace
// target outside the sandbox.
type fixtures struct {
	created  []string // files and directories to remove, deepest last
	listener net.Listener
	sleeper  *exec.Cmd
	sleepIn  io.Closer
	mounts   []string
	names    map[string]string // check name -> per-path DNS name base
	note     func(string)      // Runner.Fixture
}

func (fx *fixtures) noteFixture(path string) {
	if fx.note != nil {
		fx.note(path)
	}
}

func prepare(self string, checks []Check, scratch string, note func(string)) (*fixtures, error) {
	fx := &fixtures{names: map[string]string{}, note: note}
	for _, c := range checks {
		switch c.Fixture {
		case "honeytoken", "readable":
			body := "watcher canary honeytoken " + randomHex(8) + "\n"
			var err error
			// Another agent's canary on this host may remove the shared
			// directory it created between our check and our write.
			for try := 0; try < 5; try++ {
				if err = fx.mkdirs(filepath.Dir(c.Target)); err != nil {
					return fx, err
				}
				fx.noteFixture(c.Target)
				if err = os.WriteFile(c.Target, []byte(body), 0o600); !errors.Is(err, os.ErrNotExist) {
					break
				}
			}
			if err != nil {
				return fx, fmt.Errorf("canary: honeytoken: %w", err)
			}
			fx.created = append(fx.created, c.Target)
			sweepStale(filepath.Dir(c.Target))
		case "mountpoint":
			if err := os.MkdirAll(c.Target, 0o755); err != nil {
				return fx, fmt.Errorf("canary: mount point: %w", err)
			}
			fx.mounts = append(fx.mounts, c.Target)
		case "created":
			fx.noteFixture(c.Target)
			fx.created = append(fx.created, c.Target)
		}
		switch c.Op {
		case opConnect:
			if fx.listener == nil {
				ln, err := net.Listen("tcp4", "127.0.0.1:0")
				if err != nil {
					return fx, fmt.Errorf("canary: listener: %w", err)
				}
				fx.listener = ln
				go func() {
					for {
						conn, err := ln.Accept()
						if err != nil {
							return
						}
						conn.Close()
					}
				}()
			}
		case opPtrace:
			if fx.sleeper == nil {
				cmd := exec.Command(self)
				cmd.Args = []string{probeArg0}
				cmd.Env = []string{envProbe + "=" + encodeSpec(probeSpec{Op: opSleep})}
				in, err := cmd.StdinPipe()
				if err != nil {
					return fx, fmt.Errorf("canary: ptrace target: %w", err)
				}
				if err := cmd.Start(); err != nil {
					return fx, fmt.Errorf("canary: ptrace target: %w", err)
				}
				fx.sleeper, fx.sleepIn = cmd, in
			}
		}
	}
	return fx, nil
}

// mkdirs creates dir and its missing parents, remembering what it made.
func (fx *fixtures) mkdirs(dir string) error {
	var missing []string
	for d := dir; d != "/" && !isDir(d); d = filepath.Dir(d) {
		missing = append([]string{d}, missing...)
	}
	for _, d := range missing {
		fx.noteFixture(d)
		if err := os.Mkdir(d, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("canary: honeytoken directory: %w", err)
		}
		fx.created = append(fx.created, d)
	}
	return nil
}

// fill sets what the plan could not know: the listener's address, the
// ptrace target, a DNS name unique to the path.
func (fx *fixtures) fill(c Check, path string) Check {
	switch c.Op {
	case opConnect:
		if fx.listener != nil {
			c.Target = fx.listener.Addr().String()
		}
	case opPtrace:
		if fx.sleeper != nil {
			c.Target = "pid " + strconv.Itoa(fx.sleeper.Process.Pid)
		}
	case opDNS:
		if c.uniqueName {
			// One name per path, so each query's event is its own.
			head, rest, _ := strings.Cut(c.Target, ".")
			c.Target = head + path[:1] + "." + rest
		}
	}
	return c
}

// pid is the ptrace target's pid from the filled Target.
func (c Check) pid() int {
	n, _ := strconv.Atoi(strings.TrimPrefix(c.Target, "pid "))
	return n
}

// afterProbe removes a file the probe may have created. A mount the
// backstop killed it for is the agent's to undo (and record); cleanup
// unmounts what is left at the end of the run.
func (fx *fixtures) afterProbe(c Check) {
	switch c.Fixture {
	case "created":
		os.Remove(c.Target)
	}
}

func (fx *fixtures) cleanup() {
	if fx == nil {
		return
	}
	for _, m := range fx.mounts {
		for i := 0; i < 8 && unix.Unmount(m, unix.MNT_DETACH) == nil; i++ {
		}
	}
	for i := len(fx.created) - 1; i >= 0; i-- {
		os.Remove(fx.created[i])
	}
	if fx.listener != nil {
		fx.listener.Close()
	}
	if fx.sleeper != nil {
		fx.sleepIn.Close()
		fx.sleeper.Process.Kill()
		fx.sleeper.Wait()
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// staleAfter is the age after which a honeytoken is taken for one left by
// an agent killed during its run (a run takes seconds).
const staleAfter = 10 * time.Minute

// sweepStale removes honeytokens an agent killed mid-run left in dir.
func sweepStale(dir string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if !e.Type().IsRegular() || !strings.HasPrefix(e.Name(), honeytokenName) {
			continue
		}
		if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > staleAfter && info.Size() < 256 {
			os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}
