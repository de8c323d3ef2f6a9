package agent

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/control"
	"github.com/watcherhq/watcher/internal/limits"
	"github.com/watcherhq/watcher/internal/policy"
)

var (
	limitsHostOnce sync.Once
	limitsHost     *limits.Host
	limitsHostErr  error
)

func hostLimits() (*limits.Host, error) {
	limitsHostOnce.Do(func() { limitsHost, limitsHostErr = limits.Detect() })
	return limitsHost, limitsHostErr
}

// LimitsOf converts a sandbox's policy limits.
func LimitsOf(p policy.Limits) limits.Limits {
	l := limits.Limits{CPU: p.CPU, Memory: p.Memory.Bytes, MemoryHigh: p.MemoryHigh.Bytes, PIDs: p.PIDs}
	for _, d := range p.IO {
		l.IO = append(l.IO, limits.IOLimit{Device: d.Device, ReadBPS: d.ReadBPS.Bytes, WriteBPS: d.WriteBPS.Bytes, ReadIOPS: d.ReadIOPS, WriteIOPS: d.WriteIOPS})
	}
	return l
}

// relOf is a cgroup2 path relative to the hierarchy root.
func relOf(abs string) string {
	root, err := cgroupfs.Mountpoint()
	if err != nil {
		return abs
	}
	return "/" + strings.TrimPrefix(strings.TrimPrefix(abs, root), "/")
}

// applyLimits writes the sandbox's limits to one of its root cgroups;
// failures are recorded, not fatal (the cage still holds).
func (a *Agent) applyLimits(sandbox, abs string) {
	sb := a.Policy().Sandbox(sandbox)
	if sb == nil {
		return
	}
	lim := LimitsOf(sb.Limits)
	if lim.Zero() {
		return
	}
	h, err := hostLimits()
	var g *limits.Group
	if err == nil {
		// Below the exec cgroup the cgroups are watcher's own; elsewhere
		// (containers) a lower limit the runtime set is kept.
		rel := relOf(abs)
		if own := relOf(a.Policy().Agent.ExecCgroup); rel == own || strings.HasPrefix(rel, strings.TrimSuffix(own, "/")+"/") {
			g, err = h.Apply(rel, lim, false)
		} else {
			g, err = h.ApplyForeign(rel, lim)
		}
	}
	if err != nil {
		a.emit(audit.Event{Kind: audit.KindAgent, Verdict: audit.VerdictRecorded, Severity: audit.SeverityAlert,
			Sandbox: audit.Sandbox{Name: sandbox}, Message: fmt.Sprintf("limits not applied to %s: %v", abs, err)})
		return
	}
	if len(g.Kept) > 0 {
		a.emit(audit.Event{Kind: audit.KindAgent, Verdict: audit.VerdictRecorded, Severity: audit.SeverityRoutine,
			Sandbox: audit.Sandbox{Name: sandbox}, Message: fmt.Sprintf("kept the lower limits already on %s: %s", abs, strings.Join(g.Kept, ", "))})
	}
}

// limitLayers are the layer table's rows for the policy's limits.
func limitLayers(p *policy.Policy) []control.Layer {
	h, err := hostLimits()
	if err != nil {
		return nil
	}
	var out []control.Layer
	seen := map[string]bool{}
	for _, sb := range p.Sandboxes {
		for _, l := range h.Layers(LimitsOf(sb.Limits)) {
			if !seen[l.Limit] {
				seen[l.Limit] = true
				out = append(out, control.Layer{Rule: l.Limit, Mechanism: l.Mechanism, Note: l.Note})
			}
		}
	}
	return out
}

// rootUsage reads a sandbox root's usage against the sandbox's limits.
// The exec cgroup's counts include the hits `watcher exec` recorded for
// its leaves (gone with them on cgroup v1).
func rootUsage(p *policy.Policy, sb *policy.Sandbox, abs string) *control.ResourceUsage {
	h, err := hostLimits()
	if err != nil || sb == nil {
		return nil
	}
	u := h.UsageOf(relOf(abs))
	if exec, err := cgroupfs.Abs(ExecParents(p, sb)[0]); err == nil && exec == abs {
		u.OOMKills += recordedHits(sb.Name, limits.Memory)
		u.PIDsMaxHits += recordedHits(sb.Name, limits.PIDs)
	}
	return &control.ResourceUsage{CPUSeconds: u.CPUSeconds, CPULimit: sb.Limits.CPU, MemoryBytes: u.MemoryBytes, MemoryPeak: u.MemoryPeak,
		MemoryLimit: sb.Limits.Memory.Bytes, PIDs: u.PIDs, PIDsLimit: int64(sb.Limits.PIDs), OOMKills: u.OOMKills, PIDsMaxHits: u.PIDsMaxHits,
		Mechanism: "memory=" + h.Mechanism(limits.Memory) + " cpu=" + h.Mechanism(limits.CPU) + " pids=" + h.Mechanism(limits.PIDs)}
}

