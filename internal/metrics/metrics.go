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
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/watcherhq/watcher/internal/audit"
)

// Metrics holds watcher's collectors in their own registry.
type Metrics struct {
	Registry *prometheus.Registry

	Events           *prometheus.CounterVec
	DNSDecisions     *prometheus.CounterVec
	Losses           *prometheus.CounterVec
	LedgerRecords    prometheus.Counter
	LedgerBytes      prometheus.Counter
	LedgerCheckpoint prometheus.Gauge
	EscapeScore      *prometheus.GaugeVec
	Frozen           *prometheus.GaugeVec
	Info             *prometheus.GaugeVec

	mu     sync.Mutex
	closed bool
}

// New registers every collector, plus process and Go runtime collectors.
func New() *Metrics {
	m := &Metrics{Registry: prometheus.NewRegistry()}
	m.Events = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "watcher_events_total", Help: "Events seen, by sandbox, kind and verdict (before sampling).",
	}, []string{"sandbox", "kind", "verdict"})
	m.DNSDecisions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "watcher_dns_decisions_total", Help: "DNS proxy decisions, by sandbox, decision and reason.",
	}, []string{"sandbox", "decision", "reason"})
	m.Losses = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "watcher_losses_total", Help: "Events the agent knows it lost, by stage.",
	}, []string{"stage"})
	m.LedgerRecords = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "watcher_ledger_records_total", Help: "Records appended to the ledger.",
	})
	m.LedgerBytes = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "watcher_ledger_bytes_total", Help: "Bytes appended to the ledger.",
	})
	m.LedgerCheckpoint = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "watcher_ledger_last_checkpoint_timestamp_seconds", Help: "Unix time of the last signed checkpoint.",
	})
	m.EscapeScore = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "watcher_escape_score", Help: "Escape-attempt score over the sliding window, by sandbox.",
	}, []string{"sandbox"})
	m.Frozen = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "watcher_sandbox_frozen", Help: "1 while the sandbox is frozen by the escape watch.",
	}, []string{"sandbox"})
	m.Info = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "watcher_enforcement_layer", Help: "1 for each rule and the layer enforcing it on this kernel.",
	}, []string{"rule", "layer"})
	m.Registry.MustRegister(m.Events, m.DNSDecisions, m.Losses, m.LedgerRecords, m.LedgerBytes,
		m.LedgerCheckpoint, m.EscapeScore, m.Frozen, m.Info,
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		collectors.NewGoCollector())
	return m
}

// Notify counts one event (audit.Sink). It never fails.
func (m *Metrics) Notify(e audit.Event) error {
	sb := e.Sandbox.Name
	m.Events.WithLabelValues(sb, string(e.Kind), string(e.Verdict)).Add(float64(e.Count()))
	switch e.Kind {
	case audit.KindDNS:
		reason := ""
		if e.DNS != nil {
			reason = e.DNS.Reason
		}
		m.DNSDecisions.WithLabelValues(sb, string(e.Verdict), reason).Inc()
	case audit.KindLoss:
		if e.Loss != nil {
			m.Losses.WithLabelValues(e.Loss.Stage).Add(float64(e.Loss.Count))
		}
	}
	return nil
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
