package agent

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/escape"
	"github.com/watcherhq/watcher/internal/metrics"
	"github.com/watcherhq/watcher/internal/pipeline"
)

// newPipeline is the agent's event path, in order (see package pipeline):
// the kernel reader has decoded and folded; enrich and redact once; then
// the sinks, the ledger first (it samples, and does not redact again).
// Sinks return decisions (the escape watch's freeze), carried out by
// decide. The metrics sink is the one counter of events and losses:
// /metrics and `watcher status` both read it; the rest of /metrics is read
// at scrape time.
func (a *Agent) newPipeline() *pipeline.Pipeline {
	p := pipeline.New(
		[]pipeline.Stage{
			{Name: "enrich", Run: pipeline.Enrich(a.enrich)},
			{Name: "redact", Run: pipeline.Redact},
		},
		pipeline.LedgerSink{Ledger: a.ledger},
		pipeline.Notifier{SinkName: "tail", Sink: a.tail},
		a.metrics,
		escapeSink{a.escape},
	)
	if a.opts.OnEvent != nil {
		p.Add(pipeline.SinkFunc{SinkName: "log", Fn: func(ev *audit.Event) { a.opts.OnEvent(*ev) }})
	}
	p.Decide = a.decide
	a.metrics.Pull(metrics.Sources{
		Ledger: func() (uint64, uint64, time.Time) {
			st := a.ledger.Stats()
			var at time.Time
			if cp := a.ledger.LastCheckpoint(); cp != nil {
				at = cp.Time
			}
			return st.Records, st.Bytes, at
		},
		EscapeScores: a.escape.Scores,
		Frozen:       a.frozenBySandbox,
	})
	return p
}

// enrich is the agent's part of the enrich stage (pipeline.Enrich sets
// the defaults first). Kernel events arrive as decoded (ids, the kernel's
// verdict and severity): sandbox and rule ids are named here, from the
// plan in force and the agent's rule table.
func (a *Agent) enrich(ev *audit.Event) {
	if ev.RuleID != 0 {
		if name := a.rules.Name(ev.RuleID); name != "" {
			ev.Rule = name
		}
	}
	if ev.Sandbox.Name == "" && ev.Sandbox.ID != 0 {
		ev.Sandbox.Name = a.sandboxName(ev.Sandbox.ID)
	}
	if ev.Sandbox.Name == "" && ev.Sandbox.CgroupID != 0 {
		a.mu.Lock()
		if r := a.roots[ev.Sandbox.CgroupID]; r != nil {
			ev.Sandbox.Name = r.sandbox
		}
		a.mu.Unlock()
	}
	if label := a.labelOf(ev.Process.CgroupID); label != "" {
		ev.Sandbox.Labels = map[string]string{"label": label}
	}
	if ev.Sandbox.CgroupID != 0 {
		if id, ok := a.ctrLabels.Load(ev.Sandbox.CgroupID); ok {
			// A copy: the producer's map may be shared.
			labels := maps.Clone(ev.Sandbox.Labels)
			if labels == nil {
				labels = map[string]string{}
			}
			maps.Copy(labels, id.(map[string]string))
			ev.Sandbox.Labels = labels
		}
	}
	if check := a.canaryCheckOf(ev); check != "" {
		if ev.Sandbox.Labels == nil {
			ev.Sandbox.Labels = map[string]string{}
		}
		ev.Sandbox.Labels[audit.LabelCanary] = check
	}
}

// decide carries out a sink's decision and returns the events that record
// it.
func (a *Agent) decide(d pipeline.Decision) []audit.Event {
	switch v := d.Value.(type) {
	case *escape.Decision:
		return []audit.Event{a.escaped(v)}
	}
	return nil
}

// frozenBySandbox is the watcher_sandbox_frozen gauge's source.
func (a *Agent) frozenBySandbox() map[string]bool {
	out := map[string]bool{}
	for _, sb := range a.Policy().Sandboxes {
		out[sb.Name] = a.frozen.any(sb.Name)
	}
	return out
}

// labelOf returns the `watcher exec` label of a leaf cgroup, from its name
// (exec-LABEL-RANDOM), looked up once per cgroup.
func (a *Agent) labelOf(cg uint64) string {
	if cg == 0 {
		return ""
	}
	if v, ok := a.labels.Load(cg); ok {
		return v.(string)
	}
	label := ""
	a.mu.Lock()
	var parents []string
	for _, r := range a.roots {
		parents = append(parents, r.path)
	}
	a.mu.Unlock()
	for _, p := range parents {
		entries, _ := os.ReadDir(p)
		for _, e := range entries {
			if !e.IsDir() || !strings.HasPrefix(e.Name(), "exec-") {
				continue
			}
			if id, err := cgroupfs.ID(filepath.Join(p, e.Name())); err == nil && id == cg {
				label = leafLabel(e.Name())
			}
		}
	}
	a.labels.Store(cg, label)
	return label
}

// periodic turns dropped tail clients into loss events (the tail server
// counts them; the loss record says events were missed by a live client).
func (a *Agent) periodic(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	var tailDrops uint64
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := a.syncRecording(); err != nil {
			a.emit(audit.Event{Kind: audit.KindAgent, Verdict: audit.VerdictRecorded, Severity: audit.SeverityAlert,
				Message: "syscall tracepoints for exec refusals: " + err.Error()})
		}
		if d := a.tail.DroppedClients(); d > tailDrops {
			a.emit(audit.Event{Kind: audit.KindLoss, Verdict: audit.VerdictRecorded, Severity: audit.SeverityAlert,
				Mechanism: "agent", Loss: &audit.LossDetail{Stage: "tail_client", Count: d - tailDrops},
				Message: "live tail clients dropped for falling behind (the ledger is complete)"})
			tailDrops = d
		}
	}
}
