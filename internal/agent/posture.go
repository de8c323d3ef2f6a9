package agent

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/canary"
	"github.com/watcherhq/watcher/internal/posture"
)

// The posture watch: every sandbox root's hardening (internal/posture),
// recorded in the ledger when the cgroup joins and whenever it changes,
// as an alert when it lacks an item the sandbox requires.

// postureInterval is how often the roots' postures are read.
const postureInterval = 2 * time.Second

// postureRoot is what the watch knows of one root.
type postureRoot struct {
	latest   audit.Posture // the last reading
	recorded *audit.Posture
	differs  int // readings in a row that differ from the recorded one
}

// postureWatch holds the watch's state, by root path.
type postureWatch struct {
	mu    sync.Mutex
	roots map[string]*postureRoot
}

// observe takes a reading and says whether to record it: a reading is
// recorded once it repeats (a runtime's init process, say runc's, holds
// every capability for the moment before it applies the container's
// settings, and must not read as the container) or after three differing
// readings in a row (a cgroup whose processes keep changing).
func (w *postureWatch) observe(path string, p audit.Posture) (record, joined bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.roots == nil {
		w.roots = map[string]*postureRoot{}
	}
	r := w.roots[path]
	if r == nil {
		w.roots[path] = &postureRoot{latest: p}
		return false, false
	}
	prev := r.latest
	r.latest = p
	if r.recorded != nil && posture.Same(*r.recorded, p) {
		r.differs = 0
		return false, false
	}
	r.differs++
	if !posture.Same(prev, p) && r.differs < 3 {
		return false, false
	}
	joined = r.recorded == nil
	r.recorded, r.differs = &p, 0
	return true, joined
}

// recorded is the posture last recorded for a root (nil before the
// first): what the ledger says, so status never shows a passing state.
func (w *postureWatch) recorded(path string) *audit.Posture {
	w.mu.Lock()
	defer w.mu.Unlock()
	if r := w.roots[path]; r != nil && r.recorded != nil {
		p := *r.recorded
		return &p
	}
	return nil
}

// forget drops roots that are gone.
func (w *postureWatch) forget(keep map[string]bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for p := range w.roots {
		if !keep[p] {
			delete(w.roots, p)
		}
	}
}

func (a *Agent) watchPosture(ctx context.Context) {
	a.metrics.Registry.MustRegister(&postureCollector{a: a})
	r, err := posture.NewReader()
	if err != nil {
		a.emit(audit.Event{Kind: audit.KindAgent, Verdict: audit.VerdictRecorded, Severity: audit.SeverityAlert,
			Message: "posture of the sandboxes' cgroups is not read: " + err.Error()})
		return
	}
	// watcher exec leaves, and the canary's probes (internal/canary).
	r.SkipDir = func(name string) bool {
		return strings.HasPrefix(name, "exec-") || strings.HasPrefix(name, canary.LeafPrefix)
	}
	t := time.NewTicker(postureInterval)
	defer t.Stop()
	for {
		a.readPostures(r)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// readPostures reads every root once and records what changed.
func (a *Agent) readPostures(r *posture.Reader) {
	pol := a.Policy()
	a.mu.Lock()
	roots := make(map[uint64]root, len(a.roots))
	for id, rt := range a.roots {
		roots[id] = *rt
	}
	a.mu.Unlock()
	keep := map[string]bool{}
	for id, rt := range roots {
		sb := pol.Sandbox(rt.sandbox)
		if sb == nil {
			continue
		}
		keep[rt.path] = true
		rel := relOf(rt.path)
		p, err := r.Cgroup(rt.path, rel, sb.Workspace)
		if err != nil {
			continue // the cgroup went away; the watcher reports it
		}
		posture.Check(&p, sb.Require)
		record, joined := a.posture.observe(rt.path, p)
		if !record {
			continue
		}
		when := "changed"
		if joined {
			when = "on join"
		}
		ev := audit.Event{Kind: audit.KindPosture, Verdict: audit.VerdictRecorded, Severity: audit.SeverityRoutine,
			Mechanism: "posture", Sandbox: audit.Sandbox{Name: rt.sandbox, CgroupID: id}, Posture: &p,
			Message: fmt.Sprintf("posture of %s %s: %s", describeCgroup(&p), when, posture.Summary(&p))}
		if len(p.Missing) > 0 {
			ev.Severity = audit.SeverityAlert
			ev.Message = fmt.Sprintf("%s lacks required %s (sandbox %s); %s", describeCgroup(&p), strings.Join(p.Missing, ", "),
				rt.sandbox, posture.Summary(&p))
		}
		a.emit(ev)
	}
	a.posture.forget(keep)
}

func describeCgroup(p *audit.Posture) string {
	if p.Container != "" {
		return fmt.Sprintf("container %.12s (%s)", p.Container, p.Cgroup)
	}
	return "cgroup " + p.Cgroup
}

// postureCollector exports, per sandbox and required item, how many of the
// sandbox's cgroups lack it at their last recorded posture (0 when none
// does; absent for items the sandbox does not require).
type postureCollector struct{ a *Agent }

var descPostureMissing = prometheus.NewDesc("watcher_posture_missing",
	"Cgroups of the sandbox lacking a hardening item its policy requires (require:), at their last recorded posture.",
	[]string{"sandbox", "requirement"}, nil)

func (c *postureCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descPostureMissing }

func (c *postureCollector) Collect(ch chan<- prometheus.Metric) {
	pol := c.a.Policy()
	for i := range pol.Sandboxes {
		sb := &pol.Sandboxes[i]
		if len(sb.Require) == 0 {
			continue
		}
		lacking := map[string]int{}
		for _, r := range c.a.rootsOf(sb.Name) {
			if p := c.a.posture.recorded(r.path); p != nil {
				for _, m := range p.Missing {
					lacking[m]++
				}
			}
		}
		for _, req := range sb.Require {
			ch <- prometheus.MustNewConstMetric(descPostureMissing, prometheus.GaugeValue, float64(lacking[string(req)]), sb.Name, string(req))
		}
	}
}
