package enforce_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/backstop"
	"github.com/watcherhq/watcher/internal/enforce/enforcetest"
	"github.com/watcherhq/watcher/internal/enforce/recorder"
	"github.com/watcherhq/watcher/internal/enforce/rules/backstoprules"
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
// process calls getpid N times under a record-all rule, and every event is
// read from the ring. Each iteration runs the storm twice:
//
//   - raw: a bare ringbuf.Reader with the same deadline polling only counts
//     the samples (the baseline: ring transport, no decoding);
//   - decoded: the enforce.Reader decodes each sample into an audit.Event
//     and delivers it on its queue, where a consumer checks it.
//
// It reports events/s of the decoded path (first sample read to last event
// delivered, storm included), raw-events/s, their ratio, the storm's own
// rate while the decoded reader runs (producer-events/s), and the losses at
// each stage: kernel ring reservations (alert, routine), the reader's queue,
// decode errors, and events missing at the consumer.
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
			rules := backstoprules.Rules{SandboxRules: backstoprules.SandboxRules{Syscalls: []backstoprules.SyscallRule{{Name: "getpid", Rule: backstoprules.Rule{Action: enforce.ActionRecord, ID: 1}}}}}
			if err := bs.SetRules(rules); err != nil {
				b.Fatal(err)
			}
			if err := bs.Attach(); err != nil {
				b.Fatal(err)
			}
			backstop.Register(r)
			return func() { bs.Close(); backstop.Detach(eng.PinDir()) }
		}, true, audit.KindSyscall, audit.VerdictRecorded)
	})
	b.Run("routine", func(b *testing.B) {
		benchStorm(b, bin, func(eng *enforce.Engine, r *enforce.Reader) func() {
			tr, err := recorder.Load(eng)
			if err != nil {
				b.Fatal(err)
			}
			if err := tr.SetConfig(recorder.Config{SampleEvery: 1}); err != nil {
				b.Fatal(err)
			}
			if err := tr.Attach(recorder.AttachOptions{Syscalls: true}); err != nil {
				b.Fatal(err)
			}
			recorder.Register(r)
			return func() { tr.Close(); recorder.Detach(eng.PinDir()) }
		}, false, audit.KindSyscall, audit.VerdictAllowed)
	})
}

// stormResult is what one storm measured.
type stormResult struct {
	got      uint64        // events seen by the consumer
	span     time.Duration // first sample read to last event seen
	producer time.Duration // the storm process's run time
	cpu      time.Duration // this process's CPU time (reader and consumer)
}

// selfCPU is the user and system CPU time of this process so far: the
// reader's cost per event, which, unlike rates, does not depend on what
// else runs on the machine.
func selfCPU() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func (s stormResult) rate() float64 {
	if s.span <= 0 {
		return 0
	}
	return float64(s.got) / s.span.Seconds()
}

