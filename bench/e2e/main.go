// Command e2e measures the whole event path end to end: a sandboxed
// workload opens and closes a file in a loop, the real agent binary
// (`watcher run`) records its syscalls through the kernel rings, the reader,
// the fan-out and the ledger, and this program reports kernel events/s
// handled, kernel ring and queue losses (`watcher status --json`, the
// metrics endpoint), and the agent's CPU time and peak RSS (/proc), with the
// workload's open rate without the agent as the baseline of the same run.
// It also appends records like the agent's to a fresh ledger in this
// process, before the agent starts and again beside a last flood round, and
// prints both rates next to the agent's own ledger rate in each round.
//
// Event source: on a host where BPF LSM programs load, routine file-open
// events come from lsm/file_open. Where they cannot load (this project's
// machines), nothing emits routine file-open events: the kill backstop only
// reports opens that match a path rule, and the tracepoints report exec,
// exit and syscalls. The benchmark then uses the sampled syscall stream
// (audit.syscalls: true) as the event source: every openat and close of the
// workload is one kernel event at sample rate 1. It says which in its output.
//
// Run by bench/e2e/run.sh (root). Everything it creates (pin directory,
// cgroups, policy, ledger, sockets) is private and removed at the end.
package main

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/enforce"
)

func main() {
	watcherBin := flag.String("watcher", "", "agent binary (go build ./cmd/watcher)")
	workload := flag.String("workload", "", "workload binary (bench/e2e/openloop)")
	opens := flag.Int("opens", 1_000_000, "opens per round (two syscalls, so two kernel events, each)")
	rounds := flag.Int("rounds", 3, "rounds with the agent")
	rate := flag.Float64("rate", 0, "sandbox audit.sample_rate (0: the agent's default sampling)")
	flag.Parse()
	if *watcherBin == "" || *workload == "" {
		fmt.Fprintln(os.Stderr, "usage: e2e -watcher BIN -workload BIN [-opens N] [-rounds N] [-rate R]")
		os.Exit(2)
	}
	b, err := newBench(*watcherBin, *workload, *rate)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	err = b.run(*opens, *rounds)
	if cerr := b.cleanup(); cerr != nil {
		fmt.Fprintln(os.Stderr, "e2e: cleanup:", cerr)
		if err == nil {
			err = cerr
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
}

type bench struct {
	watcher, workload string
	dir               string // policy, ledger, sockets, the opened file
	pinDir            string
	cgAbs             string // sandbox root cgroup
	policy, target    string
	metrics           string
	agent             *exec.Cmd
	agentLog          *os.File
	leaves            int
}

func newBench(watcherBin, workload string, rate float64) (*bench, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("needs root: the agent loads BPF programs")
	}
	if _, err := cgroupfs.Mountpoint(); err != nil {
		return nil, fmt.Errorf("no cgroup v2 hierarchy: %w", err)
	}
	id := make([]byte, 4)
	rand.Read(id)
	sfx := hex.EncodeToString(id)
	// Not under /tmp: the restricted preset kills execs from /tmp.
	dir, err := os.MkdirTemp("/var/lib", "watcher-bench-e2e-")
	if err != nil {
		return nil, err
	}
	b := &bench{watcher: watcherBin, workload: workload, dir: dir,
		pinDir: "/sys/fs/bpf/watcher-bench-e2e-" + sfx}
	rel := "/watcher-bench-e2e-" + sfx
	if b.cgAbs, err = cgroupfs.Abs(rel); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := cgroupfs.Create(b.cgAbs); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	b.target = filepath.Join(dir, "ws", "file")
	os.MkdirAll(filepath.Dir(b.target), 0o755)
	if err := os.WriteFile(b.target, []byte("x"), 0o644); err != nil {
		return b, err
	}
	// The workload binary runs from the private directory too.
	wl := filepath.Join(dir, "openloop")
	if err := copyFile(workload, wl); err != nil {
		return b, err
	}
	b.workload = wl
	port, err := freePort()
	if err != nil {
		return b, err
	}
	dnsPort, err := freePort()
	if err != nil {
		return b, err
	}
	b.metrics = "127.0.0.1:" + strconv.Itoa(port)
	sampleRate := ""
	if rate > 0 {
		sampleRate = fmt.Sprintf(", sample_rate: %g", rate)
	}
	pol := fmt.Sprintf(`version: 1
agent:
  ledger_dir: %s
  socket_dir: %s
  pin_dir: %s
  metrics_addr: %s
  exec_cgroup: %s
  dns: {listen: "127.0.0.1:%d"}
sandboxes:
  - name: bench
    select: {cgroups: [%s]}
    preset: restricted
    workspace: [%s]
    escape: {enabled: false}
    audit: {file_opens: all, syscalls: true%s}
`, filepath.Join(dir, "ledger"), filepath.Join(dir, "run"), b.pinDir, b.metrics, rel+"-exec", dnsPort, rel,
		filepath.Dir(b.target), sampleRate)
	b.policy = filepath.Join(dir, "policy.yaml")
	return b, os.WriteFile(b.policy, []byte(pol), 0o600)
}

func (b *bench) run(opens, rounds int) error {
	fmt.Printf("e2e: %d opens per round (openat+close: 2 syscalls each), %d rounds, 2 cores\n", opens, rounds)
	fmt.Println("e2e: event source: the sampled syscall stream (audit.syscalls: true). BPF LSM cannot load on" +
		" this host, and nothing else emits routine file_open events (the kill backstop reports only opens" +
		" matching a path rule; tracepoints report exec, exit and syscalls): each syscall is one kernel event.")

	const ledgerRecords = 1_000_000
	alone, err := printLedgerAlone("before the agent", ledgerRecords)
	if err != nil {
		return err
	}
	base1, err := b.workloadRun(opens)
	if err != nil {
		return fmt.Errorf("baseline: %w", err)
	}
	fmt.Printf("baseline (no agent):  %9.0f opens/s  (%.0f syscalls/s)\n", base1.opensPerSec(), 2*base1.opensPerSec())

	if err := b.startAgent(); err != nil {
		return err
	}
	pid := b.agent.Process.Pid
	fmt.Printf("agent started: %s\n", memLine(pid))
	var results []roundResult
	for i := 0; i < rounds; i++ {
		r, err := b.agentRound(pid, opens)
		if err != nil {
			return fmt.Errorf("round %d: %w", i+1, err)
		}
		results = append(results, r)
		fmt.Printf("round %d: %9.0f kernel events/s handled (%d events in %.3fs, drained %.3fs after the workload),"+
			" workload %9.0f opens/s (%.2fx slower than baseline), agent CPU %.2fs = %.0f%% of a core, %.0f ns/event;"+
			" the agent's ledger %9.0f records/s\n",
			i+1, r.eventsPerSec(), r.events, r.span.Seconds(), (r.span - r.work.elapsed).Seconds(),
			r.work.opensPerSec(), base1.opensPerSec()/r.work.opensPerSec(), r.cpu.Seconds(),
			100*r.cpu.Seconds()/r.span.Seconds(), float64(r.cpu.Nanoseconds())/float64(max(r.events, 1)),
			float64(r.records)/r.span.Seconds())
	}
	// The ledger's own rate again, while the agent records a flood on the
	// same two cores.
	type rateResult struct {
		rate float64
		err  error
	}
	during := make(chan rateResult, 1)
	go func() {
		r, err := ledgerAlone(ledgerRecords)
		during <- rateResult{r, err}
	}()
	if _, err := b.agentRound(pid, opens); err != nil {
		return fmt.Errorf("flood round: %w", err)
	}
	dr := <-during
	if dr.err != nil {
		return fmt.Errorf("ledger during a flood: %w", dr.err)
	}
	fmt.Printf("ledger append alone (during a flood round): %9.0f records/s, %.2f of the rate before the agent\n",
		dr.rate, dr.rate/alone)
	// Losses are turned into loss events once a second.
	time.Sleep(1500 * time.Millisecond)
	st, err := b.status()
	if err != nil {
		return err
	}
	hwm, _ := procStatusKB(pid, "VmHWM")
	mem := memLine(pid)
	lossLines, _ := b.metricLines("loss")
	if err := b.stopAgent(); err != nil {
		return err
	}
	// The pinned programs keep recording after the agent stops: unpin
	// before the second baseline.
	if err := enforce.Unpin(b.pinDir); err != nil {
		return fmt.Errorf("unpin: %w", err)
	}
	base2, err := b.workloadRun(opens)
	if err != nil {
		return fmt.Errorf("baseline: %w", err)
	}
	fmt.Printf("baseline again:       %9.0f opens/s\n", base2.opensPerSec())

	best := results[0]
	for _, r := range results {
		if r.eventsPerSec() > best.eventsPerSec() {
			best = r
		}
	}
	var lost uint64
	keys := []string{}
	for k, v := range st.Losses {
		lost += v
		keys = append(keys, fmt.Sprintf("%s=%d", k, v))
	}
	if len(keys) == 0 {
		keys = append(keys, "none")
	}
	fmt.Printf("losses (status --json): %s\n", strings.Join(keys, " "))
	if len(lossLines) > 0 {
		fmt.Printf("losses (metrics endpoint):\n  %s\n", strings.Join(lossLines, "\n  "))
	}
	fmt.Printf("agent memory: VmHWM %.1f MiB (peak RSS); at the end: %s\n", float64(hwm)/1024, mem)
	fmt.Printf("ledger: %d records\n", st.Ledger.Records)
	fmt.Printf("summary: best %.0f kernel events/s handled (target 500000: %s), peak RSS %.1f MiB (target 128: %s),"+
		" lost %d (target 0: %s); events/s over baseline syscalls/s = %.2f\n",
		best.eventsPerSec(), okIf(best.eventsPerSec() >= 500000), float64(hwm)/1024, okIf(hwm <= 128*1024),
		lost, okIf(lost == 0), best.eventsPerSec()/(2*base1.opensPerSec()))
	return nil
}

func okIf(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}

type workResult struct {
	opens   int
	elapsed time.Duration // as the workload measured it
}

func (w workResult) opensPerSec() float64 { return float64(w.opens) / w.elapsed.Seconds() }

type roundResult struct {
	work    workResult
	events  uint64        // sandbox events the agent counted in the round
	records uint64        // records the agent's ledger appended in the round
	span    time.Duration // workload start to the last event handled
	cpu     time.Duration // agent user+system CPU in the round
}

func (r roundResult) eventsPerSec() float64 { return float64(r.events) / r.span.Seconds() }

// workloadRun runs the workload in a fresh leaf cgroup of the sandbox.
func (b *bench) workloadRun(opens int) (workResult, error) {
	b.leaves++
	leaf := filepath.Join(b.cgAbs, fmt.Sprintf("run%d", b.leaves))
	if err := cgroupfs.Create(leaf); err != nil {
		return workResult{}, err
	}
	fd, err := os.Open(leaf)
	if err != nil {
		return workResult{}, err
	}
	defer fd.Close()
	cmd := exec.Command(b.workload, b.target, strconv.Itoa(opens))
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(fd.Fd())}
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		return workResult{}, fmt.Errorf("workload: %v: %s", err, out)
	}
	var n int
	var secs float64
	if _, err := fmt.Sscanf(strings.TrimSpace(string(out)), "opens=%d seconds=%f", &n, &secs); err != nil {
		return workResult{}, fmt.Errorf("workload output %q: %w", out, err)
	}
	return workResult{opens: n, elapsed: time.Duration(secs * float64(time.Second))}, nil
}

