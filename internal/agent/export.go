package agent

import (
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/ledger"
	"github.com/watcherhq/watcher/internal/otlpexport"
	"github.com/watcherhq/watcher/internal/policy"
)

// exportCloseWait bounds how long Stop spends sending what the exporters
// hold; what is left is a loss record (stage export:NAME:shutdown).
const exportCloseWait = 5 * time.Second

// ExportConfigs translates the policy's agent.export section.
func ExportConfigs(pol *policy.Policy) []otlpexport.Config {
	var out []otlpexport.Config
	for _, x := range pol.Agent.Export {
		c := otlpexport.Config{Name: x.Name, Protocol: x.Protocol, Endpoint: x.Endpoint, Insecure: x.Insecure,
			CAFile: x.TLS.CAFile, CertFile: x.TLS.CertFile, KeyFile: x.TLS.KeyFile, ServerName: x.TLS.ServerName,
			Headers: x.Headers, BatchRecords: x.BatchRecords, BatchInterval: x.BatchInterval.Duration,
			BufferRecords: x.BufferRecords, RateLimit: x.RateLimit, RateBurst: x.RateBurst,
			Filter: otlpexport.Filter{Sandboxes: x.Filter.Sandboxes, MinSeverity: audit.Severity(x.Filter.MinSeverity)}}
		for _, k := range x.Filter.Kinds {
			c.Filter.Kinds = append(c.Filter.Kinds, audit.Kind(k))
		}
		for _, v := range x.Filter.Verdicts {
			c.Filter.Verdicts = append(c.Filter.Verdicts, audit.Verdict(v))
		}
		out = append(out, c)
	}
	return out
}

// startExport starts the policy's OTLP exporters on the ledger's tap:
// they see every record in sequence order, after redaction, with its
// sequence number and leaf hash.
func (a *Agent) startExport(pol *policy.Policy) error {
	cfgs := ExportConfigs(pol)
	if len(cfgs) == 0 {
		return nil
	}
	for i, c := range cfgs {
		// Beside the ledger directory (which holds only the ledger's
		// files): where the Collector's acknowledgements reached.
		c.CursorFile = filepath.Join(filepath.Dir(filepath.Clean(pol.Agent.LedgerDir)), "export-"+c.Name+".cursor")
		x, err := otlpexport.New(c, a.ledger, a.emit)
		if err != nil {
			a.stopExport()
			return err
		}
		if d := pol.Agent.Export[i].MetricsInterval.Duration; d > 0 {
			x.SetMetrics(a.metrics.Registry, d)
		}
		a.exporters = append(a.exporters, x)
	}
	exps := a.exporters
	// Resuming reads the records before the tap from the files: write
	// them out first.
	if err := a.ledger.Sync(); err != nil {
		a.emit(audit.Event{Kind: audit.KindAgent, Verdict: audit.VerdictRecorded, Severity: audit.SeverityAlert,
			Message: "export: ledger sync before resuming: " + err.Error()})
	}
	start, prefix := a.ledger.Tap(func(t ledger.Tapped) {
		for _, x := range exps {
			x.Tap(t)
		}
	})
	for _, x := range exps {
		x.Begin(start, prefix)
	}
	a.metrics.Registry.MustRegister(exportCollector{exps})
	return nil
}

// stopExport sends a final checkpoint and what the exporters hold, then
// takes them off the ledger's tap. Call it before the pipeline closes.
func (a *Agent) stopExport() {
	if len(a.exporters) == 0 {
		return
	}
	if _, err := a.ledger.Checkpoint(); err != nil {
		a.emit(audit.Event{Kind: audit.KindAgent, Verdict: audit.VerdictRecorded, Severity: audit.SeverityAlert,
			Message: "export: final checkpoint: " + err.Error()})
	}
	for _, x := range a.exporters {
		x.Close(exportCloseWait)
	}
	a.ledger.Tap(nil)
	a.exporters = nil
}

// Exporters returns the running OTLP exporters.
func (a *Agent) Exporters() []*otlpexport.Exporter { return a.exporters }

// exportCollector exposes the exporters' counters on /metrics.
type exportCollector struct{ exps []*otlpexport.Exporter }

var (
	exportRecordsDesc = prometheus.NewDesc("watcher_export_records_total",
		"Ledger records per OTLP exporter and outcome: sent, filtered, throttled, dropped (buffer full), rejected (by the collector).",
		[]string{"exporter", "outcome"}, nil)
	exportQueuedDesc = prometheus.NewDesc("watcher_export_queued_records",
		"Records an OTLP exporter holds, waiting for the collector.", []string{"exporter"}, nil)
	exportFailuresDesc = prometheus.NewDesc("watcher_export_failures_total",
		"Failed OTLP export requests (retried).", []string{"exporter"}, nil)
)

func (c exportCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- exportRecordsDesc
	ch <- exportQueuedDesc
	ch <- exportFailuresDesc
}

func (c exportCollector) Collect(ch chan<- prometheus.Metric) {
	for _, x := range c.exps {
		st := x.Stats()
		for outcome, n := range map[string]uint64{"sent": st.Sent, "filtered": st.Filtered, "throttled": st.Throttled,
			"dropped": st.Dropped, "rejected": st.Rejected} {
			ch <- prometheus.MustNewConstMetric(exportRecordsDesc, prometheus.CounterValue, float64(n), x.Name(), outcome)
		}
		ch <- prometheus.MustNewConstMetric(exportQueuedDesc, prometheus.GaugeValue, float64(st.Queued), x.Name())
		ch <- prometheus.MustNewConstMetric(exportFailuresDesc, prometheus.CounterValue, float64(st.Failures), x.Name())
	}
}
