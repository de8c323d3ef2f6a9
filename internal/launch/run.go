package launch

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/cgroupfs"
)

// Timeouts grade what happens to a command that runs too long. A zero
// duration disables that step. Durations count from the start.
type Timeouts struct {
	// Warn calls OnWarn (the command keeps running).
	Warn time.Duration
	// Term sends SIGTERM to every process of the command's cgroup.
	Term time.Duration
	// Kill kills the whole cgroup (cgroup.kill): a hard timeout.
	Kill time.Duration
	// OnWarn is called once at Warn, from another goroutine.
	OnWarn func()
}

// Config describes one launch.
type Config struct {
	// Path is the program; a name without a slash is looked up in PATH.
	Path string
	// Args are the arguments after the program name.
	Args []string
	// Env is the command's environment; nil means the launcher's own.
	Env []string
	// Dir is the working directory; empty for the launcher's.
	Dir string
	// Stdin, Stdout and Stderr of the command; nil means /dev/null.
	Stdin          io.Reader
	Stdout, Stderr io.Writer

	// Sandbox names the sandbox (for the breaker and the verdict).
	Sandbox string
	// CgroupParent is the sandbox's cgroup (absolute, or relative to the
	// cgroup2 mount). The command runs in a fresh leaf below it, created
	// for this run and removed after it.
	CgroupParent string
	// Label identifies the caller's request (e.g. an agent tool-call id);
	// it names the leaf cgroup, so every event of the command can be
	// traced to it.
	Label string

	// Restrictions are applied in the child before exec.
	Restrictions Restrictions
	// Timeouts grade long runs.
	Timeouts Timeouts
	// Breaker, if set, refuses runs of a sandbox after repeated hard
	// timeouts and counts this run's outcome.
	Breaker *Breaker
	// Executable is the binary re-executed to apply the restrictions; it
	// must call Init first thing. Empty means os.Executable().
	Executable string
	// Isolation gives the command namespaces and mounts of its own (an
	// overlay workspace bound over the real one, a private IPC namespace).
	Isolation Isolation
	// Leaf, if set, is told when the command enters its leaf cgroup and
	// when it is done (resource limits on the leaf and in v1 hierarchies).
	Leaf LeafHook
	// InProcess runs the binary's SetInProcess function in the restricted
	// child, in the leaf, instead of exec'ing Path (which is then only
	// the name in the verdict): the canary's probes, whose own binary
	// must not run its package initialisers inside the sandbox.
	InProcess bool
}

// LeafHook follows a command's leaf cgroup.
type LeafHook interface {
	// Enter is called after the child moved into the leaf (absolute
	// cgroup2 path) and before it execs; an error stops the run.
	Enter(leaf string, pid int) error
	// Exit is called once the command and what it left are killed,
	// before the leaf is removed.
	Exit(leaf string)
}

// Outcome says how a run ended.
type Outcome string

// Outcomes.
const (
	OutcomeExited   Outcome = "exited"   // ended on its own (any exit code)
	OutcomeSignaled Outcome = "signaled" // died of a signal it did not get from the launcher
	OutcomeTermed   Outcome = "timeout-term"
	OutcomeKilled   Outcome = "timeout-kill" // a hard timeout
	OutcomeRefused  Outcome = "refused"      // the breaker is open: nothing ran
	OutcomeFailed   Outcome = "failed"       // restrictions or exec failed: the target never ran
	OutcomeCanceled Outcome = "canceled"     // the context ended; the cgroup was killed
)

// Verdict summarises a run.
type Verdict struct {
	Sandbox  string
	Label    string
	Cgroup   string // path of the leaf cgroup
	CgroupID uint64
	PID      int
	Command  string
	Outcome  Outcome
	// ExitCode is the command's exit status, or -1 when it died of a
	// signal.
	ExitCode int
	Signal   syscall.Signal
	Warned   bool
	Termed   bool // SIGTERM sent at Timeouts.Term
	Killed   bool // cgroup.kill at Timeouts.Kill (or on cancel)
	Duration time.Duration
	// Applied is what the child put in force, as it reported it.
	Applied Applied
	// MetaRefused are the metadata changes (chmod, chown, xattrs, times)
	// refused before they happened, at most maxMetaRefusals of them;
	// MetaDropped counts the rest, MetaHandled every supervised call.
	MetaRefused []MetaRefusal
	MetaHandled int
	MetaDropped int
}

