package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/canary"
	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/control"
	"github.com/watcherhq/watcher/internal/dnsproxy"
	"github.com/watcherhq/watcher/internal/policy"
)

// The canary (internal/canary): at start, after every policy reload and
// every sandbox's canary.interval, probes in fresh leaves of each sandbox
// try what its policy forbids and allows; a result that differs is an
// alert, a metric, a non-zero `watcher status` and, with
// on_canary_failure: freeze, a frozen sandbox.

// canaryState is the agent's canary bookkeeping.
type canaryState struct {
	runMu  sync.Mutex // one run at a time
	mu     sync.Mutex
	last   map[string]control.CanaryReport // by sandbox
	due    map[string]time.Time
	kick   chan string
	leaves sync.Map // probe leaf cgroup id -> check name
	names  sync.Map // DNS name a probe queries -> check name
	// fixtures are paths the runner creates (-> time noted): the inode
	// watch does not rewrite the file rules for them.
	fixtures sync.Map
	marks    atomic.Int64
}

// canaryForget is how long probe leaves and names stay marked: their
// events can be read well after the probe is gone.
const canaryForget = 2 * time.Minute

// newCanaryState is made with the Agent: the control socket answers
// `watcher check` before the loop starts.
func newCanaryState() canaryState {
	return canaryState{
		last: map[string]control.CanaryReport{},
		due:  map[string]time.Time{},
		kick: make(chan string, 1),
	}
}

// startCanary starts the periodic canary (not in private `watcher exec`
// agents: each command would pay for a run).
func (a *Agent) startCanary(ctx context.Context) {
	if a.opts.NoCanary {
		return
	}
	// An agent killed during a run left its scratch directory behind.
	if _, err := canary.RemoveStaleScratch(""); err != nil {
		a.emit(audit.Event{Kind: audit.KindAgent, Verdict: audit.VerdictRecorded,
			Message: "removing stale canary scratch directories: " + err.Error()})
	}
	a.wg.Add(1)
	go func() { defer a.wg.Done(); a.canaryLoop(ctx) }()
}

// kickCanary asks the loop for a run of every sandbox now.
func (a *Agent) kickCanary(reason string) {
	if a.canary.kick == nil {
		return
	}
	select {
	case a.canary.kick <- reason:
	default:
	}
}

func (a *Agent) canaryLoop(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	reason := "start"
	all := true
	for {
		now := time.Now()
		for _, sb := range a.Policy().Sandboxes {
			if !sb.Canary.Enabled {
				continue
			}
			a.canary.mu.Lock()
			due, seen := a.canary.due[sb.Name]
			a.canary.mu.Unlock()
			if all || !seen || !now.Before(due) {
				r := reason
				if !all && seen {
					r = "interval"
				}
				a.RunCanary(ctx, sb.Name, r)
			}
		}
		all = false
		select {
		case <-ctx.Done():
			return
		case reason = <-a.canary.kick:
			all = true
		case <-t.C:
			reason = "start"
		}
	}
}

// RunCanary runs the canary of one sandbox now and records the result:
// the report, the metrics, alert events for failed checks and, where the
// policy says so, the freeze.
func (a *Agent) RunCanary(ctx context.Context, sandbox, reason string) (control.CanaryReport, error) {
	a.canary.runMu.Lock()
	defer a.canary.runMu.Unlock()
	return a.runCanary(ctx, sandbox, reason, 3)
}

