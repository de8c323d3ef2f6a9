// Command syscall measures what watcher's tracepoint programs cost on a
// syscall loop (openat+close, stat, getpid): bare, inside a sandbox with the
// kill backstop (default rules) and the recording programs attached, and
// outside any sandbox while they are attached; plus each attach mechanism
// alone (empty tp_btf, raw_tp and per-syscall tracepoint programs). All
// configurations are measured in the same run, interleaved over several
// rounds; the median per configuration is compared with bare.
//
// Run as root: go run ./bench/syscall [-rounds 5] [-iters 200000]
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/backstop"
	"github.com/watcherhq/watcher/internal/enforce/recorder"
	"github.com/watcherhq/watcher/internal/enforce/rules/backstoprules"
	"github.com/watcherhq/watcher/internal/testkit/syscallbench"
)

var (
	loopBin   string
	progTime  bool
	beforeObj string
	cpuClock  bool
)

type config struct {
	name   string
	where  string // "bare", "inside", "outside"
	attach func() ([]link.Link, error)
	// rules, when set, replace DefaultRules for this configuration's runs.
	rules *backstoprules.Rules
	// timed are the syscall programs whose run time -progtime reads.
	timed []*ebpf.Program
}

func main() {
	rounds := flag.Int("rounds", 5, "interleaved rounds per configuration (median reported)")
	iters := flag.Int("iters", 200000, "iterations per op per run")
	flag.BoolVar(&progTime, "progtime", false, "also report the backstop's sys_enter+sys_exit run time per loop iteration and the verdict cache's hits (kernel BPF statistics, which add their own cost to every program run)")
	flag.StringVar(&beforeObj, "before", "", "another build of the backstop object (e.g. main's internal/enforce/backstop/backstop_x86_bpfel.o, run.sh -before REV builds it): its outside and inside rows are measured interleaved with this tree's")
	flag.BoolVar(&cpuClock, "cpu", false, "time each operation by the loop thread's CPU clock, not the wall clock: on a loaded host the time the loop waits for a CPU does not count")
	flag.StringVar(&loopBin, "loop", "", "the loop binary (go build ./bench/syscall/loop); it must not link cilium/ebpf, whose init calls bpf(2), which the backstop kills in a sandbox")
	flag.Parse()
	if loopBin == "" {
		fmt.Fprintln(os.Stderr, "bench: -loop is required (bench/syscall/run.sh builds it)")
		os.Exit(2)
	}
	if err := run(*rounds, *iters); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(rounds, iters int) error {
	if os.Geteuid() != 0 {
		return errors.New("needs root (loads BPF programs, creates cgroups)")
	}
	if err := enforce.EnsureBPFFS("/sys/fs/bpf"); err != nil {
		return err
	}
	pinDir := fmt.Sprintf("/sys/fs/bpf/watcher-bench-%d", os.Getpid())
	eng, err := enforce.Open(enforce.Options{PinDir: pinDir})
	if err != nil {
		return err
	}
	defer enforce.Unpin(pinDir)
	defer eng.Close()

	root, err := cgroupfs.Mountpoint()
	if err != nil {
		return err
	}
	base := filepath.Join(root, fmt.Sprintf("watcher-bench-%d", os.Getpid()))
	sandbox, outside := filepath.Join(base, "sandbox"), filepath.Join(base, "outside")
	for _, p := range []string{sandbox, outside} {
		if err := cgroupfs.Create(p); err != nil {
			return err
		}
	}
	defer cgroupfs.Remove(base)
	if _, err := eng.AddSandbox(sandbox, 1, 0); err != nil {
		return err
	}

	file := filepath.Join(os.TempDir(), fmt.Sprintf("watcher-bench-%d", os.Getpid()))
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		return err
	}
	defer os.Remove(file)

	bs, err := backstop.Load(eng)
	if err != nil {
		return err
	}
	defer bs.Close()
	if err := bs.SetRules(backstop.DefaultRules()); err != nil {
		return err
	}
	tr, err := recorder.Load(eng)
	if err != nil {
		return err
	}
	defer tr.Close()
	if err := tr.SetConfig(recorder.Config{ModuleAlerts: true}); err != nil {
		return err
	}
	var probes probesObjects
	if err := loadProbesObjects(&probes, eng.CollectionOptions()); err != nil {
		return err
	}
	defer probes.Close()

	tracing := func(progs ...*ebpf.Program) func() ([]link.Link, error) {
		return func() ([]link.Link, error) {
			var ls []link.Link
			for _, p := range progs {
				l, err := link.AttachTracing(link.TracingOptions{Program: p})
				if err != nil {
					closeAll(ls)
					return nil, err
				}
				ls = append(ls, l)
			}
			return ls, nil
		}
	}
	rawTP := func() ([]link.Link, error) {
		var ls []link.Link
		for name, p := range map[string]*ebpf.Program{"sys_enter": probes.EmptyRawTpEnter, "sys_exit": probes.EmptyRawTpExit} {
			l, err := link.AttachRawTracepoint(link.RawTracepointOptions{Name: name, Program: p})
			if err != nil {
				closeAll(ls)
				return nil, err
			}
			ls = append(ls, l)
		}
		return ls, nil
	}
	perSyscall := func() ([]link.Link, error) {
		var ls []link.Link
		for name, p := range map[string]*ebpf.Program{"sys_enter_openat": probes.EmptyTpOpenatEnter, "sys_exit_openat": probes.EmptyTpOpenatExit} {
			l, err := link.Tracepoint("syscalls", name, p, nil)
			if err != nil {
				closeAll(ls)
				return nil, fmt.Errorf("%w (is tracefs mounted at /sys/kernel/tracing?)", err)
			}
			ls = append(ls, l)
		}
		return ls, nil
	}
	_, noCtime := bs.Missing()[backstop.ProgCtimeXchg]
	attached := tracing(backstopProgs(bs)...)
	// cache turns the verdict cache on or off, then attaches.
	cache := func(on bool) func() ([]link.Link, error) {
		return func() ([]link.Link, error) {
			if err := bs.SetVerdictCache(on && !noCtime); err != nil {
				return nil, err
			}
			return attached()
		}
	}
	full := cache(true)
	fullWithTrace := func() ([]link.Link, error) {
		ls, err := full()
		if err != nil {
			return nil, err
		}
		more, err := tr.AttachLinks()
		if err != nil {
			closeAll(ls)
			return nil, err
		}
		return append(ls, more...), nil
	}
	// getpid killed in another sandbox (id 2): the sandbox measured has no
	// rule for it, so its getpid passes the host-wide gate and pays the
	// per-sandbox lookups (its own entry, then the every-sandbox set's:
	// both miss) before it is allowed, the most a syscall ruled only
	// elsewhere costs.
	elsewhere := backstop.DefaultRules()
	elsewhere.Sandboxes = map[uint32]backstoprules.SandboxRules{2: {Syscalls: []backstoprules.SyscallRule{
		{Name: "getpid", Rule: backstoprules.Rule{Action: enforce.ActionKill, ID: 1}}}}}
	configs := []config{
		{"bare", "bare", nil, nil, nil},
		{"empty tp_btf sys_enter+exit", "outside", tracing(probes.EmptyTpBtfEnter, probes.EmptyTpBtfExit), nil,
			[]*ebpf.Program{probes.EmptyTpBtfEnter, probes.EmptyTpBtfExit}},
		{"empty raw_tp sys_enter+exit", "outside", rawTP, nil, nil},
		{"empty tracepoint sys_{enter,exit}_openat", "outside", perSyscall, nil, nil},
		{"backstop, outside", "outside", full, nil, syscallProgs(bs)},
		{"backstop, inside, no verdict cache", "inside", cache(false), nil, syscallProgs(bs)},
		{"backstop, inside", "inside", full, nil, syscallProgs(bs)},
		{"backstop, inside, getpid ruled elsewhere", "inside", full, &elsewhere, syscallProgs(bs)},
		{"backstop+trace, outside", "outside", fullWithTrace, nil, syscallProgs(bs)},
		{"backstop+trace, inside", "inside", fullWithTrace, nil, syscallProgs(bs)},
	}
	if beforeObj != "" {
		// The other object's programs share this engine's pinned maps
		// (rules, verdict cache control), so the rules set above and
		// SetVerdictCache apply to both.
		before, err := backstop.LoadObject(eng, beforeObj)
		if err != nil {
			return err
		}
		defer before.Close()
		beforeFull := func() ([]link.Link, error) {
			if err := bs.SetVerdictCache(!noCtime); err != nil {
				return nil, err
			}
			return tracing(backstopProgs(before)...)()
		}
		configs = append(configs[:5], append([]config{
			{"before: backstop, outside", "outside", beforeFull, nil, syscallProgs(before)},
			{"before: backstop, inside", "inside", beforeFull, nil, syscallProgs(before)},
		}, configs[5:]...)...)
	}
	// Run time of the backstop's syscall programs per loop iteration (all
	// three ops), by configuration: the programs' own cost, less exposed
	// to scheduling noise than the loop's wall time.
	progNS := map[string][]float64{}
	cacheHits, cacheStores := map[string]uint64{}, map[string]uint64{}
	runTime := func(progs []*ebpf.Program) time.Duration {
		var d time.Duration
		for _, p := range progs {
			if st, err := p.Stats(); err == nil {
				d += st.Runtime
			}
		}
		return d
	}
	if progTime {
		stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
		if err != nil {
			return fmt.Errorf("enable BPF statistics: %w", err)
		}
		defer stats.Close()
	}
	results := map[string]map[string][]float64{}
	skipped := map[string]error{}
	for r := 0; r < rounds; r++ {
		for _, c := range configs {
			if skipped[c.name] != nil {
				continue
			}
			if c.rules != nil {
				if err := bs.SetRules(*c.rules); err != nil {
					return fmt.Errorf("%s: %w", c.name, err)
				}
			}
			var ls []link.Link
			if c.attach != nil {
				if ls, err = c.attach(); err != nil {
					skipped[c.name] = err
					continue
				}
			}
			cg := ""
			switch c.where {
			case "inside":
				cg = sandbox
			case "outside":
				cg = outside
			}
			t0 := runTime(c.timed)
			h0, s0, _ := bs.VerdictCacheStats()
			res, err := runLoop(cg, iters, file)
			progNS[c.name] = append(progNS[c.name], float64(runTime(c.timed)-t0)/float64(iters))
			h1, s1, _ := bs.VerdictCacheStats()
			cacheHits[c.name] += h1 - h0
			cacheStores[c.name] += s1 - s0
			closeAll(ls)
			if c.rules != nil {
				if err := bs.SetRules(backstop.DefaultRules()); err != nil {
					return fmt.Errorf("%s: restore rules: %w", c.name, err)
				}
			}
			if err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
			if results[c.name] == nil {
				results[c.name] = map[string][]float64{}
			}
			for op, v := range res {
				results[c.name][op] = append(results[c.name][op], v)
			}
		}
	}
	clock := "wall clock"
	if cpuClock {
		clock = "thread CPU clock"
	}
	fmt.Printf("kernel %s, %d rounds x %d iterations, median ns/op (%s) and ratio to bare (same run)\n\n", syscallbench.KernelRelease(), rounds, iters, clock)
	fmt.Printf("%-42s", "configuration")
	for _, op := range syscallbench.Ops {
		fmt.Printf(" %22s", op)
	}
	fmt.Println()
	bare := results["bare"]
	for _, c := range configs {
		if err := skipped[c.name]; err != nil {
			fmt.Printf("%-42s skipped: %v\n", c.name, err)
			continue
		}
		fmt.Printf("%-42s", c.name)
		for _, op := range syscallbench.Ops {
			m, b := syscallbench.Median(results[c.name][op]), syscallbench.Median(bare[op])
			fmt.Printf(" %12.0f ns %6.3fx", m, m/b)
		}
		fmt.Println()
	}
	if progTime {
		fmt.Printf("\nsys_enter+sys_exit run time per loop iteration (openat+close, stat, getpid), median\n")
		for _, c := range configs {
			if skipped[c.name] == nil && c.timed != nil {
				fmt.Printf("%-42s %8.0f ns  verdict cache: %d hits, %d stores\n", c.name, syscallbench.Median(progNS[c.name]), cacheHits[c.name], cacheStores[c.name])
			}
		}
	}
	return nil
}