// String is the one-line summary printed at the end of `watcher exec`.
func (v Verdict) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "watcher: %s", v.Outcome)
	if v.Outcome != OutcomeRefused {
		if v.Signal != 0 {
			fmt.Fprintf(&b, " signal=%s", unix.SignalName(v.Signal))
		} else {
			fmt.Fprintf(&b, " exit=%d", v.ExitCode)
		}
		fmt.Fprintf(&b, " time=%s", v.Duration.Round(time.Millisecond))
	}
	fmt.Fprintf(&b, " sandbox=%s", orDash(v.Sandbox))
	fmt.Fprintf(&b, " label=%s", orDash(v.Label))
	if v.CgroupID != 0 {
		fmt.Fprintf(&b, " cgroup=%d", v.CgroupID)
	}
	if v.Warned || v.Termed || v.Killed {
		var steps []string
		if v.Warned {
			steps = append(steps, "warn")
		}
		if v.Termed {
			steps = append(steps, "term")
		}
		if v.Killed {
			steps = append(steps, "kill")
		}
		fmt.Fprintf(&b, " timeouts=%s", strings.Join(steps, ","))
	}
	if v.Outcome != OutcomeRefused {
		fmt.Fprintf(&b, " %s", v.Applied.Summary())
	}
	fmt.Fprintf(&b, " cmd=%q", v.Command)
	return b.String()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// ErrBreakerOpen is returned when the breaker refuses a run.
var ErrBreakerOpen = errors.New("circuit breaker open: too many consecutive hard timeouts")

// ErrNotApplied is returned when the child could not apply the
// restrictions; the target did not run.
var ErrNotApplied = errors.New("restrictions not applied")

var labelChars = regexp.MustCompile(`[^A-Za-z0-9_.-]+`)

// leafName makes a cgroup name from the label and a random suffix.
func leafName(label string) string {
	b := make([]byte, 4)
	rand.Read(b)
	l := labelChars.ReplaceAllString(label, "_")
	if len(l) > 64 {
		l = l[:64]
	}
	if l == "" {
		l = "run"
	}
	return "exec-" + l + "-" + hex.EncodeToString(b)
}

// Run launches the command and waits for it. The error is nil when the
// command ran, whatever its exit status or timeout (see the Verdict); it
// is set when nothing ran (breaker open, bad config, restrictions failed)
// or the leaf cgroup could not be cleaned up. A frozen leaf (either
// freezer) is killed like any other, and every wait for killed processes
// is bounded; should this process itself be killed while the command
// runs, the leaf's reaper (startReaper) kills and removes the leaf.
func Run(ctx context.Context, cfg Config) (Verdict, error) {
	v := Verdict{Sandbox: cfg.Sandbox, Label: cfg.Label, ExitCode: -1,
		Command: strings.Join(append([]string{cfg.Path}, cfg.Args...), " ")}
	if cfg.Breaker != nil {
		if err := cfg.Breaker.Allow(cfg.Sandbox); err != nil {
			v.Outcome = OutcomeRefused
			return v, err
		}
	}
	if err := cfg.Restrictions.Files.Validate(); err != nil {
		return v, fmt.Errorf("launch: %w", err)
	}
	target := cfg.Path
	if !strings.Contains(target, "/") && !cfg.InProcess {
		p, err := exec.LookPath(target)
		if err != nil {
			return v, fmt.Errorf("launch: %w", err)
		}
		target = p
	}
	self := cfg.Executable
	if self == "" {
		var err error
		if self, err = os.Executable(); err != nil {
			return v, fmt.Errorf("launch: find own binary: %w", err)
		}
	}
	spec, err := encodeSpec(childSpec{Path: target, Args: append([]string{cfg.Path}, cfg.Args...), Restrictions: cfg.Restrictions,
		Mounts:    append(append([]Mount{}, cfg.Isolation.Mounts...), subtreeMounts(cfg.Isolation.Namespaces)...),
		InProcess: cfg.InProcess, Namespaces: cfg.Isolation.Namespaces})
	if err != nil {
		return v, fmt.Errorf("launch: %w", err)
	}

	// A fresh leaf per run: a cgroup.kill'ed cgroup kills later
	// CLONE_INTO_CGROUP children at once (kernel quirk).
	parent, err := cgroupfs.Abs(cfg.CgroupParent)
	if err != nil {
		return v, fmt.Errorf("launch: %w", err)
	}
	if cfg.CgroupParent == "" {
		return v, errors.New("launch: no sandbox cgroup")
	}
	leaf := filepath.Join(parent, leafName(cfg.Label))
	if err := os.Mkdir(leaf, 0o755); err != nil {
		return v, fmt.Errorf("launch: create leaf cgroup: %w", err)
	}
	v.Cgroup = leaf
	v.CgroupID, _ = cgroupfs.ID(leaf)
	// Should this process die before it removes the leaf, the reaper
	// does.
	stopReaper := startReaper(leaf)
	runErr := run(ctx, cfg, self, spec, leaf, &v)
	if cfg.Leaf != nil {
		cfg.Leaf.Exit(leaf)
	}
	if err := cgroupfs.Remove(leaf); err != nil {
		runErr = errors.Join(runErr, fmt.Errorf("launch: %w", err))
	}
	stopReaper()
	if cfg.Breaker != nil && v.Outcome != OutcomeFailed && v.Outcome != OutcomeCanceled {
		cfg.Breaker.Record(cfg.Sandbox, v.Outcome == OutcomeKilled)
	}
	return v, runErr
}

