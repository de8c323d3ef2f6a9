package agent

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/cgroupfs"
)

// BenchmarkEventPath measures the agent's own cost per kernel event on the
// whole path in one process (so -cpuprofile sees it): a sandboxed
// openat+close loop (bench/e2e/openloop) under the sampled syscall stream
// at 1 in 1, each syscall one kernel event, through the reader's decode,
// the pipeline (enrich, redact) and every sink (ledger with its sampling
// and hash chain, tail, metrics, status, escape watch). It reports the
// agent's CPU per event (user+system of this process, which does nothing
// else meanwhile) and the workload's slowdown against the same loop with
// no agent, run first (bare).
//
//	sudo EVENTPATH_PROFILE=/tmp/cpu.out go test -run '^$' -bench EventPath -benchtime 2000000x ./internal/agent
//	go tool pprof -top /tmp/cpu.out
func BenchmarkEventPath(b *testing.B) {
	dir := b.TempDir()
	loop := filepath.Join(dir, "openloop")
	build := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", loop, "../../bench/e2e/openloop")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("build openloop: %v\n%s", err, out)
	}
	a, cg := startTestAgent(b, func(cg string) string {
		return fmt.Sprintf(`  - name: bench
    select: {cgroups: [%s]}
    preset: restricted
    escape: {enabled: false}
    audit: {file_opens: all, syscalls: true}
`, cg)
	})
	ws := filepath.Dir(a.opts.Policy.Agent.LedgerDir)
	target := filepath.Join(ws, "file")
	if err := os.WriteFile(target, []byte("x"), 0o644); err != nil {
		b.Fatal(err)
	}
	prog := filepath.Join(ws, "openloop") // not under /tmp (restricted preset)
	if data, err := os.ReadFile(loop); err != nil {
		b.Fatal(err)
	} else if err := os.WriteFile(prog, data, 0o755); err != nil {
		b.Fatal(err)
	}
	root, err := cgroupfs.Abs(cg)
	if err != nil {
		b.Fatal(err)
	}
	if err := cgroupfs.Create(root); err != nil {
		b.Fatal(err)
	}
	runs := 0
	run := func(parent string, n int) time.Duration {
		runs++
		leaf := filepath.Join(parent, fmt.Sprintf("run%d", runs))
		if err := cgroupfs.Create(leaf); err != nil {
			b.Fatal(err)
		}
		fd, err := os.Open(leaf)
		if err != nil {
			b.Fatal(err)
		}
		defer fd.Close()
		cmd := exec.Command(prog, target, strconv.Itoa(n))
		cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(fd.Fd())}
		out, err := cmd.CombinedOutput()
		for try := 0; errors.Is(err, syscall.ETXTBSY) && try < 50; try++ {
			// A child forked elsewhere in the process while the program
			// was being written still holds the write descriptor.
			time.Sleep(20 * time.Millisecond)
			cmd = exec.Command(prog, target, strconv.Itoa(n))
			cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(fd.Fd())}
			out, err = cmd.CombinedOutput()
		}
		if err != nil {
			b.Fatalf("openloop: %v\n%s", err, out)
		}
		var got int
		var secs float64
		if _, err := fmt.Sscanf(strings.TrimSpace(string(out)), "opens=%d seconds=%f", &got, &secs); err != nil {
			b.Fatalf("openloop output %q: %v", out, err)
		}
		return time.Duration(secs * float64(time.Second))
	}
	n := max(b.N/2, 1000) // two events per open
	outside, err := cgroupfs.Abs(cg + "-bare")
	if err != nil {
		b.Fatal(err)
	}
	if err := cgroupfs.Create(outside); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cgroupfs.Remove(outside) })
	bare := run(outside, n)
	// Wait until the agent has registered the sandbox root.
	for deadline := time.Now().Add(10 * time.Second); a.sandboxEvents() == 0 && time.Now().Before(deadline); {
		run(root, 10)
		time.Sleep(100 * time.Millisecond)
	}
	before := a.sandboxEvents()
	if before == 0 {
		b.Fatal("the agent saw no event of the sandbox")
	}
	drain := func() uint64 {
		last, lastChange := a.sandboxEvents(), time.Now()
		for time.Since(lastChange) < 300*time.Millisecond {
			time.Sleep(20 * time.Millisecond)
			if v := a.sandboxEvents(); v != last {
				last, lastChange = v, time.Now()
			}
		}
		return last
	}
	before = drain()
	// EVENTPATH_PROFILE=FILE profiles the measured window only (the
	// test's -cpuprofile also sees program loading and set-up).
	if path := os.Getenv("EVENTPATH_PROFILE"); path != "" {
		f, err := os.Create(path)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			b.Fatal(err)
		}
	}
	cpu0 := processCPU()
	led0 := a.ledger.Stats()
	b.ResetTimer()
	caged := run(root, n)
	after := drain()
	b.StopTimer()
	pprof.StopCPUProfile()
	cpu := processCPU() - cpu0
	got := after - before
	led := a.ledger.Stats()
	b.ReportMetric(float64(led.Records-led0.Records)/float64(max(got, 1)), "ledger-records/event")
	b.ReportMetric(float64(led.Bytes-led0.Bytes)/float64(max(led.Records-led0.Records, 1)), "bytes/record")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(max(got, 1)), "agent-cpu-ns/event")
	b.ReportMetric(float64(got), "events")
	b.ReportMetric(caged.Seconds()/bare.Seconds(), "workload-vs-bare")
	if keep := os.Getenv("EVENTPATH_KEEP_SEGMENT"); keep != "" {
		// The open segment, for offline study of what the ledger writes.
		segs, _ := filepath.Glob(filepath.Join(a.opts.Policy.Agent.LedgerDir, "seg-*.jsonl"))
		if len(segs) > 0 {
			if data, err := os.ReadFile(segs[len(segs)-1]); err == nil {
				os.WriteFile(keep, data, 0o600)
			}
		}
	}
	st := a.Status()
	var lost uint64
	for _, v := range st.Losses {
		lost += v
	}
	b.ReportMetric(float64(lost), "lost")
	var ru unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &ru)
	b.ReportMetric(float64(ru.Maxrss)/1024, "peak-rss-MiB")
}

// sandboxEvents is the pipeline's count of the bench sandbox's events
// (what status shows).
func (a *Agent) sandboxEvents() uint64 {
	var n uint64
	for _, v := range a.metrics.EventsBySandbox()["bench"] {
		n += v
	}
	return n
}

// processCPU is this process's user and system CPU time.
func processCPU() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