// agentRound runs the workload once with the agent and waits until the
// agent's count of the sandbox's events stops growing.
func (b *bench) agentRound(pid, opens int) (roundResult, error) {
	before, err := b.sandboxEvents()
	if err != nil {
		return roundResult{}, err
	}
	st0, err := b.status()
	if err != nil {
		return roundResult{}, err
	}
	cpu0, err := procCPU(pid)
	if err != nil {
		return roundResult{}, err
	}
	start := time.Now()
	w, err := b.workloadRun(opens)
	if err != nil {
		return roundResult{}, err
	}
	// Drained when the count has not moved for 300 ms (the reader's poll
	// deadline is 50 ms); lastChange is when it last grew.
	last, lastChange := before, time.Now()
	for time.Since(lastChange) < 300*time.Millisecond {
		time.Sleep(20 * time.Millisecond)
		n, err := b.sandboxEvents()
		if err != nil {
			return roundResult{}, err
		}
		if n != last {
			last, lastChange = n, time.Now()
		}
	}
	cpu1, err := procCPU(pid)
	if err != nil {
		return roundResult{}, err
	}
	st1, err := b.status()
	if err != nil {
		return roundResult{}, err
	}
	return roundResult{work: w, events: last - before, records: st1.Ledger.Records - st0.Ledger.Records,
		span: lastChange.Sub(start), cpu: cpu1 - cpu0}, nil
}

