package limits

import (
	"path/filepath"
	"strings"
)

// LeafReport is what a command's leaf cgroup used and hit.
type LeafReport struct {
	// Rel is the leaf's path relative to the hierarchy roots.
	Rel string
	// Limits are the leaf's limits.
	Limits Limits
	// Usage is read when the command is done.
	Usage Usage
	// OOM lists the processes killed at the memory limit.
	OOM []OOMKill
	// Err is set when the limits could not be read or removed.
	Err error
}

// Leaf applies limits to each `watcher exec` leaf cgroup (launch.LeafHook)
// and reports its usage and limit hits when the command is done.
type Leaf struct {
	Host   *Host
	Limits Limits
	// OnDone receives the report, from the launcher's goroutine.
	OnDone func(LeafReport)

	g    *Group
	klog *KernelLog
}

// Enter applies the limits to the leaf and moves pid into the leaf's v1
// groups.
func (l *Leaf) Enter(leaf string, pid int) error {
	rel := "/" + strings.TrimPrefix(strings.TrimPrefix(leaf, l.Host.V2), "/")
	if l.Host.V2 == "" {
		rel = filepath.Clean("/" + leaf)
	}
	// The log is opened before the command runs, so its OOM kills are
	// after the position.
	l.klog, _ = OpenKernelLog()
	g, err := l.Host.Apply(rel, l.Limits, false)
	if err != nil {
		return err
	}
	l.g = g
	return g.Enter(pid)
}

// Exit reads the usage and the OOM kills, removes the v1 groups and calls
// OnDone.
func (l *Leaf) Exit(string) {
	if l.g == nil {
		return
	}
	r := LeafReport{Rel: l.g.Rel, Limits: l.Limits, Usage: l.g.Usage()}
	r.OOM = l.klog.OOMKills(l.g.Rel)
	l.klog.Close()
	r.Err = l.g.Remove()
	if l.OnDone != nil {
		l.OnDone(r)
	}
}
