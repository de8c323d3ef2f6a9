// Package metrics exports watcher's counters to Prometheus. Names follow
// Prometheus conventions: the watcher_ prefix, _total for counters, base
// units (seconds, bytes).
package metrics

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/pipeline"
)

// Metrics holds watcher's collectors in their own registry. It is also the
// pipeline's counting sink: the one place events and losses are counted,
// read by /metrics (at scrape) and by `watcher status` (EventsBySandbox,
// LossesByStage) alike.
type Metrics struct {
	Registry *prometheus.Registry

	// Counters of the event pipeline (Consume) kept as Prometheus series.
	DNSDecisions *prometheus.CounterVec
	Info         *prometheus.GaugeVec
	// The self-test's results (internal/canary), counted from the
	// record of each run (Consume, KindCanary with a CanaryDetail).
	canaryFailures *prometheus.CounterVec
	canaryRuns     *prometheus.CounterVec
	canaryLastRun  *prometheus.GaugeVec

	mu     sync.Mutex
	events atomic.Value // map[eventKey]*atomic.Uint64, copied on write
	losses sync.Map     // stage -> *atomic.Uint64
}

// New registers every collector, plus process and Go runtime collectors.
func New() *Metrics {
	m := &Metrics{Registry: prometheus.NewRegistry()}
	m.DNSDecisions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "watcher_dns_decisions_total", Help: "DNS proxy decisions, by sandbox, decision and reason.",
	}, []string{"sandbox", "decision", "reason"})
	m.Info = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "watcher_enforcement_layer", Help: "1 for each rule and the layer enforcing it on this kernel.",
	}, []string{"rule", "layer"})
	m.canaryFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "watcher_canary_failures_total", Help: "Canary checks whose result differed from the policy (a forbidden operation that worked, an allowed one refused, an event that never reached the ledger), by sandbox and check (PATH/CHECK).",
	}, []string{"sandbox", "check"})
	m.canaryRuns = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "watcher_canary_runs_total", Help: "Canary runs, by sandbox.",
	}, []string{"sandbox"})
	m.canaryLastRun = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "watcher_canary_last_run_timestamp_seconds", Help: "Unix time of the sandbox's last canary run.",
	}, []string{"sandbox"})
	m.Registry.MustRegister(m.DNSDecisions, m.Info, m.canaryFailures, m.canaryRuns, m.canaryLastRun,
		&countsCollector{m: m},
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		collectors.NewGoCollector())
	return m
}

// Name implements pipeline.Sink.
func (m *Metrics) Name() string { return "metrics" }

// Consume counts one event (pipeline.Sink): the event and loss counters
// come from the pipeline only. It never fails.
func (m *Metrics) Consume(e *audit.Event) (pipeline.Decision, error) {
	m.counter(eventKey{e.Sandbox.Name, e.Kind, e.Verdict, e.Sandbox.Labels[audit.LabelCanary] != ""}).Add(e.Count())
	switch e.Kind {
	case audit.KindDNS:
		reason := ""
		if e.DNS != nil {
			reason = e.DNS.Reason
		}
		m.DNSDecisions.WithLabelValues(e.Sandbox.Name, string(e.Verdict), reason).Inc()
	case audit.KindCanary:
		if e.Canary != nil {
			m.countCanary(e)
		}
	case audit.KindLoss:
		if e.Loss != nil {
			v, ok := m.losses.Load(e.Loss.Stage)
			if !ok {
				v, _ = m.losses.LoadOrStore(e.Loss.Stage, new(atomic.Uint64))
			}
			v.(*atomic.Uint64).Add(e.Loss.Count)
		}
	}
	return pipeline.Decision{}, nil
}

// countCanary counts a canary run from its record.
func (m *Metrics) countCanary(e *audit.Event) {
	m.canaryRuns.WithLabelValues(e.Sandbox.Name).Inc()
	m.canaryLastRun.WithLabelValues(e.Sandbox.Name).Set(float64(e.Time.Unix()))
	for _, c := range e.Canary.Checks {
		f := m.canaryFailures.WithLabelValues(e.Sandbox.Name, c.Name)
		if c.OK {
			f.Add(0) // the series exists from the first run: increase() sees the first failure
			continue
		}
		f.Inc()
	}
}

// Notify counts one event (audit.Sink).
func (m *Metrics) Notify(e audit.Event) error {
	_, err := m.Consume(&e)
	return err
}

// eventKey is one event counter: a watcher_events_total series, split by
// whether the canary's probes caused the events (status leaves those out;
// /metrics adds both halves into one series).
type eventKey struct {
	sandbox string
	kind    audit.Kind
	verdict audit.Verdict
	canary  bool
}