func (b *bench) startAgent() error {
	log, err := os.Create(filepath.Join(b.dir, "agent.log"))
	if err != nil {
		return err
	}
	b.agentLog = log
	cmd := exec.Command(b.watcher, "run", "--policy", b.policy, "--quiet")
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return err
	}
	b.agent = cmd
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := b.status(); err == nil {
			return nil
		}
		select {
		case <-exited:
			b.agent = nil
			return fmt.Errorf("agent exited at start:\n%s", b.logTail())
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("agent did not come up:\n%s", b.logTail())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (b *bench) stopAgent() error {
	if b.agent == nil {
		return nil
	}
	p := b.agent.Process
	b.agent = nil
	p.Signal(syscall.SIGTERM)
	for i := 0; i < 300; i++ {
		if err := p.Signal(syscall.Signal(0)); err != nil {
			return nil
		}
		if s, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.Pid)); strings.Contains(string(s), ") Z ") {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	p.Kill()
	return fmt.Errorf("agent did not stop on SIGTERM:\n%s", b.logTail())
}

func (b *bench) logTail() string {
	data, _ := os.ReadFile(filepath.Join(b.dir, "agent.log"))
	if len(data) > 4000 {
		data = data[len(data)-4000:]
	}
	return string(data)
}

// cleanup stops the agent, unpins, removes the cgroups and the directory.
func (b *bench) cleanup() error {
	var errs []error
	errs = append(errs, b.stopAgent())
	if b.agentLog != nil {
		b.agentLog.Close()
	}
	errs = append(errs, enforce.Unpin(b.pinDir))
	for _, cg := range []string{b.cgAbs, b.cgAbs + "-exec"} {
		errs = append(errs, cgroupfs.Remove(cg))
	}
	errs = append(errs, os.RemoveAll(b.dir))
	return errors.Join(errs...)
}

type status struct {
	Sandboxes []struct {
		Name   string            `json:"name"`
		Events map[string]uint64 `json:"events"`
	} `json:"sandboxes"`
	Losses map[string]uint64 `json:"losses"`
	Ledger struct {
		Records uint64 `json:"records"`
	} `json:"ledger"`
}

func (b *bench) status() (*status, error) {
	out, err := exec.Command(b.watcher, "status", "--json", "--socket", filepath.Join(b.dir, "run", "control.sock")).Output()
	if err != nil {
		return nil, fmt.Errorf("watcher status: %w", err)
	}
	var s status
	if err := json.Unmarshal(out, &s); err != nil {
		return nil, fmt.Errorf("watcher status --json: %w", err)
	}
	return &s, nil
}

// sandboxEvents is the agent's count of the bench sandbox's events (all
// verdicts).
func (b *bench) sandboxEvents() (uint64, error) {
	s, err := b.status()
	if err != nil {
		return 0, err
	}
	var n uint64
	for _, sb := range s.Sandboxes {
		if sb.Name == "bench" {
			for _, v := range sb.Events {
				n += v
			}
		}
	}
	return n, nil
}

// metricLines returns the metrics endpoint's sample lines containing word.
func (b *bench) metricLines(word string) ([]string, error) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + b.metrics + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out []string
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 8<<20))
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, "#") && strings.Contains(l, word) {
			out = append(out, l)
		}
	}
	return out, sc.Err()
}

// procCPU is a process's user plus system CPU time (/proc/PID/stat fields
// 14 and 15, in clock ticks of 1/100 s on Linux).
func procCPU(pid int) (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	f := strings.Fields(s[i+1:]) // f[0] is field 3 (state)
	if len(f) < 13 {
		return 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	return time.Duration(ut+st) * 10 * time.Millisecond, nil
}

// memLine describes a process's resident memory: anonymous (Go heap and
// stacks), file-backed and shared (ring buffer mappings count here).
func memLine(pid int) string {
	var parts []string
	for _, k := range []string{"VmRSS", "RssAnon", "RssFile", "RssShmem"} {
		if v, err := procStatusKB(pid, k); err == nil {
			parts = append(parts, fmt.Sprintf("%s %.1f MiB", k, float64(v)/1024))
		}
	}
	return strings.Join(parts, ", ")
}

// procStatusKB reads a "Key: N kB" line of /proc/PID/status.
func procStatusKB(pid int, key string) (uint64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, key+":"); ok {
			return strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		}
	}
	return 0, fmt.Errorf("%s not in /proc/%d/status", key, pid)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func copyFile(src, dst string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, data, 0o755)
}
