package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/escape"
	"github.com/watcherhq/watcher/internal/ledger"
	"github.com/watcherhq/watcher/internal/pipeline"
)

// An agent can die without a stop: where no BPF LSM hook runs, a sandbox
// can still deliver it a SIGKILL (a file owner's signal, F_SETOWN plus
// F_SETSIG, which the signal_generate tracepoint sees but cannot refuse).
// The pinned programs keep enforcing and the ring buffers keep queueing
// while no agent runs; the next agent reads the queue and writes one
// record of the gap (RuleAgentGap): how long no agent ran, what the kernel
// dropped meanwhile, and which sandbox aimed at the agent.
//
// The agent keeps a small life file beside the ledger (the state
// directory, protected as the agent's own files): its pid, a heartbeat
// with the kernel's counters, and a stop mark written by a clean stop. A
// start that finds a life file without a stop mark follows a death.

// RuleAgentGap is the rule of the record a restarted agent writes about
// the time no agent ran after a death (never after a clean stop).
const RuleAgentGap = "agent_gap"

// RuleAgentStop marks the record of a clean stop.
const RuleAgentStop = "agent_stop"

const (
	// lifeBeat is how often the life file's heartbeat is written.
	lifeBeat = time.Second
	// gapSettle is how long the restarted agent reads the queue before
	// writing the gap record: the kernel's record of the signal that
	// killed its predecessor is among the first events read.
	gapSettle = 2 * time.Second
	// gapFoundWait is how long after the killing signal's record the gap
	// record is written.
	gapFoundWait = 250 * time.Millisecond
)

// lifeState is the life file.
type lifeState struct {
	PID     int       `json:"pid"`
	Started time.Time `json:"started"`
	// Alive is the last heartbeat; the counters are the kernel's at that
	// moment.
	Alive time.Time `json:"alive"`
	// Stopped is set by a clean stop.
	Stopped time.Time `json:"stopped,omitzero"`
	// RingAlert and RingRoutine are the ring buffers' drop counters
	// (pinned: they outlive agents).
	RingAlert   uint64 `json:"ring_alert"`
	RingRoutine uint64 `json:"ring_routine"`
	// SandboxSignals counts, by signal number, the signals sandboxed
	// processes made the kernel queue for the agent (the backstop's
	// pinned count).
	SandboxSignals map[int]uint64 `json:"sandbox_signals,omitempty"`
	// Pending is this agent's gap record while it is not yet written (a
	// snapshot, updated when the killing signal is found): an agent
	// killed again before writing it leaves it to the next, so a sandbox
	// that kills each agent as soon as it starts cannot keep the deaths
	// out of the ledger.
	Pending *pendingGap `json:"pending_gap,omitempty"`
}

// pendingGap is a gap record not yet in the ledger.
type pendingGap struct {
	Time    time.Time     `json:"time"`
	Message string        `json:"message"`
	Sandbox audit.Sandbox `json:"sandbox,omitzero"`
	Process audit.Process `json:"process,omitzero"`
}

func pendingOf(ev audit.Event) *pendingGap {
	return &pendingGap{Time: ev.Time, Message: ev.Message, Sandbox: ev.Sandbox, Process: ev.Process}
}

// event is the gap record the pending snapshot stands for.
func (p *pendingGap) event() audit.Event {
	return audit.Event{Time: p.Time, Kind: audit.KindAgent, Verdict: audit.VerdictRecorded, Severity: audit.SeverityAlert,
		Rule: RuleAgentGap, Mechanism: "agent", Sandbox: p.Sandbox, Process: p.Process, Message: p.Message}
}

func lifeFile(stateDir string) string { return filepath.Join(stateDir, "agent-life.json") }

func readLife(path string) (*lifeState, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read life file: %w", err)
	}
	var s lifeState
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("life file %s: %w", path, err)
	}
	return &s, nil
}

// lifeSize is the life file's fixed size: each beat rewrites it in place
// (one write at offset 0, padded with spaces, which JSON ignores). A
// rename each second would be a create and a move in the agent's state
// directory every second, and the inode watch rewrites the file rules on
// each (inodewatch.go).
const lifeSize = 4096

