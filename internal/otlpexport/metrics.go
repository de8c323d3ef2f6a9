package otlpexport

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	colmetrics "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	common "go.opentelemetry.io/proto/otlp/common/v1"
	metrics "go.opentelemetry.io/proto/otlp/metrics/v1"
)

// SetMetrics makes the exporter send g's metrics (the agent's Prometheus
// registry) as OTLP metrics every interval, cumulative, so a failed send
// loses nothing the next one does not carry. Call before Begin.
func (e *Exporter) SetMetrics(g prometheus.Gatherer, interval time.Duration) {
	e.gatherer, e.metricsEvery = g, interval
}

// metricsLoop sends the metrics until Close.
func (e *Exporter) metricsLoop() {
	defer close(e.metricsDone)
	t := time.NewTicker(e.metricsEvery)
	defer t.Stop()
	start := time.Now()
	for {
		select {
		case <-e.stop:
			return
		case <-t.C:
		}
		err := e.sendMetrics(context.Background(), start)
		e.mu.Lock()
		if err != nil {
			e.stats.MetricFailures++
			e.stats.LastError = err.Error()
		} else {
			e.stats.MetricExports++
		}
		e.mu.Unlock()
	}
}

func (e *Exporter) sendMetrics(ctx context.Context, start time.Time) error {
	fams, err := e.gatherer.Gather()
	if err != nil && len(fams) == 0 {
		return fmt.Errorf("gather metrics: %w", err)
	}
	req := metricsRequest(e.res, fams, start, time.Now())
	ctx, cancel := context.WithTimeout(ctx, e.cfg.Timeout)
	defer cancel()
	return e.tr.exportMetrics(ctx, req)
}

// metricsRequest converts Prometheus metric families to OTLP metrics:
// counters become monotonic cumulative sums, gauges and untyped gauges,
// histograms explicit-bucket histograms, summaries summaries; labels
// become data point attributes.
func metricsRequest(r resource, fams []*dto.MetricFamily, start, now time.Time) *colmetrics.ExportMetricsServiceRequest {
	t0, t1 := uint64(start.UnixNano()), uint64(now.UnixNano())
	var ms []*metrics.Metric
	for _, f := range fams {
		m := &metrics.Metric{Name: f.GetName(), Description: f.GetHelp()}
		switch f.GetType() {
		case dto.MetricType_COUNTER:
			var pts []*metrics.NumberDataPoint
			for _, p := range f.Metric {
				pts = append(pts, &metrics.NumberDataPoint{Attributes: labels(p), StartTimeUnixNano: t0, TimeUnixNano: t1,
					Value: &metrics.NumberDataPoint_AsDouble{AsDouble: p.GetCounter().GetValue()}})
			}
			m.Data = &metrics.Metric_Sum{Sum: &metrics.Sum{DataPoints: pts, IsMonotonic: true,
				AggregationTemporality: metrics.AggregationTemporality_AGGREGATION_TEMPORALITY_CUMULATIVE}}
		case dto.MetricType_GAUGE, dto.MetricType_UNTYPED:
			var pts []*metrics.NumberDataPoint
			for _, p := range f.Metric {
				v := p.GetGauge().GetValue()
				if f.GetType() == dto.MetricType_UNTYPED {
					v = p.GetUntyped().GetValue()
				}
				pts = append(pts, &metrics.NumberDataPoint{Attributes: labels(p), TimeUnixNano: t1,
					Value: &metrics.NumberDataPoint_AsDouble{AsDouble: v}})
			}
			m.Data = &metrics.Metric_Gauge{Gauge: &metrics.Gauge{DataPoints: pts}}
		case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
			var pts []*metrics.HistogramDataPoint
			for _, p := range f.Metric {
				h := p.GetHistogram()
				dp := &metrics.HistogramDataPoint{Attributes: labels(p), StartTimeUnixNano: t0, TimeUnixNano: t1,
					Count: h.GetSampleCount()}
				sum := h.GetSampleSum()
				dp.Sum = &sum
				var prev uint64
				for _, b := range h.Bucket {
					if math.IsInf(b.GetUpperBound(), 1) {
						continue
					}
					dp.ExplicitBounds = append(dp.ExplicitBounds, b.GetUpperBound())
					dp.BucketCounts = append(dp.BucketCounts, b.GetCumulativeCount()-prev)
					prev = b.GetCumulativeCount()
				}
				dp.BucketCounts = append(dp.BucketCounts, h.GetSampleCount()-prev)
				pts = append(pts, dp)
			}
			m.Data = &metrics.Metric_Histogram{Histogram: &metrics.Histogram{DataPoints: pts,
				AggregationTemporality: metrics.AggregationTemporality_AGGREGATION_TEMPORALITY_CUMULATIVE}}
		case dto.MetricType_SUMMARY:
			var pts []*metrics.SummaryDataPoint
			for _, p := range f.Metric {
				s := p.GetSummary()
				dp := &metrics.SummaryDataPoint{Attributes: labels(p), StartTimeUnixNano: t0, TimeUnixNano: t1,
					Count: s.GetSampleCount(), Sum: s.GetSampleSum()}
				for _, q := range s.Quantile {
					dp.QuantileValues = append(dp.QuantileValues, &metrics.SummaryDataPoint_ValueAtQuantile{Quantile: q.GetQuantile(), Value: q.GetValue()})
				}
				pts = append(pts, dp)
			}
			m.Data = &metrics.Metric_Summary{Summary: &metrics.Summary{DataPoints: pts}}
		default:
			continue
		}
		ms = append(ms, m)
	}
	return &colmetrics.ExportMetricsServiceRequest{ResourceMetrics: []*metrics.ResourceMetrics{{
		Resource:     r.r,
		ScopeMetrics: []*metrics.ScopeMetrics{{Scope: &common.InstrumentationScope{Name: scopeName}, Metrics: ms}},
	}}}
}

func labels(m *dto.Metric) []*common.KeyValue {
	var out []*common.KeyValue
	for _, l := range m.Label {
		out = append(out, str(l.GetName(), l.GetValue()))
	}
	return out
}