func benchStorm(b *testing.B, bin string, setup func(*enforce.Engine, *enforce.Reader) func(), alert bool, kind audit.Kind, verdict audit.Verdict) {
	b.StopTimer() // loading programs is not the event path
	eng := enforcetest.Engine(b)
	sb := enforcetest.Cgroup(b, "sb")
	if _, err := eng.AddSandbox(sb, 1, 0); err != nil {
		b.Fatal(err)
	}
	r := eng.NewReader(enforce.ReaderOptions{})
	cleanup := setup(eng, r)
	defer cleanup()
	ring := eng.RoutineRing()
	if alert {
		ring = eng.AlertRing()
	}
	n := max(b.N, 1000)
	storm := func(name string) time.Duration {
		leaf := enforcetest.Child(b, sb, name)
		cmd := enforcetest.Command(b, leaf, bin, "getpid", fmt.Sprint(n))
		start := time.Now()
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("storm: %v\n%s", err, out)
		}
		return time.Since(start)
	}
	ringA0, ringR0, _ := eng.RingDrops()

	// Baseline: the raw ring read rate, same storm, no decoding.
	raw := rawRead(b, ring, n, func() time.Duration { return storm("raw") })
	ringA1, ringR1, _ := eng.RingDrops()
	b.StartTimer()

	// The decoded path: enforce.Reader and a consumer.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	cpu0 := selfCPU()
	var got atomic.Uint64
	var first, last atomic.Int64
	consumed := make(chan struct{})
	go func() {
		defer close(consumed)
		for ev := range r.Events() {
			if ev.Kind == kind && ev.Verdict == verdict && ev.Syscall != nil && ev.Syscall.Nr == 39 {
				// Identical alerts arrive folded (audit.RepeatDetail).
				stamp(got.Add(ev.Count()), n, &first, &last)
			}
		}
	}()
	dec := stormResult{producer: storm("decoded")}
	deadline := time.Now().Add(10 * time.Second)
	for got.Load() < uint64(n) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	b.StopTimer()
	cancel()
	<-done
	<-consumed
	dec.cpu = selfCPU() - cpu0
	dec.got = got.Load()
	dec.span = time.Duration(last.Load() - first.Load())
	st := r.Stats()

	b.ReportMetric(dec.rate(), "events/s")
	b.ReportMetric(raw.rate(), "raw-events/s")
	if raw.rate() > 0 {
		b.ReportMetric(dec.rate()/raw.rate(), "decoded/raw")
	}
	b.ReportMetric(float64(n)/dec.producer.Seconds(), "producer-events/s")
	b.ReportMetric(float64(dec.cpu.Nanoseconds())/float64(n), "cpu-ns/event")
	b.ReportMetric(float64(raw.cpu.Nanoseconds())/float64(n), "raw-cpu-ns/event")
	b.ReportMetric(float64(st.RingAlert-ringA1), "alert-ring-lost")
	b.ReportMetric(float64(st.RingRoutine-ringR1), "routine-ring-lost")
	b.ReportMetric(float64(st.QueueDrops), "queue-lost")
	b.ReportMetric(float64(st.DecodeErrors), "decode-errors")
	b.ReportMetric(float64(uint64(n)-min(dec.got, uint64(n))), "missing")
	b.ReportMetric(float64(ringA1-ringA0+ringR1-ringR0), "raw-ring-lost")
	if dec.got < uint64(n) || raw.got < uint64(n) {
		b.Logf("n=%d: decoded got %d (ring lost alert %d routine %d, queue %d, decode errors %d); raw got %d (ring lost %d)",
			n, dec.got, st.RingAlert-ringA1, st.RingRoutine-ringR1, st.QueueDrops, st.DecodeErrors,
			raw.got, ringA1-ringA0+ringR1-ringR0)
	}
}

// stamp records the time of the first and the last (n-th) event, and of
// every 256th so a run with missing events still has a span; reading the
// clock per event would cost more than decoding some of them.
func stamp(count uint64, n int, first, last *atomic.Int64) {
	if count == 1 || count%256 == 0 || count >= uint64(n) {
		now := time.Now().UnixNano()
		first.CompareAndSwap(0, now)
		last.Store(now)
	}
}

// rawRead reads ring with a plain ringbuf.Reader (the same deadline polling
// as enforce.Reader) while run generates n getpid events, counting them.
func rawRead(b *testing.B, ring *ebpf.Map, n int, run func() time.Duration) stormResult {
	rd, err := ringbuf.NewReader(ring)
	if err != nil {
		b.Fatal(err)
	}
	cpu0 := selfCPU()
	var got atomic.Uint64
	var first, last atomic.Int64
	var stop atomic.Bool
	done := make(chan error, 1)
	go func() {
		var rec ringbuf.Record
		for !stop.Load() {
			rd.SetDeadline(time.Now().Add(50 * time.Millisecond))
			for {
				if err := rd.ReadInto(&rec); err != nil {
					if errors.Is(err, os.ErrDeadlineExceeded) {
						break
					}
					done <- err
					return
				}
				if len(rec.RawSample) < enforce.EventHeaderSize {
					continue
				}
				hdr := (*enforce.EventHeader)(unsafe.Pointer(&rec.RawSample[0]))
				if hdr.Kind != enforce.EvSyscall && hdr.Kind != backstop.EvKillSyscall {
					continue
				}
				stamp(got.Add(1), n, &first, &last)
			}
		}
		done <- nil
	}()
	res := stormResult{producer: run()}
	deadline := time.Now().Add(10 * time.Second)
	for got.Load() < uint64(n) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	stop.Store(true)
	if err := <-done; err != nil {
		b.Fatalf("raw read: %v", err)
	}
	rd.Close()
	res.cpu = selfCPU() - cpu0
	res.got = got.Load()
	res.span = time.Duration(last.Load() - first.Load())
	return res
}