// writeLife writes s over f in one write, so a death leaves a whole beat.
func writeLife(f *os.File, s *lifeState) error {
	data, err := json.Marshal(s)
	if err != nil {
		return err
	}
	if len(data) >= lifeSize {
		return fmt.Errorf("life file: %d bytes, over %d", len(data), lifeSize)
	}
	buf := make([]byte, lifeSize)
	copy(buf, data)
	for i := len(data); i < lifeSize-1; i++ {
		buf[i] = ' '
	}
	buf[lifeSize-1] = '\n'
	if _, err := f.WriteAt(buf, 0); err != nil {
		return fmt.Errorf("write life file: %w", err)
	}
	return nil
}

// gapWatch is what a restarted agent knows of its predecessor's death,
// until the gap record is written.
type gapWatch struct {
	prev       lifeState
	lastRecord time.Time // the ledger's last record before this start
	restart    time.Time
	// lostAlert and lostRoutine are ring buffer drops since the last
	// heartbeat; signals, sandbox signals to the agent since then.
	lostAlert, lostRoutine uint64
	signals                map[int]uint64

	// found closes when the queue yields the signal that killed the
	// predecessor: the record is written soon after, not at gapSettle, so
	// a sandbox that kills each agent as soon as it reads the queue cannot
	// keep every gap out of the ledger.
	found     chan struct{}
	foundOnce sync.Once

	mu      sync.Mutex
	backlog int          // events dated before the restart, read from the queue
	suspect *audit.Event // the latest of them aimed at the agent
	done    atomic.Bool
}

// life is the agent's side of the life file.
type life struct {
	mu   sync.Mutex // cur and the file: runLife and Stop both beat
	path string
	f    *os.File // nil when it could not be opened
	cur  lifeState
	gap  *gapWatch // nil: no death before this start
}

// beginLife reads what the previous agent left (life file, ledger tail,
// kernel counters) before any queued event is read, and starts this
// agent's life file. Problems are reported, never fatal: the gap record
// is an account, not enforcement.
func (a *Agent) beginLife() {
	l := &life{path: lifeFile(StateDir(a.pol)), cur: lifeState{PID: os.Getpid(), Started: a.started}}
	a.life = l
	prev, err := readLife(l.path)
	if err != nil {
		a.emit(audit.Event{Kind: audit.KindAgent, Verdict: audit.VerdictRecorded, Severity: audit.SeverityAlert,
			Message: "previous agent's life file unreadable (a gap after a death is not recorded): " + err.Error()})
	}
	l.cur.RingAlert, l.cur.RingRoutine, l.cur.SandboxSignals = a.kernelCounts()
	if prev != nil && prev.Pending != nil {
		// The predecessor died before writing its own gap record.
		ev := prev.Pending.event()
		ev.Message += fmt.Sprintf("; written by pid %d: pid %d died before writing it", os.Getpid(), prev.PID)
		a.emit(ev)
	}
	if prev != nil && prev.Stopped.IsZero() {
		g := &gapWatch{prev: *prev, restart: a.started, signals: map[int]uint64{}, found: make(chan struct{})}
		head, _ := a.ledger.Head()
		g.lastRecord, _ = lastRecordBefore(a.pol.Agent.LedgerDir, head, a.started)
		g.lostAlert = sub(l.cur.RingAlert, prev.RingAlert)
		g.lostRoutine = sub(l.cur.RingRoutine, prev.RingRoutine)
		for sig, n := range l.cur.SandboxSignals {
			if d := sub(n, prev.SandboxSignals[sig]); d > 0 {
				g.signals[sig] = d
			}
		}
		l.gap = g
		l.cur.Pending = pendingOf(g.record())
		a.pipe.Add(g)
	}
	if l.f, err = os.OpenFile(l.path, os.O_RDWR|os.O_CREATE, 0o600); err != nil {
		a.emit(audit.Event{Kind: audit.KindAgent, Verdict: audit.VerdictRecorded, Severity: audit.SeverityAlert,
			Message: "life file not opened (a later restart cannot tell a death from a stop): " + err.Error()})
		return
	}
	a.beat(time.Now(), time.Time{})
}

func sub(a, b uint64) uint64 {
	if a < b {
		return 0 // the pins were removed between the agents: counters restarted
	}
	return a - b
}