// backstopProgs lists b's programs as Attach attaches them: the
// inode-change programs too (the verdict cache's name generation), where
// this kernel has them.
func backstopProgs(b *backstop.Backstop) []*ebpf.Program {
	var progs []*ebpf.Program
	for _, name := range []string{backstop.ProgSysEnter, backstop.ProgSysExit, backstop.ProgPrepareExec,
		backstop.ProgIOUringSubmit, backstop.ProgFork, backstop.ProgCgroupAttach,
		backstop.ProgCtimeSet, backstop.ProgCtimeXchg, backstop.ProgCtimeSkip} {
		if p := b.Program(name); p != nil {
			progs = append(progs, p)
		}
	}
	return progs
}

// syscallProgs are b's sys_enter and sys_exit programs.
func syscallProgs(b *backstop.Backstop) []*ebpf.Program {
	return []*ebpf.Program{b.Program(backstop.ProgSysEnter), b.Program(backstop.ProgSysExit)}
}

// runLoop runs the loop in a child started directly in cgroup cg ("" for
// the bench's own cgroup).
func runLoop(cg string, iters int, file string) (syscallbench.Result, error) {
	args := []string{fmt.Sprint(iters), file}
	if cpuClock {
		args = append(args, "cpu")
	}
	cmd := exec.Command(loopBin, args...)
	if cg != "" {
		// A fresh leaf per run (cgroup.kill quirk, and clean accounting).
		leaf := filepath.Join(cg, fmt.Sprintf("run-%d", time.Now().UnixNano()))
		if err := cgroupfs.Create(leaf); err != nil {
			return nil, err
		}
		defer cgroupfs.Remove(leaf)
		fd, err := os.Open(leaf)
		if err != nil {
			return nil, err
		}
		defer fd.Close()
		cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(fd.Fd())}
	}
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("loop: %w", err)
	}
	return syscallbench.Parse(out)
}

func closeAll(ls []link.Link) {
	for _, l := range ls {
		l.Close()
	}
}
