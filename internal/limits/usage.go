package limits

import (
	"bufio"
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Usage is what a group has used, with the counters of limit hits. Fields
// a host cannot report are zero.
type Usage struct {
	// CPUSeconds is the CPU time used by the group's tasks.
	CPUSeconds float64 `json:"cpu_seconds"`
	// CPUThrottled counts CFS periods in which the group hit its CPU limit.
	CPUThrottled uint64 `json:"cpu_throttled_periods"`
	// MemoryBytes is the memory charged now; MemoryPeak the most so far.
	MemoryBytes int64 `json:"memory_bytes"`
	MemoryPeak  int64 `json:"memory_peak_bytes"`
	// OOMKills counts processes the kernel killed at the memory limit.
	OOMKills uint64 `json:"oom_kills"`
	// MemoryHighHits counts times usage went over memory_high (v2 only).
	MemoryHighHits uint64 `json:"memory_high_hits"`
	// PIDs is the number of tasks now; PIDsMaxHits counts forks refused at
	// the pids limit.
	PIDs        int64  `json:"pids"`
	PIDsMaxHits uint64 `json:"pids_max_hits"`
}

func readInt(p string) int64 {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}

// readKV reads a flat-keyed file ("key value" lines).
func readKV(p string) map[string]int64 {
	b, err := os.ReadFile(p)
	if err != nil {
		return nil
	}
	out := map[string]int64{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			out[f[0]] = n
		}
	}
	return out
}

// Usage reads the group's counters from whichever hierarchy holds each
// controller.
func (g *Group) Usage() Usage { return g.host.usage(g.V2, g.V1) }

// UsageOf reads the usage of an existing cgroup rel without applying
// anything (for cgroups a runtime made).
func (h *Host) UsageOf(rel string) Usage {
	rel = filepath.Clean("/" + rel)
	v1 := map[string]string{}
	for c, mnt := range h.V1 {
		v1[c] = filepath.Join(mnt, rel)
	}
	v2 := ""
	if h.V2 != "" {
		v2 = filepath.Join(h.V2, rel)
	}
	return h.usage(v2, v1)
}

func (h *Host) usage(v2 string, v1 map[string]string) Usage {
	var u Usage
	switch h.Mechanism(CPU) {
	case Cgroup2:
		st := readKV(filepath.Join(v2, "cpu.stat"))
		u.CPUSeconds = float64(st["usage_usec"]) / 1e6
		u.CPUThrottled = uint64(st["nr_throttled"])
	case Cgroup1:
		st := readKV(filepath.Join(v1["cpu"], "cpu.stat"))
		u.CPUThrottled = uint64(st["nr_throttled"])
		if d, ok := v1["cpuacct"]; ok {
			u.CPUSeconds = float64(readInt(filepath.Join(d, "cpuacct.usage"))) / 1e9
		}
	default:
		// cgroup2 reports usage_usec in cpu.stat even without the cpu
		// controller.
		if v2 != "" {
			u.CPUSeconds = float64(readKV(filepath.Join(v2, "cpu.stat"))["usage_usec"]) / 1e6
		}
	}
	switch h.Mechanism(Memory) {
	case Cgroup2:
		u.MemoryBytes = readInt(filepath.Join(v2, "memory.current"))
		u.MemoryPeak = readInt(filepath.Join(v2, "memory.peak"))
		ev := readKV(filepath.Join(v2, "memory.events"))
		u.OOMKills = uint64(ev["oom_kill"])
		u.MemoryHighHits = uint64(ev["high"])
	case Cgroup1:
		d := v1["memory"]
		u.MemoryBytes = readInt(filepath.Join(d, "memory.usage_in_bytes"))
		u.MemoryPeak = readInt(filepath.Join(d, "memory.max_usage_in_bytes"))
		// v1 counts a kill only in the victim's own cgroup: add up the
		// subtree.
		u.OOMKills = sumTree(d, func(dir string) int64 { return readKV(filepath.Join(dir, "memory.oom_control"))["oom_kill"] })
	}
	dir := v2
	if h.Mechanism(PIDs) == Cgroup1 {
		dir = v1["pids"]
	}
	if h.Mechanism(PIDs) != None {
		u.PIDs = readInt(filepath.Join(dir, "pids.current"))
		if _, err := os.Stat(filepath.Join(dir, "pids.events.local")); err == nil {
			// Kernels with pids.events.local count hierarchically.
			u.PIDsMaxHits = uint64(readKV(filepath.Join(dir, "pids.events"))["max"])
		} else {
			// Older ones count in the cgroup whose limit was hit.
			u.PIDsMaxHits = sumTree(dir, func(dir string) int64 { return readKV(filepath.Join(dir, "pids.events"))["max"] })
		}
	}
	return u
}

// sumTree adds f over the cgroup directory and its descendants.
func sumTree(dir string, f func(string) int64) uint64 {
	var n int64
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			n += f(p)
		}
		return nil
	})
	return uint64(max(n, 0))
}
