package enforce_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/backstop"
	"github.com/watcherhq/watcher/internal/enforce/enforcetest"
	"github.com/watcherhq/watcher/internal/enforce/trace"
)

// stormHelper builds the getpid storm generator once per benchmark. It is a
// separate binary: the test binary links cilium/ebpf, whose init calls
// bpf(2), which the backstop kills in a sandbox.
func stormHelper(b *testing.B) string {
	b.Helper()
	bin := filepath.Join(b.TempDir(), "trhelper")
	build := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", bin, "./trace/testdata/trhelper")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("build helper: %v\n%s", err, out)
	}
	return bin
}

// BenchmarkReaderEvents measures the kernel-to-Go event path: a sandboxed
// process calls getpid b.N times under a record-all rule, and the
// enforce.Reader decodes and delivers every event. It reports events/s and
// the losses at each stage (ring reservations, the reader's queue).
//
//   - alert: a backstop syscall rule in record mode (alert ring; events are
//     completed at sys_exit with the return value);
//   - routine: the trace syscall stream at 1 in 1 (routine ring).
func BenchmarkReaderEvents(b *testing.B) {
	bin := stormHelper(b)
	b.Run("alert", func(b *testing.B) {
		benchStorm(b, bin, func(eng *enforce.Engine, r *enforce.Reader) func() {
			bs, err := backstop.Load(eng)
			if err != nil {
				b.Fatal(err)
			}
			rules := backstop.Rules{Syscalls: []backstop.SyscallRule{{Name: "getpid", Rule: backstop.Rule{Action: enforce.ActionRecord, ID: 1}}}}
			if err := bs.SetRules(rules); err != nil {
				b.Fatal(err)
			}
			if err := bs.Attach(); err != nil {
				b.Fatal(err)
			}
			backstop.Register(r)
			return func() { bs.Close(); backstop.Detach(eng.PinDir()) }
		}, audit.KindSyscall, audit.VerdictRecorded)
	})
	b.Run("routine", func(b *testing.B) {
		benchStorm(b, bin, func(eng *enforce.Engine, r *enforce.Reader) func() {
			tr, err := trace.Load(eng)
			if err != nil {
				b.Fatal(err)
			}
			if err := tr.SetConfig(trace.Config{SampleEvery: 1}); err != nil {
				b.Fatal(err)
			}
			if err := tr.Attach(trace.AttachOptions{Syscalls: true}); err != nil {
				b.Fatal(err)
			}
			trace.Register(r)
			return func() { tr.Close(); trace.Detach(eng.PinDir()) }
		}, audit.KindSyscall, audit.VerdictAllowed)
	})
}

func benchStorm(b *testing.B, bin string, setup func(*enforce.Engine, *enforce.Reader) func(), kind audit.Kind, verdict audit.Verdict) {
	eng := enforcetest.Engine(b)
	sb := enforcetest.Cgroup(b, "sb")
	if _, err := eng.AddSandbox(sb, 1, 0); err != nil {
		b.Fatal(err)
	}
	r := eng.NewReader(enforce.ReaderOptions{})
	cleanup := setup(eng, r)
	defer cleanup()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	var got atomic.Uint64
	var last atomic.Int64
	go func() {
		for ev := range r.Events() {
			if ev.Kind == kind && ev.Verdict == verdict && ev.Syscall != nil && ev.Syscall.Nr == 39 {
				got.Add(1)
				last.Store(time.Now().UnixNano())
			}
		}
	}()
	n := max(b.N, 1000)
	leaf := enforcetest.Child(b, sb, "storm")
	cmd := enforcetest.Command(b, leaf, bin, "getpid", fmt.Sprint(n))
	b.ResetTimer()
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("storm: %v\n%s", err, out)
	}
	deadline := time.Now().Add(10 * time.Second)
	for got.Load() < uint64(n) && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	b.StopTimer()
	cancel()
	<-done
	elapsed := time.Duration(last.Load() - start.UnixNano())
	st := r.Stats()
	b.ReportMetric(float64(got.Load())/elapsed.Seconds(), "events/s")
	b.ReportMetric(float64(st.RingAlert), "alert-ring-lost")
	b.ReportMetric(float64(st.RingRoutine), "routine-ring-lost")
	b.ReportMetric(float64(st.QueueDrops), "queue-lost")
	if got.Load() < uint64(n) {
		b.Logf("delivered %d of %d events (ring lost alert %d routine %d, queue %d)", got.Load(), n, st.RingAlert, st.RingRoutine, st.QueueDrops)
	}
}