// limitHits counts limit events recorded by `watcher exec` per sandbox
// and resource: on cgroup v1 a leaf's counters die with it and do not add
// up in the sandbox cgroup, so the metrics add these.
var limitHits sync.Map // "sandbox\x00resource" -> *atomic.Uint64

func countLimitHit(e *audit.Event) {
	if e.Limit == nil || e.Limit.Mechanism != limits.Cgroup1 {
		return
	}
	n := e.Limit.Count
	if n == 0 {
		n = 1
	}
	v, _ := limitHits.LoadOrStore(e.Sandbox.Name+"\x00"+e.Limit.Resource, new(atomic.Uint64))
	v.(*atomic.Uint64).Add(n)
}

func recordedHits(sandbox, resource string) uint64 {
	if v, ok := limitHits.Load(sandbox + "\x00" + resource); ok {
		return v.(*atomic.Uint64).Load()
	}
	return 0
}

// limitsCollector exports each sandbox's usage and limits on scrape.
type limitsCollector struct{ a *Agent }

var (
	descCPU       = prometheus.NewDesc("watcher_sandbox_cpu_seconds_total", "CPU time used by the sandbox's cgroups.", []string{"sandbox"}, nil)
	descCPULimit  = prometheus.NewDesc("watcher_sandbox_cpu_limit_cores", "The sandbox's CPU limit in cores (absent: none).", []string{"sandbox"}, nil)
	descMem       = prometheus.NewDesc("watcher_sandbox_memory_bytes", "Memory charged to the sandbox's cgroups now.", []string{"sandbox"}, nil)
	descMemPeak   = prometheus.NewDesc("watcher_sandbox_memory_peak_bytes", "Most memory the sandbox's cgroups were charged.", []string{"sandbox"}, nil)
	descMemLimit  = prometheus.NewDesc("watcher_sandbox_memory_limit_bytes", "The sandbox's memory limit (absent: none).", []string{"sandbox"}, nil)
	descPIDs      = prometheus.NewDesc("watcher_sandbox_pids", "Tasks in the sandbox's cgroups now.", []string{"sandbox"}, nil)
	descPIDsLimit = prometheus.NewDesc("watcher_sandbox_pids_limit", "The sandbox's pids limit (absent: none).", []string{"sandbox"}, nil)
	descOOM       = prometheus.NewDesc("watcher_sandbox_oom_kills_total", "Processes of the sandbox OOM-killed at its memory limit.", []string{"sandbox"}, nil)
	descPIDsHits  = prometheus.NewDesc("watcher_sandbox_pids_max_hits_total", "Forks refused at the sandbox's pids limit.", []string{"sandbox"}, nil)
)

func (c *limitsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descCPU, descCPULimit, descMem, descMemPeak, descMemLimit, descPIDs, descPIDsLimit, descOOM, descPIDsHits} {
		ch <- d
	}
}

func (c *limitsCollector) Collect(ch chan<- prometheus.Metric) {
	pol := c.a.Policy()
	for i := range pol.Sandboxes {
		sb := &pol.Sandboxes[i]
		var sum control.ResourceUsage
		seen := false
		for _, r := range c.a.rootsOf(sb.Name) {
			if u := rootUsage(pol, sb, r.path); u != nil {
				seen = true
				sum.CPUSeconds += u.CPUSeconds
				sum.MemoryBytes += u.MemoryBytes
				sum.MemoryPeak = max(sum.MemoryPeak, u.MemoryPeak)
				sum.PIDs += u.PIDs
				sum.OOMKills += u.OOMKills
				sum.PIDsMaxHits += u.PIDsMaxHits
			}
		}
		if !seen {
			continue
		}
		n := sb.Name
		ch <- prometheus.MustNewConstMetric(descCPU, prometheus.CounterValue, sum.CPUSeconds, n)
		ch <- prometheus.MustNewConstMetric(descMem, prometheus.GaugeValue, float64(sum.MemoryBytes), n)
		ch <- prometheus.MustNewConstMetric(descMemPeak, prometheus.GaugeValue, float64(sum.MemoryPeak), n)
		ch <- prometheus.MustNewConstMetric(descPIDs, prometheus.GaugeValue, float64(sum.PIDs), n)
		ch <- prometheus.MustNewConstMetric(descOOM, prometheus.CounterValue, float64(sum.OOMKills), n)
		ch <- prometheus.MustNewConstMetric(descPIDsHits, prometheus.CounterValue, float64(sum.PIDsMaxHits), n)
		if sb.Limits.CPU > 0 {
			ch <- prometheus.MustNewConstMetric(descCPULimit, prometheus.GaugeValue, sb.Limits.CPU, n)
		}
		if sb.Limits.Memory.Bytes > 0 {
			ch <- prometheus.MustNewConstMetric(descMemLimit, prometheus.GaugeValue, float64(sb.Limits.Memory.Bytes), n)
		}
		if sb.Limits.PIDs > 0 {
			ch <- prometheus.MustNewConstMetric(descPIDsLimit, prometheus.GaugeValue, float64(sb.Limits.PIDs), n)
		}
	}
}