// kernelCounts reads the pinned counters the life file keeps.
func (a *Agent) kernelCounts() (alert, routine uint64, sigs map[int]uint64) {
	if a.eng != nil {
		alert, routine, _ = a.eng.RingDrops()
	}
	if a.backstop.Backstop == nil {
		return
	}
	for sig := 1; sig < 32; sig++ {
		if n, err := a.backstop.AgentSignals(syscall.Signal(sig)); err == nil && n > 0 {
			if sigs == nil {
				sigs = map[int]uint64{}
			}
			sigs[sig] = n
		}
	}
	return
}

// beat writes the life file with the kernel's counters now; stopped is
// set by a clean stop.
func (a *Agent) beat(now, stopped time.Time) {
	l := a.life
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return
	}
	l.cur.Alive, l.cur.Stopped = now, stopped
	l.cur.RingAlert, l.cur.RingRoutine, l.cur.SandboxSignals = a.kernelCounts()
	if err := writeLife(l.f, &l.cur); err != nil && stopped.IsZero() && l.cur.Alive.Sub(l.cur.Started) < 2*lifeBeat {
		// Said once, at start; later beats fail the same way.
		a.emit(audit.Event{Kind: audit.KindAgent, Verdict: audit.VerdictRecorded, Severity: audit.SeverityAlert,
			Message: "life file not written (a later restart cannot tell a death from a stop): " + err.Error()})
	}
}

// runLife beats until ctx ends and writes the gap record once the queue
// had time to be read.
func (a *Agent) runLife(done <-chan struct{}) {
	t := time.NewTicker(lifeBeat)
	defer t.Stop()
	settle := time.After(gapSettle)
	var found <-chan struct{}
	if a.life.gap != nil {
		found = a.life.gap.found
	}
	for {
		select {
		case <-done:
			return
		case <-found:
			// The rest of the queue follows within a few polls; the
			// snapshot with the suspect is kept meanwhile.
			found, settle = nil, time.After(gapFoundWait)
			a.setPending(pendingOf(a.life.gap.record()))
		case <-settle:
			a.finishGap()
		case now := <-t.C:
			a.beat(now, time.Time{})
		}
	}
}

// endLife marks a clean stop in the life file, after the ledger's stop
// record.
func (a *Agent) endLife() {
	if a.life == nil {
		return
	}
	a.beat(time.Now(), time.Now())
	a.life.mu.Lock()
	if a.life.f != nil {
		a.life.f.Close()
		a.life.f = nil // a late beat writes nothing
	}
	a.life.mu.Unlock()
}

// finishGap writes the gap record, once.
func (a *Agent) finishGap() {
	if a.life == nil || a.life.gap == nil || !a.life.gap.done.CompareAndSwap(false, true) {
		return
	}
	a.emit(a.life.gap.record())
	a.setPending(nil)
}

// setPending keeps p as the unwritten gap record in the life file.
func (a *Agent) setPending(p *pendingGap) {
	a.life.mu.Lock()
	a.life.cur.Pending = p
	a.life.mu.Unlock()
	a.beat(time.Now(), time.Time{})
}

