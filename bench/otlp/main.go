// Command otlp measures OTLP export against the ledger alone, in one run:
// the same events appended to a ledger with no exporter (baseline), then
// to a ledger whose tap feeds an exporter sending to a real OpenTelemetry
// Collector (test/otelcol) over gRPC and over HTTP. It prints records/s
// until the Collector acknowledged everything and this process's CPU per
// record (the agent side), with ratios against the baseline, and the
// Collector's own CPU per record.
package main

import (
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/ledger"
	"github.com/watcherhq/watcher/internal/otlpexport"
)

func main() {
	collector := flag.String("collector", "", "the test Collector binary (built from test/otelcol)")
	n := flag.Int("n", 200000, "events per run")
	prof := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	flag.Parse()
	if *prof != "" {
		f, err := os.Create(*prof)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	if *collector == "" {
		fmt.Fprintln(os.Stderr, "usage: otlp -collector BIN [-n N]")
		os.Exit(2)
	}
	if err := run(*collector, *n); err != nil {
		pprof.StopCPUProfile()
		fmt.Fprintln(os.Stderr, "otlp bench:", err)
		os.Exit(1)
	}
}

type result struct {
	name      string
	wall      time.Duration
	cpu       time.Duration // this process
	collector time.Duration // the Collector's CPU
}

func run(bin string, n int) error {
	base, err := os.MkdirTemp("", "watcher-otlp-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(base)
	col, err := startCollector(bin, base)
	if err != nil {
		return err
	}
	defer col.stop()
	var rs []result
	for _, mode := range []string{"ledger alone", "ledger + otlp grpc", "ledger + otlp http"} {
		r, err := runOne(mode, filepath.Join(base, strconv.Itoa(len(rs))), n, col)
		if err != nil {
			return fmt.Errorf("%s: %w", mode, err)
		}
		rs = append(rs, r)
	}
	fmt.Printf("%d events per run, GOMAXPROCS default, collector on the same host\n", n)
	fmt.Printf("%-20s %12s %14s %10s %16s %10s\n", "run", "records/s", "agent CPU/rec", "x CPU", "collector CPU/rec", "x wall")
	b := rs[0]
	for _, r := range rs {
		fmt.Printf("%-20s %12.0f %13.2fµs %9.2fx %15.2fµs %9.2fx\n", r.name, float64(n)/r.wall.Seconds(),
			float64(r.cpu.Microseconds())/float64(n), r.cpu.Seconds()/b.cpu.Seconds(),
			float64(r.collector.Microseconds())/float64(n), r.wall.Seconds()/b.wall.Seconds())
	}
	return nil
}

func event(i int) audit.Event {
	return audit.Event{Time: time.Now(), Kind: audit.KindFileOpen, Verdict: audit.VerdictAllowed, Severity: audit.SeverityRoutine,
		Mechanism: "tracepoint", Rule: "workspace-write", Sandbox: audit.Sandbox{Name: "agents", CgroupID: 4242},
		Process: audit.Process{PID: uint32(1000 + i%64), TGID: uint32(1000 + i%64), PPID: 1, UID: 1000, Comm: "python3", Exe: "/usr/bin/python3.12"},
		File:    &audit.FileDetail{Path: fmt.Sprintf("/home/agent/work/src/module_%d.py", i%500), Flags: 0o100}}
}

func runOne(mode, dir string, n int, col *collector) (result, error) {
	led, err := ledger.Open(dir, ledger.Options{})
	if err != nil {
		return result{}, err
	}
	var exp *otlpexport.Exporter
	if mode != "ledger alone" {
		cfg := otlpexport.Config{Name: "bench", Endpoint: col.grpc, Insecure: true, BufferRecords: 1 << 20, BatchInterval: 200 * time.Millisecond}
		if strings.HasSuffix(mode, "http") {
			cfg.Protocol, cfg.Endpoint = otlpexport.ProtocolHTTP, "http://"+col.http
		}
		if exp, err = otlpexport.New(cfg, led, func(ev audit.Event) { led.Append(ev) }); err != nil {
			return result{}, err
		}
		exp.Begin(led.Tap(exp.Tap))
	}
	cpu0, ccpu0 := selfCPU(), col.cpu()
	start := time.Now()
	for i := range n {
		if _, _, err := led.Append(event(i)); err != nil {
			return result{}, err
		}
	}
	if err := led.Sync(); err != nil {
		return result{}, err
	}
	if exp != nil {
		for exp.Stats().Sent < uint64(n) {
			if st := exp.Stats(); st.Dropped+st.Rejected > 0 {
				return result{}, fmt.Errorf("lost records: %+v", st)
			}
			time.Sleep(time.Millisecond)
		}
	}
	r := result{name: mode, wall: time.Since(start), cpu: selfCPU() - cpu0, collector: col.cpu() - ccpu0}
	if exp != nil {
		exp.Close(5 * time.Second)
	}
	return r, led.Close()
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

type collector struct {
	cmd        *exec.Cmd
	grpc, http string
}

func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func startCollector(bin, dir string) (*collector, error) {
	g, err := freePort()
	if err != nil {
		return nil, err
	}
	h, err := freePort()
	if err != nil {
		return nil, err
	}
	cfg := fmt.Sprintf(`receivers:
  otlp:
    protocols:
      grpc: {endpoint: "%s"}
      http: {endpoint: "%s"}
exporters:
  file: {path: "%s"}
service:
  telemetry: {metrics: {level: none}, logs: {level: warn}}
  pipelines:
    logs: {receivers: [otlp], exporters: [file]}
`, g, h, filepath.Join(dir, "logs.json"))
	cfgFile := filepath.Join(dir, "collector.yaml")
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "--config", cfgFile)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &collector{cmd: cmd, grpc: g, http: h}
	deadline := time.Now().Add(30 * time.Second)
	for _, addr := range []string{g, h} {
		for {
			conn, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
			if err == nil {
				conn.Close()
				break
			}
			if time.Now().After(deadline) {
				c.stop()
				return nil, fmt.Errorf("collector did not listen on %s", addr)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return c, nil
}

// cpu reads the Collector's user+system CPU from /proc.
func (c *collector) cpu() time.Duration {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", c.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	s := string(data)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100 // USER_HZ
}

func (c *collector) stop() {
	c.cmd.Process.Signal(syscall.SIGTERM)
	c.cmd.Wait()
}