// killWait bounds each wait of the launcher for killed processes: for
// the leaf to empty, for the command to be reaped. A frozen leaf is killed
// too (cgroupfs.Kill); past the bound the run ends with an error rather
// than hang.
const killWait = 10 * time.Second

// pipeGrace is how long the command's output may still be copied once the
// leaf is empty: only a process outside the leaf (one the command handed
// its pipe to) can still hold it, and it does not hold the run up.
const pipeGrace = 2 * time.Second

func run(ctx context.Context, cfg Config, self, spec, leaf string, v *Verdict) error {
	reportR, reportW, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("launch: %w", err)
	}
	defer reportR.Close()
	goR, goW, err := os.Pipe()
	if err != nil {
		reportW.Close()
		return fmt.Errorf("launch: %w", err)
	}
	defer goW.Close()

	cmd := exec.Command(self)
	cmd.Args = []string{initArg0}
	env := cfg.Env
	if env == nil {
		env = os.Environ()
	}
	cmd.Env = specEnv(env, spec)
	cmd.Dir = cfg.Dir
	if cfg.Isolation.Namespaces != 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: cfg.Isolation.Namespaces}
	}
	cmd.ExtraFiles = []*os.File{reportW, goR}
	// The child starts in the launcher's cgroup: the binary's package
	// initialisers are not the command. It applies the restrictions,
	// reports, and waits; the launcher moves it into the leaf and lets it
	// exec, so the command is in the sandbox from its first instruction.

	// Only *os.File stdio: exec.Cmd then starts no copying goroutines and
	// the process can be reaped with Process.Wait while leftovers in the
	// cgroup are killed; our own copiers end when the last holder dies.
	var copiers sync.WaitGroup
	var closeAfterStart, readEnds []*os.File
	stdio := func(w io.Writer) (*os.File, error) {
		if w == nil {
			return nil, nil
		}
		if f, ok := w.(*os.File); ok {
			return f, nil
		}
		r, wr, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		closeAfterStart = append(closeAfterStart, wr)
		readEnds = append(readEnds, r)
		copiers.Add(1)
		go func() {
			defer copiers.Done()
			io.Copy(w, r)
			r.Close()
		}()
		return wr, nil
	}
	if cmd.Stdout, err = stdio(cfg.Stdout); err != nil {
		return fmt.Errorf("launch: %w", err)
	}
	if cfg.Stderr != nil && cfg.Stderr == cfg.Stdout {
		// One pipe, like exec.Cmd: two copiers into one writer (a
		// bytes.Buffer's ReadFrom) would lose data.
		cmd.Stderr = cmd.Stdout
	} else if cmd.Stderr, err = stdio(cfg.Stderr); err != nil {
		return fmt.Errorf("launch: %w", err)
	}
	if cfg.Stdin != nil {
		if f, ok := cfg.Stdin.(*os.File); ok {
			cmd.Stdin = f
		} else {
			r, w, err := os.Pipe()
			if err != nil {
				return fmt.Errorf("launch: %w", err)
			}
			closeAfterStart = append(closeAfterStart, r)
			cmd.Stdin = r
			go func() { io.Copy(w, cfg.Stdin); w.Close() }()
		}
	}

	start := time.Now()
	err = cmd.Start()
	reportW.Close()
	goR.Close()
	for _, f := range closeAfterStart {
		f.Close()
	}
	if err != nil {
		copiers.Wait()
		v.Outcome = OutcomeFailed
		return fmt.Errorf("launch: start: %w", err)
	}
	v.PID = cmd.Process.Pid

	// The restrictions must be in force before the child enters the
	// sandbox and execs.
	var applied Applied
	report := json.NewDecoder(reportR)
	if err := report.Decode(&applied); err != nil {
		applied.Error = "no report from the child: " + err.Error()
	}
	var meta *metaSupervisor
	if applied.Error == "" && applied.MetaNotifyFD > 0 {
		if meta, err = superviseMeta(v.PID, applied.MetaNotifyFD, cfg.Restrictions.Files); err != nil {
			applied.Error = err.Error()
		}
	}
	if meta != nil {
		defer func() {
			v.MetaRefused, v.MetaHandled, v.MetaDropped = meta.stop()
		}()
	}
	if applied.Error == "" {
		if err := cgroupfs.MovePID(leaf, v.PID); err != nil {
			applied.Error = err.Error()
		} else if err := enterLeaf(cfg.Leaf, leaf, v.PID); err != nil {
			applied.Error = err.Error()
		} else if _, err := goW.Write([]byte{1}); err != nil {
			applied.Error = "release child: " + err.Error()
		}
	}
	goW.Close()
	if applied.Error != "" {
		cmd.Process.Kill()
		cgroupfs.KillWait(leaf, killWait) // it may be in the leaf already
		cmd.Process.Wait()
		waitCopies(&copiers, readEnds)
		v.Applied = applied
		v.Outcome = OutcomeFailed
		return fmt.Errorf("launch: %w: %s", ErrNotApplied, applied.Error)
	}
	start = time.Now()
	initPID := 0 // the child stays PID 1 of the command's namespace
	if cfg.Isolation.Namespaces&unix.CLONE_NEWPID != 0 && !cfg.InProcess {
		initPID = v.PID
	}
	waitc := make(chan *os.ProcessState, 1)
	go func() {
		st, _ := cmd.Process.Wait()
		waitc <- st
	}()

	timer := func(d time.Duration) <-chan time.Time {
		if d <= 0 {
			return nil
		}
		return time.After(d)
	}
	warnC, termC, killC := timer(cfg.Timeouts.Warn), timer(cfg.Timeouts.Term), timer(cfg.Timeouts.Kill)
	var reapC <-chan time.Time
	var st *os.ProcessState
	var waitErr error
	canceled := false