// runCanary runs the canary under the policy in force; a run during which
// another policy was applied tested a mix of both (the probes planned
// from the old one, the layers partly rewritten) and proves nothing: it
// is run again under the new one, up to tries times.
func (a *Agent) runCanary(ctx context.Context, sandbox, reason string, tries int) (control.CanaryReport, error) {
	a.mu.Lock()
	pol, plan := a.pol, a.plan
	a.mu.Unlock()
	sb := pol.Sandbox(sandbox)
	if sb == nil {
		return control.CanaryReport{}, fmt.Errorf("no sandbox %q", sandbox)
	}
	interval := sb.Canary.Interval.Duration
	if interval <= 0 {
		interval = policy.DefaultCanaryInterval
	}
	a.canary.mu.Lock()
	a.canary.due[sandbox] = time.Now().Add(interval)
	a.canary.mu.Unlock()

	rep := control.CanaryReport{Sandbox: sandbox, Time: time.Now(), Reason: reason}
	if a.frozen.any(sandbox) {
		// Probes would hang in the frozen cgroups. The last failures
		// stand (status stays non-zero) until a run after the thaw.
		if last := a.canaryReport(sandbox); last != nil {
			rep.Results, rep.Failures, rep.Frozen = last.Results, last.Failures, last.Frozen
		}
		rep.Skipped = "the sandbox is frozen (watcher thaw " + sandbox + ")"
		a.storeCanary(rep)
		return rep, nil
	}
	parent := ExecParents(pol, sb)[0]
	abs, err := cgroupfs.Abs(parent)
	if err != nil {
		return rep, err
	}
	// The exec path is a watcher exec like any other: its seccomp and
	// Landlock refusals must be recorded.
	execPath := a.PrepareExec() == nil
	runner := &canary.Runner{LedgerDir: pol.Agent.LedgerDir, Mark: a.markCanary, PrepareExec: a.PrepareExec,
		Fixture: func(p string) { a.canary.fixtures.Store(filepath.Clean(p), time.Now()) },
		From:    func() uint64 { seq, _ := a.ledger.Head(); return seq },
		Admit:   a.canaryAdmit}
	rep, err = runner.Run(ctx, canary.Target{Policy: pol, Sandbox: sb, Layers: plan.Layers, Parent: abs,
		ExecParent: parent, Restrictions: plan.Launch[sb.Name], Exec: execPath, Reason: reason})
	if err == nil && rep.Failures > 0 && tries > 1 && a.Policy() != pol {
		return a.runCanary(ctx, sandbox, reason, tries-1)
	}
	if err != nil {
		a.emit(audit.Event{Kind: audit.KindCanary, Verdict: audit.VerdictRecorded, Severity: audit.SeverityAlert,
			Sandbox: audit.Sandbox{Name: sandbox}, Mechanism: "canary", Message: "canary could not run: " + err.Error()})
		if !errors.Is(err, context.Canceled) {
			rep.Failures++
			rep.Skipped = "could not run: " + err.Error()
			a.storeCanary(rep)
		}
		return rep, err
	}
	a.recordCanary(sb, &rep)
	a.storeCanary(rep)
	return rep, nil
}

// recordCanary turns a report into events and the freeze; the run's
// record (its CanaryDetail) is what the metrics sink counts.
func (a *Agent) recordCanary(sb *policy.Sandbox, rep *control.CanaryReport) {
	var failed []string
	detail := &audit.CanaryDetail{Reason: rep.Reason}
	for _, r := range rep.Results {
		detail.Checks = append(detail.Checks, audit.CanaryCheck{Name: r.Path + "/" + r.Check, OK: r.OK})
		if r.OK {
			continue
		}
		failed = append(failed, r.Path+"/"+r.Check)
		a.emit(audit.Event{Kind: audit.KindCanary, Verdict: audit.VerdictRecorded, Severity: audit.SeverityAlert,
			Sandbox: audit.Sandbox{Name: sb.Name, Labels: map[string]string{audit.LabelCanary: r.Check}}, Mechanism: "canary", Rule: r.Check,
			Message: fmt.Sprintf("canary check %s via %s failed: expected %s, got %s (layer %s, event in the ledger: %s) on %s; %s",
				r.Check, r.Path, r.Expected, r.Got, r.Layer, r.Event, r.Target, r.Detail)})
	}
	if len(failed) > 0 && sb.OnCanaryFailure == policy.CanaryFreeze {
		var froze []string
		for _, root := range a.rootsOf(sb.Name) {
			mech, err := canary.Freeze(root.path)
			if mech != "" {
				// Frozen, or as frozen as the kernel got it: thaw undoes either.
				froze = append(froze, root.path)
			}
			if err != nil {
				a.emit(audit.Event{Kind: audit.KindCanary, Verdict: audit.VerdictRecorded, Severity: audit.SeverityAlert,
					Sandbox: audit.Sandbox{Name: sb.Name}, Mechanism: "canary", Rule: "on_canary_failure",
					Message: fmt.Sprintf("on_canary_failure: freeze %s: %v", root.path, err)})
			}
		}
		if len(froze) > 0 {
			a.frozen.add(sb.Name, froze...)
		}
		rep.Frozen = froze
	}
	msg := fmt.Sprintf("canary (%s): %d checks passed", rep.Reason, len(rep.Results))
	sev := audit.SeverityRoutine
	if len(failed) > 0 {
		sev = audit.SeverityAlert
		msg = fmt.Sprintf("canary (%s): %d of %d checks failed: %s", rep.Reason, len(failed), len(rep.Results), strings.Join(failed, ", "))
		if len(rep.Frozen) > 0 {
			msg += "; frozen (on_canary_failure: freeze): " + strings.Join(rep.Frozen, ", ") + " (watcher thaw " + sb.Name + ")"
		}
	}
	// The run's record carries its start time: what it proves is the
	// state of the layers from then on.
	a.emit(audit.Event{Time: rep.Time, Kind: audit.KindCanary, Verdict: audit.VerdictRecorded, Severity: sev,
		Sandbox: audit.Sandbox{Name: sb.Name, Labels: map[string]string{audit.LabelCanary: "run"}}, Mechanism: "canary", Message: msg,
		Canary: detail})
}

func (a *Agent) storeCanary(rep control.CanaryReport) {
	a.canary.mu.Lock()
	a.canary.last[rep.Sandbox] = rep
	a.canary.mu.Unlock()
}

