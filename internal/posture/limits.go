package posture

import (
	"bufio"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/limits"
)

// v1 memory.limit_in_bytes reads PAGE_COUNTER_MAX pages (a little under
// 2^63) when unlimited; anything this large is no limit.
const v1Unlimited = int64(1) << 62

// limitAgg keeps the loosest limit per controller over the processes read
// (0 once one process has none).
type limitAgg struct {
	r     *Reader
	n     int
	lim   audit.LimitsPosture
	cache map[string]float64 // controller + "\x00" + cgroup path -> limit (0: none)
}

func newLimitAgg(r *Reader) *limitAgg { return &limitAgg{r: r, cache: map[string]float64{}} }

// add reads pid's cgroups from /proc/PID/cgroup (a process's v1 groups
// need not match its v2 group) and the limits on each.
func (a *limitAgg) add(pid int) error {
	groups, err := procCgroups(filepath.Join(a.r.Proc, strconv.Itoa(pid), "cgroup"))
	if err != nil {
		return err
	}
	mem := a.limit(limits.Memory, groups)
	cpu := a.limit(limits.CPU, groups)
	pids := a.limit(limits.PIDs, groups)
	if a.n == 0 {
		a.lim = audit.LimitsPosture{MemoryBytes: int64(mem), CPUMillis: millis(cpu), PIDs: int64(pids)}
	} else {
		a.lim.MemoryBytes = looser(a.lim.MemoryBytes, int64(mem))
		a.lim.CPUMillis = looser(a.lim.CPUMillis, millis(cpu))
		a.lim.PIDs = looser(a.lim.PIDs, int64(pids))
	}
	a.n++
	return nil
}

// millis turns cores into thousandths of a core (at least 1 for any limit).
func millis(cores float64) int64 {
	if cores <= 0 {
		return 0
	}
	return max(1, int64(math.Round(cores*1000)))
}

func looser(a, b int64) int64 {
	if a == 0 || b == 0 {
		return 0
	}
	return max(a, b)
}

func (a *limitAgg) result() audit.LimitsPosture { return a.lim }

// limit is the tightest limit on ctrl for a process in groups: its own
// cgroup's or the nearest ancestor's (the hierarchy root has none).
func (a *limitAgg) limit(ctrl string, groups cgroupPaths) float64 {
	dir, rel := a.r.hierarchy(ctrl, groups)
	if dir == "" {
		return 0
	}
	key := ctrl + "\x00" + dir + rel
	if v, ok := a.cache[key]; ok {
		return v
	}
	v := tightest(ctrl, a.r.Host.Mechanism(ctrl), dir, rel)
	a.cache[key] = v
	return v
}

// cgroupLimits reads the limits of a cgroup at the same path in every
// hierarchy (for a cgroup with no process to follow).
func (r *Reader) cgroupLimits(rel string) audit.LimitsPosture {
	groups := cgroupPaths{v2: rel, v1: map[string]string{}}
	for c := range r.Host.V1 {
		groups.v1[c] = rel
	}
	a := newLimitAgg(r)
	return audit.LimitsPosture{MemoryBytes: int64(a.limit(limits.Memory, groups)), CPUMillis: millis(a.limit(limits.CPU, groups)),
		PIDs: int64(a.limit(limits.PIDs, groups))}
}

// hierarchy returns the mount point of the hierarchy enforcing ctrl here
// and the process's path in it.
func (r *Reader) hierarchy(ctrl string, g cgroupPaths) (string, string) {
	switch r.Host.Mechanism(ctrl) {
	case limits.Cgroup2:
		return r.Host.V2, g.v2
	case limits.Cgroup1:
		if p, ok := g.v1[ctrl]; ok {
			return r.Host.V1[ctrl], p
		}
	}
	return "", ""
}

// tightest walks from rel up to (not including) the hierarchy root.
func tightest(ctrl, mech, root, rel string) float64 {
	best := 0.0
	for p := filepath.Clean("/" + rel); p != "/"; p = filepath.Dir(p) {
		if v := readLimit(ctrl, mech, filepath.Join(root, p)); v > 0 && (best == 0 || v < best) {
			best = v
		}
	}
	return best
}

// readLimit reads one cgroup's limit on ctrl: bytes, cores or tasks; 0 when
// there is none (or the file is absent: controller not enabled there).
func readLimit(ctrl, mech, dir string) float64 {
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return ""
		}
		return strings.TrimSpace(string(b))
	}
	num := func(s string) float64 {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n <= 0 {
			return 0
		}
		return float64(n)
	}
	switch {
	case ctrl == limits.Memory && mech == limits.Cgroup2:
		return num(read("memory.max"))
	case ctrl == limits.Memory:
		if v := num(read("memory.limit_in_bytes")); v < float64(v1Unlimited) {
			return v
		}
	case ctrl == limits.CPU && mech == limits.Cgroup2:
		f := strings.Fields(read("cpu.max"))
		if len(f) == 2 {
			if q, p := num(f[0]), num(f[1]); q > 0 && p > 0 {
				return q / p
			}
		}
	case ctrl == limits.CPU:
		if q, p := num(read("cpu.cfs_quota_us")), num(read("cpu.cfs_period_us")); q > 0 && p > 0 {
			return q / p
		}
	case ctrl == limits.PIDs:
		return num(read("pids.max"))
	}
	return 0
}

// cgroupPaths is a process's cgroup in the v2 hierarchy and in each v1
// hierarchy by controller name.
type cgroupPaths struct {
	v2 string
	v1 map[string]string
}

// procCgroups parses /proc/PID/cgroup ("hierarchy-id:controllers:path";
// "0::path" for v2). Paths are relative to the reader's cgroup namespace:
// the agent runs in the host's.
func procCgroups(path string) (cgroupPaths, error) {
	f, err := os.Open(path)
	if err != nil {
		return cgroupPaths{}, fmt.Errorf("cgroups: %w", err)
	}
	defer f.Close()
	g := cgroupPaths{v1: map[string]string{}}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			g.v2 = parts[2]
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			g.v1[c] = parts[2]
		}
	}
	if err := sc.Err(); err != nil {
		return cgroupPaths{}, fmt.Errorf("cgroups: %w", err)
	}
	return g, nil
}