// Name, Consume and Close make gapWatch a pipeline sink: it sees the
// events queued while no agent ran (dated before the restart).
func (g *gapWatch) Name() string { return "agent_gap" }
func (g *gapWatch) Close() error { return nil }
func (g *gapWatch) Consume(ev *audit.Event) (pipeline.Decision, error) {
	if g.done.Load() || !ev.Time.Before(g.restart) || ev.Kind == audit.KindAgent {
		return pipeline.Decision{}, nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.backlog++
	if aimedAtAgent(ev, g.prev.PID) && (g.suspect == nil || !ev.Time.Before(g.suspect.Time) || lethal(ev) && !lethal(g.suspect)) {
		s := audit.Event{Time: ev.Time, Kind: ev.Kind, Verdict: ev.Verdict, Sandbox: ev.Sandbox, Process: ev.Process,
			Message: ev.Message}
		s.Process.Args = nil
		if ev.Syscall != nil {
			sc := *ev.Syscall
			s.Syscall = &sc
		}
		if ev.Target != nil {
			tg := *ev.Target
			s.Target = &tg
		}
		g.suspect = &s
		if lethal(ev) && g.found != nil {
			g.foundOnce.Do(func() { close(g.found) })
		}
	}
	return pipeline.Decision{}, nil
}

// aimedAtAgent: a sandboxed process's signal or ptrace at the agent pid.
func aimedAtAgent(ev *audit.Event, pid int) bool {
	if ev.Target == nil || pid <= 0 || ev.Target.PID != uint32(pid) || escape.SandboxKey(ev) == "" {
		return false
	}
	return ev.Kind == audit.KindSignal || ev.Kind == audit.KindPtrace || escape.SignalledAgent(ev)
}

// lethal: an attempt that ends or stops the agent.
func lethal(ev *audit.Event) bool {
	sig, _, ok := escape.Classify(ev)
	return ok && sig == escape.SigAgentKill
}

// record is the gap record.
func (g *gapWatch) record() audit.Event {
	g.mu.Lock()
	defer g.mu.Unlock()
	alive, by := g.prev.Alive, "heartbeat"
	if g.lastRecord.After(alive) {
		alive, by = g.lastRecord, "ledger record"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "agent gap: pid %d ended without a stop; no agent for %s (last sign of life: %s %s, last ledger record %s, restarted %s)",
		g.prev.PID, g.restart.Sub(alive).Round(time.Millisecond), by, stamp(alive), stamp(g.lastRecord), stamp(g.restart))
	fmt.Fprintf(&b, "; pinned programs kept enforcing")
	fmt.Fprintf(&b, "; lost while away: %d events (ring buffer drops since the last heartbeat: alert %d, routine %d)",
		g.lostAlert+g.lostRoutine, g.lostAlert, g.lostRoutine)
	fmt.Fprintf(&b, "; queued while away and recorded now: %d events (any the dead agent had read but not yet written are lost uncounted)", g.backlog)
	if len(g.signals) > 0 {
		var parts []string
		for sig := 1; sig < 32; sig++ {
			if n := g.signals[sig]; n > 0 {
				parts = append(parts, fmt.Sprintf("%s x%d", sigName(sig), n))
			}
		}
		fmt.Fprintf(&b, "; signals from sandboxes to the agent since the last heartbeat: %s", strings.Join(parts, ", "))
	}
	ev := audit.Event{Time: g.restart, Kind: audit.KindAgent, Verdict: audit.VerdictRecorded, Severity: audit.SeverityAlert,
		Rule: RuleAgentGap, Mechanism: "agent"}
	if s := g.suspect; s != nil {
		ev.Sandbox, ev.Process = s.Sandbox, s.Process
		how := string(s.Kind)
		if s.Syscall != nil && s.Syscall.Name != "" {
			how = "via " + s.Syscall.Name
		} else if s.Syscall != nil {
			how = fmt.Sprintf("via syscall %d", s.Syscall.Nr)
		}
		if s.Target != nil && s.Target.Mode != 0 && s.Kind == audit.KindSignal {
			how = sigName(int(s.Target.Mode)) + " " + how
		}
		fmt.Fprintf(&b, "; suspected: sandbox %s, %s (pid %d) aimed at the agent at %s (%s, %s)",
			escape.SandboxKey(s), s.Process.Comm, s.Process.TGID, stamp(s.Time), how, s.Verdict)
	} else {
		b.WriteString("; suspected: none (no signal or ptrace from a sandbox at the agent was queued)")
	}
	ev.Message = b.String()
	return ev
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "none"
	}
	return t.Format("15:04:05.000")
}

func sigName(sig int) string {
	if s := unix.SignalName(syscall.Signal(sig)); s != "" {
		return s
	}
	return fmt.Sprint("signal ", sig)
}

// lastRecordBefore returns the latest event time among the records of the
// ledger's last segment (the one holding head) dated before t: the
// previous agent's last record. Zero when that segment has none (it was
// just started).
func lastRecordBefore(dir string, head uint64, t time.Time) (time.Time, error) {
	r, err := ledger.NewReaderFrom(dir, head)
	if err != nil {
		return time.Time{}, err
	}
	defer r.Close()
	var last time.Time
	for {
		rec, err := r.Next()
		if err == io.EOF {
			return last, nil
		}
		if err != nil {
			return last, err
		}
		if at := rec.Event.Time; at.Before(t) && at.After(last) {
			last = at
		}
	}
}