// canaryReport returns the sandbox's last report, nil before the first.
func (a *Agent) canaryReport(sandbox string) *control.CanaryReport {
	a.canary.mu.Lock()
	defer a.canary.mu.Unlock()
	if rep, ok := a.canary.last[sandbox]; ok {
		return &rep
	}
	return nil
}

// Check runs the canary now (control.Checker, `watcher check`): of one
// sandbox, or of every sandbox for "".
func (a *Agent) Check(sandbox string) ([]control.CanaryReport, error) {
	var names []string
	if sandbox != "" {
		if a.Policy().Sandbox(sandbox) == nil {
			return nil, fmt.Errorf("no sandbox %q", sandbox)
		}
		names = []string{sandbox}
	} else {
		for _, sb := range a.Policy().Sandboxes {
			names = append(names, sb.Name)
		}
	}
	var out []control.CanaryReport
	for _, n := range names {
		rep, err := a.RunCanary(context.Background(), n, "check")
		if err != nil {
			return out, err
		}
		out = append(out, rep)
	}
	return out, nil
}

// MarkCanary is canary.Runner.Mark for a runner other than the agent's
// own (tests of single checks): its probes are then the canary's to the
// agent as the agent's own are.
func (a *Agent) MarkCanary(id uint64, name, check string) { a.markCanary(id, name, check) }

// markCanary is canary.Runner.Mark: the probe's leaf and DNS names are
// remembered, so enrich labels their events and the DNS proxy charges
// their queries to no budget.
func (a *Agent) markCanary(id uint64, name, check string) {
	if id != 0 {
		a.canary.leaves.Store(id, check)
	}
	if name != "" {
		a.canary.names.Store(name, check)
	}
	a.canary.marks.Add(1)
	time.AfterFunc(canaryForget, func() {
		if id != 0 {
			a.canary.leaves.Delete(id)
		}
		if name != "" {
			a.canary.names.Delete(name)
		}
		a.canary.marks.Add(-1)
	})
}

// canaryCheckOf returns the check whose probe caused ev, "" for events of
// anything else. Only leaves and names the runner created are marked, so
// a sandboxed process cannot pass its events off as the canary's.
func (a *Agent) canaryCheckOf(ev *audit.Event) string {
	if a.canary.marks.Load() == 0 {
		return ""
	}
	if ev.Process.CgroupID != 0 {
		if v, ok := a.canary.leaves.Load(ev.Process.CgroupID); ok {
			return v.(string)
		}
	}
	if ev.Kind == audit.KindDNS && ev.DNS != nil {
		if v, ok := a.canary.names.Load(strings.TrimSuffix(strings.ToLower(ev.DNS.Name), ".")); ok {
			return v.(string)
		}
	}
	return ""
}

// canaryProbeQuery is the DNS proxy's OwnProbe: the query is for a name
// the canary marked and was sent by a process in one of its probe leaves
// (the kernel's record of the client socket names the sending process).
// Such a query is judged by the policy alone: it spends none of the
// sandbox's rate limit or information budget, so the canary never changes
// what it measures, and a budget the sandbox spent never passes for the
// refusal of an unlisted name. A sandboxed process that joined a probe's
// leaf could send the same marked name uncharged: one fixed, made-up name
// carries nothing of its choosing.
func (a *Agent) canaryProbeQuery(src dnsproxy.QuerySource, name string) bool {
	if a.canary.marks.Load() == 0 || a.egress.Egress == nil {
		return false
	}
	if _, ok := a.canary.names.Load(name); !ok {
		return false
	}
	c, ok := a.egress.LookupClient(src.Proto, src.Remote)
	if !ok || c.PID == 0 {
		return false
	}
	cg, err := cgroupOfPID(int(c.PID))
	if err != nil {
		return false
	}
	_, ok = a.canary.leaves.Load(cg)
	return ok
}

// cgroupOfPID returns the id of pid's cgroup2 cgroup.
func cgroupOfPID(pid int) (uint64, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rel, ok := strings.CutPrefix(line, "0::"); ok {
			abs, err := cgroupfs.Abs(rel)
			if err != nil {
				return 0, err
			}
			return cgroupfs.ID(abs)
		}
	}
	return 0, fmt.Errorf("pid %d: no cgroup2 line", pid)
}

// withoutCanaryFixtures drops from changed the canary's own fixtures (forgetting
// fixtures older than canaryForget): what is left needs the file rules
// written again.
func (a *Agent) withoutCanaryFixtures(changed []string) []string {
	now := time.Now()
	a.canary.fixtures.Range(func(k, v any) bool {
		if now.Sub(v.(time.Time)) > canaryForget {
			a.canary.fixtures.Delete(k)
		}
		return true
	})
	out := changed[:0]
	for _, p := range changed {
		if _, ok := a.canary.fixtures.Load(p); !ok {
			out = append(out, p)
		}
	}
	return out
}
