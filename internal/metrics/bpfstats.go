package metrics

import (
	"errors"
	"io"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
)

// BPFStats exports the kernel's per-program run time and run count for
// watcher's programs: those that use the shared sandbox map.
type BPFStats struct {
	sandboxMap ebpf.MapID
	stats      io.Closer
	runTime    *prometheus.Desc
	runs       *prometheus.Desc
}

// NewBPFStats turns on the kernel's BPF run-time statistics (they cost a
// little per program run, so only while the agent runs) and returns a
// collector for the programs using sandboxMap. Register it with Registry.
func NewBPFStats(sandboxMap *ebpf.Map) (*BPFStats, error) {
	info, err := sandboxMap.Info()
	if err != nil {
		return nil, err
	}
	id, ok := info.ID()
	if !ok {
		return nil, errors.New("bpf stats: map id unavailable")
	}
	closer, err := ebpf.EnableStats(unix.BPF_STATS_RUN_TIME)
	if err != nil {
		return nil, err
	}
	return &BPFStats{sandboxMap: id, stats: closer,
		runTime: prometheus.NewDesc("watcher_bpf_prog_run_seconds_total", "Time the kernel spent running each watcher BPF program.", []string{"prog"}, nil),
		runs:    prometheus.NewDesc("watcher_bpf_prog_runs_total", "Runs of each watcher BPF program.", []string{"prog"}, nil),
	}, nil
}

// Describe implements prometheus.Collector.
func (s *BPFStats) Describe(ch chan<- *prometheus.Desc) { ch <- s.runTime; ch <- s.runs }

// Collect implements prometheus.Collector: it walks the kernel's programs
// and reports those that use the sandbox map.
func (s *BPFStats) Collect(ch chan<- prometheus.Metric) {
	seen := map[string][2]float64{}
	var id ebpf.ProgramID
	for {
		next, err := ebpf.ProgramGetNextID(id)
		if err != nil {
			break
		}
		id = next
		p, err := ebpf.NewProgramFromID(id)
		if err != nil {
			continue
		}
		info, err := p.Info()
		var st *ebpf.ProgramStats
		if err == nil {
			st, err = p.Stats()
		}
		p.Close()
		if err != nil {
			continue
		}
		maps, _ := info.MapIDs()
		if !slices.Contains(maps, s.sandboxMap) {
			continue
		}
		v := seen[info.Name]
		seen[info.Name] = [2]float64{v[0] + st.Runtime.Seconds(), v[1] + float64(st.RunCount)}
	}
	for name, v := range seen {
		ch <- prometheus.MustNewConstMetric(s.runTime, prometheus.CounterValue, v[0], name)
		ch <- prometheus.MustNewConstMetric(s.runs, prometheus.CounterValue, v[1], name)
	}
}

// Close turns the statistics off again (when no one else holds them on).
func (s *BPFStats) Close() error { return s.stats.Close() }