// counter returns the counter of k from a copy-on-write map: lookups take
// no lock; a new key (rare: sandboxes, kinds and verdicts are few) copies
// the map.
func (m *Metrics) counter(k eventKey) *atomic.Uint64 {
	counts, _ := m.events.Load().(map[eventKey]*atomic.Uint64)
	if c, ok := counts[k]; ok {
		return c
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	old, _ := m.events.Load().(map[eventKey]*atomic.Uint64)
	if c, ok := old[k]; ok {
		return c
	}
	next := make(map[eventKey]*atomic.Uint64, len(old)+1)
	for k2, v := range old {
		next[k2] = v
	}
	c := new(atomic.Uint64)
	next[k] = c
	m.events.Store(next)
	return c
}

// EventsBySandbox returns the events counted so far for each named sandbox,
// by verdict, without the canary's probes (what `watcher status` shows). A
// sandbox with events has all four verdicts, zero or not.
func (m *Metrics) EventsBySandbox() map[string]map[audit.Verdict]uint64 {
	out := map[string]map[audit.Verdict]uint64{}
	counts, _ := m.events.Load().(map[eventKey]*atomic.Uint64)
	for k, c := range counts {
		if k.sandbox == "" || k.canary {
			continue
		}
		byVerdict := out[k.sandbox]
		if byVerdict == nil {
			byVerdict = map[audit.Verdict]uint64{audit.VerdictAllowed: 0, audit.VerdictRecorded: 0, audit.VerdictDenied: 0, audit.VerdictKilled: 0}
			out[k.sandbox] = byVerdict
		}
		byVerdict[k.verdict] += c.Load()
	}
	return out
}

// LossesByStage returns the events the agent knows it lost, by stage.
func (m *Metrics) LossesByStage() map[string]uint64 {
	out := map[string]uint64{}
	m.losses.Range(func(k, v any) bool { out[k.(string)] = v.(*atomic.Uint64).Load(); return true })
	return out
}

var (
	descEvents = prometheus.NewDesc("watcher_events_total", "Events seen, by sandbox, kind and verdict (before sampling).", []string{"sandbox", "kind", "verdict"}, nil)
	descLosses = prometheus.NewDesc("watcher_losses_total", "Events the agent knows it lost, by stage.", []string{"stage"}, nil)
)

// countsCollector exports the pipeline's counts at scrape time.
type countsCollector struct{ m *Metrics }

func (c *countsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descEvents
	ch <- descLosses
}

func (c *countsCollector) Collect(ch chan<- prometheus.Metric) {
	type series struct {
		sandbox string
		kind    audit.Kind
		verdict audit.Verdict
	}
	sum := map[series]uint64{}
	counts, _ := c.m.events.Load().(map[eventKey]*atomic.Uint64)
	for k, v := range counts {
		sum[series{k.sandbox, k.kind, k.verdict}] += v.Load()
	}
	for s, n := range sum {
		ch <- prometheus.MustNewConstMetric(descEvents, prometheus.CounterValue, float64(n), s.sandbox, string(s.kind), string(s.verdict))
	}
	for stage, n := range c.m.LossesByStage() {
		ch <- prometheus.MustNewConstMetric(descLosses, prometheus.CounterValue, float64(n), stage)
	}
}

// Close implements io.Closer.
func (m *Metrics) Close() error { return nil }

// Serve exposes /metrics on addr until the returned server is closed.
func (m *Metrics) Serve(addr string) (*http.Server, net.Addr, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("metrics listen %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			_ = err // the agent notices through its health checks
		}
	}()
	return srv, ln.Addr(), nil
}

// Sources are the state the agent's other parts own, read at scrape time
// (never pushed): the ledger's counters, escape scores, frozen sandboxes.
type Sources struct {
	// Ledger returns records and bytes appended, and the last checkpoint's
	// time (zero before the first).
	Ledger func() (records, bytes uint64, checkpoint time.Time)
	// EscapeScores returns each sandbox's current escape score.
	EscapeScores func() map[string]float64
	// Frozen says, per sandbox, whether the escape watch keeps a cgroup of
	// it frozen.
	Frozen func() map[string]bool
}

// Pull registers the collector reading src at every scrape.
func (m *Metrics) Pull(src Sources) {
	m.Registry.MustRegister(&pullCollector{src: src})
}

var (
	descLedgerRecords = prometheus.NewDesc("watcher_ledger_records_total", "Records appended to the ledger.", nil, nil)
	descLedgerBytes   = prometheus.NewDesc("watcher_ledger_bytes_total", "Bytes appended to the ledger.", nil, nil)
	descCheckpoint    = prometheus.NewDesc("watcher_ledger_last_checkpoint_timestamp_seconds", "Unix time of the last signed checkpoint.", nil, nil)
	descEscapeScore   = prometheus.NewDesc("watcher_escape_score", "Escape-attempt score over the sliding window, by sandbox (the highest of its leaves).", []string{"sandbox"}, nil)
	descFrozen        = prometheus.NewDesc("watcher_sandbox_frozen", "1 while the escape watch keeps a cgroup of the sandbox frozen.", []string{"sandbox"}, nil)
)

type pullCollector struct{ src Sources }

func (c *pullCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descLedgerRecords, descLedgerBytes, descCheckpoint, descEscapeScore, descFrozen} {
		ch <- d
	}
}

func (c *pullCollector) Collect(ch chan<- prometheus.Metric) {
	if c.src.Ledger != nil {
		records, bytes, cp := c.src.Ledger()
		ch <- prometheus.MustNewConstMetric(descLedgerRecords, prometheus.CounterValue, float64(records))
		ch <- prometheus.MustNewConstMetric(descLedgerBytes, prometheus.CounterValue, float64(bytes))
		if !cp.IsZero() {
			ch <- prometheus.MustNewConstMetric(descCheckpoint, prometheus.GaugeValue, float64(cp.Unix()))
		}
	}
	if c.src.EscapeScores != nil {
		for sb, v := range c.src.EscapeScores() {
			ch <- prometheus.MustNewConstMetric(descEscapeScore, prometheus.GaugeValue, v, sb)
		}
	}
	if c.src.Frozen != nil {
		for sb, frozen := range c.src.Frozen() {
			v := 0.0
			if frozen {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(descFrozen, prometheus.GaugeValue, v, sb)
		}
	}
}
