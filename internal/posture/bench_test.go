package posture

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/enforce/enforcetest"
)

// BenchmarkCgroup reads the posture of a cgroup holding 100 processes
// (the agent does this for every sandbox root every 2 s) and reports the
// cost per process and its ratio to the floor: reading each process's
// status file once, measured in the same run.
func BenchmarkCgroup(b *testing.B) {
	enforcetest.RequireRoot(b)
	r, err := NewReader()
	if err != nil {
		b.Fatal(err)
	}
	cg := enforcetest.Cgroup(b, "bench")
	const n = 100
	var pids []int
	for range n {
		cmd := enforcetest.Command(b, cg, "sleep", "1000")
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		pids = append(pids, cmd.Process.Pid)
	}
	floor := func() time.Duration {
		start := time.Now()
		for _, pid := range pids {
			if _, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status")); err != nil {
				b.Fatal(err)
			}
		}
		return time.Since(start)
	}
	// Interleaved, so both see the same load.
	var base, read time.Duration
	for b.Loop() {
		base += floor()
		start := time.Now()
		p, err := r.Cgroup(cg, "/bench", []string{"/tmp"})
		read += time.Since(start)
		if err != nil || p.Procs != n {
			b.Fatalf("procs %d err %v", p.Procs, err)
		}
	}
	b.ReportMetric(float64(read.Microseconds())/float64(b.N)/n, "µs/process")
	b.ReportMetric(float64(read)/float64(base), "x-status-read")
}
