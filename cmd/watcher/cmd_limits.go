package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/watcherhq/watcher/internal/agent"
	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/control"
	"github.com/watcherhq/watcher/internal/launch"
	"github.com/watcherhq/watcher/internal/limits"
	"github.com/watcherhq/watcher/internal/policy"
	"github.com/watcherhq/watcher/internal/textesc"
)

// execLimits applies a sandbox's limits to the `watcher exec` leaf (and
// its parent, the sandbox cgroup) and turns what the command hit into
// ledger events.
type execLimits struct {
	sandbox, label string
	host           *limits.Host
	leaf           *limits.Leaf
	report         *limits.LeafReport
}

// newExecLimits returns nil when the sandbox has no limits.
func newExecLimits(sb *policy.Sandbox, parent, label string) (*execLimits, error) {
	lim := agent.LimitsOf(sb.Limits)
	if lim.Zero() {
		return nil, nil
	}
	host, err := limits.Detect()
	if err != nil {
		return nil, err
	}
	root, err := cgroupfs.Mountpoint()
	if err != nil {
		return nil, err
	}
	abs, err := cgroupfs.Abs(parent)
	if err != nil {
		return nil, err
	}
	// The sandbox cgroup carries the limits for all its commands together.
	if _, err := host.Apply(strings.TrimPrefix(abs, root), lim, true); err != nil {
		return nil, err
	}
	e := &execLimits{sandbox: sb.Name, label: label, host: host}
	e.leaf = &limits.Leaf{Host: host, Limits: lim, OnDone: func(r limits.LeafReport) { e.report = &r }}
	return e, nil
}

// Hook is the launch hook (nil without limits).
func (e *execLimits) Hook() launch.LeafHook {
	if e == nil {
		return nil
	}
	return e.leaf
}

// Finish prints the usage line when a limit was hit and records the hits
// with record.
func (e *execLimits) Finish(stderr io.Writer, record func(audit.Event) error) error {
	if e == nil || e.report == nil {
		return nil
	}
	r := e.report
	u, l := r.Usage, r.Limits
	mech := func(c string) string { return e.host.Mechanism(c) }
	line := fmt.Sprintf("watcher: limits cpu=%.2fs throttled=%d memory.peak=%s", u.CPUSeconds, u.CPUThrottled, policy.FormatBytes(u.MemoryPeak))
	if l.Memory > 0 {
		line += "/" + policy.FormatBytes(l.Memory)
	}
	line += fmt.Sprintf(" oom_kills=%d pids.max_hits=%d", u.OOMKills, u.PIDsMaxHits)
	if l.PIDs > 0 {
		line += fmt.Sprintf(" pids.max=%d", l.PIDs)
	}
	// Only a hit is worth a line on the command's stderr: the presets'
	// default pids limit applies to every command, and a command that
	// stays within its limits must not print anything it would not.
	if u.OOMKills > 0 || u.PIDsMaxHits > 0 {
		fmt.Fprintln(stderr, line+" via memory:"+mech(limits.Memory)+" cpu:"+mech(limits.CPU)+" pids:"+mech(limits.PIDs))
	}
	if r.Err != nil {
		fmt.Fprintln(stderr, "watcher: limits:", r.Err)
	}
	base := audit.Event{Time: time.Now(), Kind: audit.KindLimit, Severity: audit.SeverityAlert, Sandbox: audit.Sandbox{Name: e.sandbox}}
	if e.label != "" {
		base.Sandbox.Labels = map[string]string{"label": e.label}
	}
	var evs []audit.Event
	for _, o := range r.OOM {
		ev := base
		ev.Verdict, ev.Mechanism = audit.VerdictKilled, mech(limits.Memory)
		ev.Process = audit.Process{PID: uint32(o.PID), TGID: uint32(o.PID), UID: uint32(o.UID), Comm: o.Comm}
		ev.Limit = &audit.LimitDetail{Resource: limits.Memory, Limit: uint64(l.Memory), Usage: uint64(u.MemoryPeak), Count: 1, Mechanism: mech(limits.Memory)}
		ev.Message = fmt.Sprintf("%s (pid %d) OOM-killed at the memory limit %s", o.Comm, o.PID, policy.FormatBytes(l.Memory))
		evs = append(evs, ev)
	}
	if n := int(u.OOMKills) - len(r.OOM); n > 0 {
		// Kills the kernel log did not name (unreadable or overwritten).
		ev := base
		ev.Verdict, ev.Mechanism = audit.VerdictKilled, mech(limits.Memory)
		ev.Limit = &audit.LimitDetail{Resource: limits.Memory, Limit: uint64(l.Memory), Usage: uint64(u.MemoryPeak), Count: uint64(n), Mechanism: mech(limits.Memory)}
		ev.Message = fmt.Sprintf("%d processes OOM-killed at the memory limit %s", n, policy.FormatBytes(l.Memory))
		evs = append(evs, ev)
	}
	if u.PIDsMaxHits > 0 {
		ev := base
		ev.Verdict, ev.Mechanism = audit.VerdictDenied, mech(limits.PIDs)
		ev.Limit = &audit.LimitDetail{Resource: limits.PIDs, Limit: uint64(l.PIDs), Count: u.PIDsMaxHits, Mechanism: mech(limits.PIDs)}
		ev.Message = fmt.Sprintf("%d forks refused at the pids limit %d", u.PIDsMaxHits, l.PIDs)
		evs = append(evs, ev)
	}
	for _, ev := range evs {
		if err := record(ev); err != nil {
			return fmt.Errorf("record limit hit: %w", err)
		}
	}
	return nil
}

// printUsage prints each sandbox cgroup's resource use against its
// limits (part of `watcher status`).
func printUsage(w io.Writer, st *control.Status) {
	any := false
	for _, s := range st.Sandboxes {
		any = any || s.Usage != nil
	}
	if !any {
		return
	}
	of := func(used string, limit string) string {
		if limit == "" {
			return used
		}
		return used + " / " + limit
	}
	pct := func(u, l float64) string {
		if l <= 0 {
			return ""
		}
		return fmt.Sprintf(" (%.0f%%)", 100*u/l)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SANDBOX\tCGROUP\tCPU\tMEMORY\tPEAK\tPIDS\tOOM KILLS\tFORKS REFUSED\tVIA")
	for _, s := range st.Sandboxes {
		u := s.Usage
		if u == nil {
			continue
		}
		cpu := fmt.Sprintf("%.1fs", u.CPUSeconds)
		if u.CPULimit > 0 {
			cpu += fmt.Sprintf(" (limit %.2f cores)", u.CPULimit)
		}
		mem, pids := "", ""
		if u.MemoryLimit > 0 {
			mem = policy.FormatBytes(u.MemoryLimit)
		}
		if u.PIDsLimit > 0 {
			pids = fmt.Sprint(u.PIDsLimit)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s%s\t%s\t%s%s\t%d\t%d\t%s\n", textesc.String(s.Name), textesc.String(s.Path), cpu,
			of(policy.FormatBytes(u.MemoryBytes), mem), pct(float64(u.MemoryBytes), float64(u.MemoryLimit)), policy.FormatBytes(u.MemoryPeak),
			of(fmt.Sprint(u.PIDs), pids), pct(float64(u.PIDs), float64(u.PIDsLimit)), u.OOMKills, u.PIDsMaxHits, textesc.String(u.Mechanism))
	}
	tw.Flush()
	fmt.Fprintln(w)
}