// isExecLeaf reports a cgroup path inside a `watcher exec` leaf (launch
// names them exec-LABEL-HEX).
func isExecLeaf(rel string) bool {
	return strings.Contains(rel, "/exec-")
}

// watchLimits records limit hits in the sandbox cgroups the agent watches
// (containers and other runtime-placed processes): every second it
// compares each root's OOM-kill and refused-fork counters with the last
// reading and records the increase, naming OOM victims from the kernel
// log. Kills inside `watcher exec` leaves are left to watcher exec, which
// reports its own (on cgroup v2 they also add up in the sandbox cgroup's
// counter; they are named in the kernel log and not counted twice).
func (a *Agent) watchLimits(ctx context.Context) {
	h, err := hostLimits()
	if err != nil {
		return
	}
	klog, _ := limits.OpenKernelLog()
	defer klog.Close()
	type seen struct{ oom, pids uint64 }
	last := map[string]seen{}
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pol := a.Policy()
		kills := klog.AllOOMKills()
		for i := range pol.Sandboxes {
			sb := &pol.Sandboxes[i]
			lim := LimitsOf(sb.Limits)
			if lim.Zero() {
				continue
			}
			for _, r := range a.rootsOf(sb.Name) {
				rel := relOf(r.path)
				u := h.UsageOf(rel)
				prev, ok := last[r.path]
				last[r.path] = seen{u.OOMKills, u.PIDsMaxHits}
				if !ok {
					continue // the baseline
				}
				base := audit.Event{Kind: audit.KindLimit, Severity: audit.SeverityAlert, Sandbox: audit.Sandbox{Name: sb.Name}}
				if d := u.OOMKills - prev.oom; u.OOMKills > prev.oom {
					named := 0
					for _, o := range kills {
						if !o.Under(rel) {
							continue
						}
						named++
						if isExecLeaf(o.TaskMemcg) {
							continue // watcher exec reports its own
						}
						ev := base
						ev.Verdict, ev.Mechanism = audit.VerdictKilled, h.Mechanism(limits.Memory)
						ev.Process = audit.Process{PID: uint32(o.PID), TGID: uint32(o.PID), UID: uint32(o.UID), Comm: o.Comm}
						ev.Limit = &audit.LimitDetail{Resource: limits.Memory, Limit: uint64(lim.Memory), Usage: uint64(u.MemoryPeak), Count: 1, Mechanism: ev.Mechanism}
						ev.Message = fmt.Sprintf("%s (pid %d) OOM-killed at the memory limit %s in %s", o.Comm, o.PID, policy.FormatBytes(lim.Memory), rel)
						a.emit(ev)
					}
					if int(d) > named {
						ev := base
						ev.Verdict, ev.Mechanism = audit.VerdictKilled, h.Mechanism(limits.Memory)
						ev.Limit = &audit.LimitDetail{Resource: limits.Memory, Limit: uint64(lim.Memory), Usage: uint64(u.MemoryPeak), Count: d - uint64(named), Mechanism: ev.Mechanism}
						ev.Message = fmt.Sprintf("%d processes OOM-killed at the memory limit %s in %s", int(d)-named, policy.FormatBytes(lim.Memory), rel)
						a.emit(ev)
					}
				}
				if u.PIDsMaxHits > prev.pids {
					ev := base
					ev.Verdict, ev.Mechanism = audit.VerdictDenied, h.Mechanism(limits.PIDs)
					ev.Limit = &audit.LimitDetail{Resource: limits.PIDs, Limit: uint64(lim.PIDs), Usage: uint64(u.PIDs), Count: u.PIDsMaxHits - prev.pids, Mechanism: ev.Mechanism}
					ev.Message = fmt.Sprintf("%d forks refused at the pids limit %d in %s", u.PIDsMaxHits-prev.pids, lim.PIDs, rel)
					a.emit(ev)
				}
			}
		}
	}
}
