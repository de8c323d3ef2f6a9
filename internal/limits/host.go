// Package limits applies a sandbox's resource limits (CPU bandwidth,
// memory, memory.high, pids, block I/O) to its cgroups and reads their
// usage, on the cgroup v2 hierarchy where the controller is enabled there
// and on the v1 hierarchy of the same name elsewhere (hybrid hosts, where
// memory, cpu and pids are still v1 controllers).
//
// A cgroup is named by its path relative to the hierarchy roots
// ("/watcher/agents/exec-x"): the same path is used in the v2 hierarchy
// (where watcher's BPF programs and cgroup.kill work) and in every v1
// hierarchy that carries a controller, and a process entering the group
// is moved into each.
package limits

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/watcherhq/watcher/internal/cgroupfs"
)

// Controllers limits can use.
const (
	CPU    = "cpu"
	Memory = "memory"
	PIDs   = "pids"
	IO     = "io"
)

// Mechanisms that enforce a controller.
const (
	Cgroup2 = "cgroup2"
	Cgroup1 = "cgroup1"
	None    = "none"
)

// Host says where each controller lives on this machine.
type Host struct {
	// V2 is the cgroup2 mount point ("" when there is none).
	V2 string
	// V2Controllers are the controllers available in the v2 hierarchy
	// (its root's cgroup.controllers).
	V2Controllers map[string]bool
	// V1 maps a v1 controller name (cpu, cpuacct, memory, pids, blkio) to
	// its hierarchy's mount point.
	V1 map[string]string
}

// v1Name is the v1 controller that stands in for a v2 one.
var v1Name = map[string]string{CPU: "cpu", Memory: "memory", PIDs: "pids", IO: "blkio"}

// Detect reads the cgroup mounts from /proc/self/mountinfo.
func Detect() (*Host, error) { return detect("/proc/self/mountinfo") }

func detect(mountinfo string) (*Host, error) {
	mounts, err := cgroupfs.ReadMountinfo(mountinfo)
	if err != nil {
		return nil, fmt.Errorf("limits: %w", err)
	}
	h := &Host{V2Controllers: map[string]bool{}, V1: map[string]string{}}
	for _, m := range mounts {
		if m.Root != "/" || m.SuperOptions == "" {
			continue // not a hierarchy's root (a bind of a sub-cgroup)
		}
		switch m.FSType {
		case "cgroup2":
			if h.V2 == "" || m.Point == "/sys/fs/cgroup" {
				h.V2 = m.Point
			}
		case "cgroup":
			for _, opt := range strings.Split(m.SuperOptions, ",") {
				switch opt {
				case "cpu", "cpuacct", "memory", "pids", "blkio", "freezer":
					if _, dup := h.V1[opt]; !dup {
						h.V1[opt] = m.Point
					}
				}
			}
		}
	}
	if h.V2 != "" {
		data, err := os.ReadFile(filepath.Join(h.V2, "cgroup.controllers"))
		if err != nil {
			return nil, fmt.Errorf("limits: %w", err)
		}
		for _, c := range strings.Fields(string(data)) {
			h.V2Controllers[c] = true
		}
	}
	return h, nil
}

// Mechanism says which hierarchy enforces a controller here: cgroup2 when
// the v2 hierarchy has it, else cgroup1 when a v1 hierarchy has it, else
// none.
func (h *Host) Mechanism(controller string) string {
	if h.V2Controllers[controller] {
		return Cgroup2
	}
	if _, ok := h.V1[v1Name[controller]]; ok {
		return Cgroup1
	}
	return None
}

// Layer is one limit and what enforces it, for the layer table.
type Layer struct {
	Limit     string
	Mechanism string
	Note      string
}

// Layers describes how each controller a sandbox's limits use is
// enforced on this host.
func (h *Host) Layers(l Limits) []Layer {
	var out []Layer
	add := func(name, ctrl, v2, v1 string) {
		m := h.Mechanism(ctrl)
		note := map[string]string{Cgroup2: v2, Cgroup1: v1, None: "no " + ctrl + " controller on this host: not enforced"}[m]
		out = append(out, Layer{Limit: name, Mechanism: m, Note: note})
	}
	if l.CPU > 0 {
		add("limits.cpu", CPU, "cpu.max", "cpu.cfs_quota_us / cpu.cfs_period_us")
	}
	if l.Memory > 0 {
		add("limits.memory", Memory, "memory.max (OOM kill above it)", "memory.limit_in_bytes (OOM kill above it)")
	}
	if l.MemoryHigh > 0 {
		add("limits.memory_high", Memory, "memory.high (throttled and reclaimed above it)",
			"memory.soft_limit_in_bytes (v1 has no memory.high: reclaimed to it only under host memory pressure)")
	}
	if l.PIDs > 0 {
		add("limits.pids", PIDs, "pids.max (fork fails with EAGAIN)", "pids.max (fork fails with EAGAIN)")
	}
	if len(l.IO) > 0 {
		add("limits.io", IO, "io.max", "blkio.throttle.*_device")
	}
	return out
}