wait:
	for {
		select {
		case st = <-waitc:
			break wait
		case <-reapC:
			// Killed with its leaf, yet not reaped: it left the leaf.
			reapC = nil
			cmd.Process.Kill()
		case <-warnC:
			warnC = nil
			v.Warned = true
			if cfg.Timeouts.OnWarn != nil {
				go cfg.Timeouts.OnWarn()
			}
		case <-termC:
			termC = nil
			v.Termed = true
			// Not to PID 1 of the command's namespace: it would forward
			// the signal, and the command would get it twice.
			signalCgroup(leaf, syscall.SIGTERM, initPID)
		case <-killC:
			killC = nil
			v.Killed = true
			cgroupfs.Kill(leaf)
			reapC = time.After(killWait)
		case <-ctx.Done():
			canceled = true
			v.Killed = true
			st, waitErr = killAndReap(leaf, cmd.Process, waitc)
			break wait
		}
	}
	v.Duration = time.Since(start)
	// Whatever the command left behind in its cgroup goes with it, frozen
	// or not. What cannot be killed in time is Run's error (the leaf is
	// not removed).
	cgroupfs.KillWait(leaf, killWait)
	waitCopies(&copiers, readEnds)
	v.Applied = applied
	if st == nil {
		v.Outcome = OutcomeCanceled
		return waitErr
	}

	ws, _ := st.Sys().(syscall.WaitStatus)
	signaled := ws.Signaled()
	var cs commandStatus
	switch {
	case initPID != 0 && !signaled && report.Decode(&cs) == nil:
		// PID 1 reported how the command ended (it cannot die of the
		// command's signal itself).
		signaled = !cs.Exited
		if signaled {
			v.Signal = syscall.Signal(cs.Signal)
		} else {
			v.ExitCode = cs.ExitCode
		}
	case signaled:
		v.Signal = ws.Signal()
	default:
		v.ExitCode = ws.ExitStatus()
	}
	switch {
	case canceled:
		v.Outcome = OutcomeCanceled
	case v.Killed:
		v.Outcome = OutcomeKilled
	case v.Termed:
		v.Outcome = OutcomeTermed
	case signaled:
		v.Outcome = OutcomeSignaled
	default:
		v.Outcome = OutcomeExited
	}
	return nil
}

// killAndReap kills the leaf, frozen or not, and reaps the command, each
// within killWait; a command that is not in the leaf any more (it moved
// itself out) is killed directly. It gives up with an error rather than
// wait longer.
func killAndReap(leaf string, p *os.Process, waitc <-chan *os.ProcessState) (*os.ProcessState, error) {
	killErr := cgroupfs.KillWait(leaf, killWait)
	select {
	case st := <-waitc:
		return st, nil
	case <-time.After(killWait):
	}
	p.Kill()
	select {
	case st := <-waitc:
		return st, nil
	case <-time.After(killWait):
	}
	return nil, errors.Join(fmt.Errorf("launch: the command (pid %d) did not end within %v of its kill", p.Pid, 2*killWait), killErr)
}

// waitCopies waits for the output copiers; past pipeGrace it closes their
// read ends, which ends them.
func waitCopies(copiers *sync.WaitGroup, readEnds []*os.File) {
	done := make(chan struct{})
	go func() {
		copiers.Wait()
		close(done)
	}()
	select {
	case <-done:
		return
	case <-time.After(pipeGrace):
	}
	for _, r := range readEnds {
		r.Close()
	}
	<-done
}

// signalCgroup sends sig to every process in the cgroup subtree but
// skip (0: none).
func signalCgroup(path string, sig syscall.Signal, skip int) {
	filepath.WalkDir(path, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		pids, _ := cgroupfs.Procs(p)
		for _, pid := range pids {
			if pid == skip {
				continue
			}
			syscall.Kill(pid, sig)
		}
		return nil
	})
}

// Breaker refuses further runs of a sandbox after K consecutive hard
// timeouts, until Reset. It is safe for concurrent use.
type Breaker struct {
	// K is the number of consecutive hard timeouts that opens the
	// breaker; K <= 0 never opens it.
	K int

	mu     sync.Mutex
	counts map[string]int
}

// NewBreaker returns a breaker opening after k consecutive hard timeouts.
func NewBreaker(k int) *Breaker { return &Breaker{K: k} }

// Allow returns ErrBreakerOpen when the sandbox's breaker is open.
func (b *Breaker) Allow(sandbox string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.K > 0 && b.counts[sandbox] >= b.K {
		return fmt.Errorf("sandbox %q: %w (%d)", sandbox, ErrBreakerOpen, b.counts[sandbox])
	}
	return nil
}

// Record counts a run: a hard timeout adds one, anything else resets.
func (b *Breaker) Record(sandbox string, hardTimeout bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.counts == nil {
		b.counts = map[string]int{}
	}
	if hardTimeout {
		b.counts[sandbox]++
	} else {
		delete(b.counts, sandbox)
	}
}

// Reset closes the breaker of a sandbox (an operator decision).
func (b *Breaker) Reset(sandbox string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.counts, sandbox)
}

// Consecutive returns the sandbox's current count of hard timeouts.
func (b *Breaker) Consecutive(sandbox string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.counts[sandbox]
}

func enterLeaf(h LeafHook, leaf string, pid int) error {
	if h == nil {
		return nil
	}
	return h.Enter(leaf, pid)
}
