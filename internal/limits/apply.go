package limits

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/watcherhq/watcher/internal/cgroupfs"
	"golang.org/x/sys/unix"
)

// Limits are the values to enforce; zero means no limit.
type Limits struct {
	// CPU is the bandwidth in cores.
	CPU float64
	// Memory and MemoryHigh are in bytes.
	Memory, MemoryHigh int64
	// PIDs is the most tasks.
	PIDs int
	// IO throttles block devices.
	IO []IOLimit
}

// IOLimit throttles one block device.
type IOLimit struct {
	// Device is "/dev/NAME" or "MAJOR:MINOR".
	Device              string
	ReadBPS, WriteBPS   int64
	ReadIOPS, WriteIOPS int
}

// Zero reports whether no limit is set.
func (l Limits) Zero() bool {
	return l.CPU == 0 && l.Memory == 0 && l.MemoryHigh == 0 && l.PIDs == 0 && len(l.IO) == 0
}

// cpuPeriod is the CFS period used for CPU limits, in microseconds.
const cpuPeriod = 100000

// Group is one cgroup with its limits, in every hierarchy that enforces
// one of them.
type Group struct {
	// Rel is the path relative to the hierarchy roots.
	Rel string
	// V2 is the cgroup2 directory.
	V2 string
	// V1 maps v1 controllers (cpu, cpuacct, memory, pids, blkio) to the
	// group's directory in their hierarchy.
	V1 map[string]string
	// Limits are what was applied.
	Limits Limits
	// Kept lists the lower limits found on a foreign cgroup and left in
	// place ("pids.max 100"); Limits carries them.
	Kept []string
	host *Host
	// keepLower is set for cgroups watcher did not make (ApplyForeign).
	keepLower bool
}

// Apply creates the group rel where needed and writes the limits. In the
// v2 hierarchy the controllers are enabled in each ancestor's
// cgroup.subtree_control (those cgroups must hold no processes of their
// own, as cgroup v2 requires); v1 directories are created for every
// controller the limits need (and cpuacct, for CPU usage). The v2
// directory itself must exist (launch and the runtime create it) unless
// create is set.
func (h *Host) Apply(rel string, l Limits, create bool) (*Group, error) {
	return h.apply(&Group{Rel: filepath.Clean("/" + rel), V1: map[string]string{}, Limits: l, host: h}, create)
}

// ApplyForeign is Apply for a cgroup watcher did not make (a container's,
// made by its runtime): a memory or pids limit already there that is
// lower than the policy's is kept, never raised (Group.Kept says which),
// so a policy, or a preset's default, cannot loosen what the runtime set.
func (h *Host) ApplyForeign(rel string, l Limits) (*Group, error) {
	return h.apply(&Group{Rel: filepath.Clean("/" + rel), V1: map[string]string{}, Limits: l, host: h, keepLower: true}, false)
}

func (h *Host) apply(g *Group, create bool) (*Group, error) {
	rel, l := g.Rel, g.Limits
	if h.V2 != "" {
		g.V2 = filepath.Join(h.V2, rel)
		if create {
			if err := os.MkdirAll(g.V2, 0o755); err != nil {
				return nil, fmt.Errorf("limits: %w", err)
			}
		}
	}
	var v2 []string
	need := map[string]bool{CPU: l.CPU > 0, Memory: l.Memory > 0 || l.MemoryHigh > 0, PIDs: l.PIDs > 0, IO: len(l.IO) > 0}
	for _, c := range []string{CPU, Memory, PIDs, IO} {
		switch h.Mechanism(c) {
		case Cgroup2:
			// Usage is read from every controller v2 has, limits or not.
			v2 = append(v2, c)
		case Cgroup1:
			// v1 groups are made for limits, and for usage of memory,
			// cpu and pids so status and metrics have something to show.
			if need[c] || c != IO {
				g.V1[v1Name[c]] = filepath.Join(h.V1[v1Name[c]], rel)
			}
		}
	}
	if _, ok := g.V1["cpu"]; ok {
		if acct, ok := h.V1["cpuacct"]; ok {
			g.V1["cpuacct"] = filepath.Join(acct, rel)
		}
	}
	if len(v2) > 0 && g.V2 != "" {
		if err := enableV2(h.V2, rel, v2); err != nil {
			return nil, err
		}
	}
	for _, dir := range g.V1 {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("limits: %w", err)
		}
	}
	if err := g.write(); err != nil {
		return nil, err
	}
	return g, nil
}

// enableV2 enables the controllers in the subtree_control of every
// ancestor of rel (from the root down), so rel has their files.
func enableV2(root, rel string, ctrls []string) error {
	parts := strings.Split(strings.Trim(rel, "/"), "/")
	dir := root
	for i := 0; i < len(parts); i++ {
		have, _ := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control"))
		var add []string
		for _, c := range ctrls {
			if !strings.Contains(" "+strings.TrimSpace(string(have))+" ", " "+c+" ") {
				add = append(add, "+"+c)
			}
		}
		if len(add) > 0 {
			if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte(strings.Join(add, " ")), 0); err != nil {
				hint := ""
				if errors.Is(err, syscall.EBUSY) {
					hint = " (cgroup v2 allows controllers below a cgroup only when it holds no processes of its own)"
				}
				return fmt.Errorf("limits: enable %s in %s: %w%s", strings.Join(add, " "), dir, err, hint)
			}
		}
		dir = filepath.Join(dir, parts[i])
	}
	return nil
}

func writeFile(dir, name, val string) error {
	if err := os.WriteFile(filepath.Join(dir, name), []byte(val), 0); err != nil {
		return fmt.Errorf("limits: write %q to %s: %w", val, filepath.Join(dir, name), err)
	}
	return nil
}

// keep reports whether a foreign group already has a limit in dir/name
// below want (a number: "max" and v1's near-2^63 "unlimited" are above
// any want), and records it.
func (g *Group) keep(dir, name string, want int64) (int64, bool) {
	if !g.keepLower {
		return 0, false
	}
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return 0, false
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || v <= 0 || v >= want {
		return 0, false
	}
	g.Kept = append(g.Kept, fmt.Sprintf("%s %d", name, v))
	return v, true
}

func (g *Group) write() error {
	l, h := g.Limits, g.host
	if l.CPU > 0 {
		quota := int64(l.CPU * cpuPeriod)
		switch h.Mechanism(CPU) {
		case Cgroup2:
			if err := writeFile(g.V2, "cpu.max", fmt.Sprintf("%d %d", quota, cpuPeriod)); err != nil {
				return err
			}
		case Cgroup1:
			if err := writeFile(g.V1["cpu"], "cpu.cfs_period_us", strconv.Itoa(cpuPeriod)); err != nil {
				return err
			}
			if err := writeFile(g.V1["cpu"], "cpu.cfs_quota_us", strconv.FormatInt(quota, 10)); err != nil {
				return err
			}
		}
	}
	switch h.Mechanism(Memory) {
	case Cgroup2:
		if l.MemoryHigh > 0 {
			if err := writeFile(g.V2, "memory.high", strconv.FormatInt(l.MemoryHigh, 10)); err != nil {
				return err
			}
		}
		if v, ok := g.keep(g.V2, "memory.max", l.Memory); ok {
			g.Limits.Memory = v
		} else if l.Memory > 0 {
			if err := writeFile(g.V2, "memory.max", strconv.FormatInt(l.Memory, 10)); err != nil {
				return err
			}
			// Without swap accounting the limit is memory only; with it,
			// keep the sandbox from escaping the limit into swap.
			if _, err := os.Stat(filepath.Join(g.V2, "memory.swap.max")); err == nil {
				_ = writeFile(g.V2, "memory.swap.max", "0")
			}
		}
	case Cgroup1:
		dir := g.V1["memory"]
		if l.MemoryHigh > 0 {
			if err := writeFile(dir, "memory.soft_limit_in_bytes", strconv.FormatInt(l.MemoryHigh, 10)); err != nil {
				return err
			}
		}
		if v, ok := g.keep(dir, "memory.limit_in_bytes", l.Memory); ok {
			g.Limits.Memory = v
		} else if l.Memory > 0 {
			// v1 keeps memory <= memory+swap: raising, the memsw limit
			// goes first; lowering, it follows.
			val := strconv.FormatInt(l.Memory, 10)
			_, statErr := os.Stat(filepath.Join(dir, "memory.memsw.limit_in_bytes"))
			memsw := statErr == nil
			if memsw {
				_ = writeFile(dir, "memory.memsw.limit_in_bytes", val)
			}
			if err := writeFile(dir, "memory.limit_in_bytes", val); err != nil {
				return err
			}
			if memsw {
				_ = writeFile(dir, "memory.memsw.limit_in_bytes", val)
			}
		}
	}
	if l.PIDs > 0 {
		dir := g.V2
		if h.Mechanism(PIDs) == Cgroup1 {
			dir = g.V1["pids"]
		}
		if v, ok := g.keep(dir, "pids.max", int64(l.PIDs)); ok {
			g.Limits.PIDs = int(v)
		} else if h.Mechanism(PIDs) != None {
			if err := writeFile(dir, "pids.max", strconv.Itoa(l.PIDs)); err != nil {
				return err
			}
		}
	}
	for _, d := range l.IO {
		dev, err := deviceNumber(d.Device)
		if err != nil {
			return err
		}
		switch h.Mechanism(IO) {
		case Cgroup2:
			var kv []string
			for _, f := range []struct {
				k string
				v int64
			}{{"rbps", d.ReadBPS}, {"wbps", d.WriteBPS}, {"riops", int64(d.ReadIOPS)}, {"wiops", int64(d.WriteIOPS)}} {
				if f.v > 0 {
					kv = append(kv, fmt.Sprintf("%s=%d", f.k, f.v))
				}
			}
			if err := writeFile(g.V2, "io.max", dev+" "+strings.Join(kv, " ")); err != nil {
				return err
			}
		case Cgroup1:
			for _, f := range []struct {
				file string
				v    int64
			}{{"blkio.throttle.read_bps_device", d.ReadBPS}, {"blkio.throttle.write_bps_device", d.WriteBPS},
				{"blkio.throttle.read_iops_device", int64(d.ReadIOPS)}, {"blkio.throttle.write_iops_device", int64(d.WriteIOPS)}} {
				if f.v > 0 {
					if err := writeFile(g.V1["blkio"], f.file, fmt.Sprintf("%s %d", dev, f.v)); err != nil {
						return err
					}
				}
			}
		}
	}
	return nil
}

// deviceNumber turns "/dev/vda" or "254:0" into "MAJOR:MINOR". Partitions
// are refused by the kernel's throttling: give the whole disk.
func deviceNumber(dev string) (string, error) {
	if !strings.HasPrefix(dev, "/") {
		return dev, nil
	}
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		return "", fmt.Errorf("limits: io device: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return "", fmt.Errorf("limits: io device %s is not a block device", dev)
	}
	return fmt.Sprintf("%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev)), nil
}

// Enter moves the process into the group's v1 directories (the v2 move is
// the caller's: launch and runtimes place processes in cgroup2).
func (g *Group) Enter(pid int) error {
	for ctrl, dir := range g.V1 {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
			return fmt.Errorf("limits: move pid %d into %s cgroup %s: %w", pid, ctrl, dir, err)
		}
	}
	return nil
}

// Remove removes the group's v1 directories (deepest first), waiting
// briefly for exiting tasks to leave. The v2 directory is its creator's.
func (g *Group) Remove() error {
	var errs []error
	for _, dir := range g.V1 {
		if err := cgroupfs.RemoveDir(dir); err != nil {
			errs = append(errs, fmt.Errorf("limits: remove %s: %w", dir, err))
		}
	}
	return errors.Join(errs...)
}

// RemoveV1Tree removes the v1 twins of the cgroup tree rel (deepest
// first) in every v1 hierarchy, for the one who removes the cgroup2 tree:
// Apply makes them for limits and nothing else removes them. Tasks must
// have left (the cgroup2 tree is killed first); it waits briefly for them.
func (h *Host) RemoveV1Tree(rel string) error {
	rel = filepath.Clean("/" + rel)
	if rel == "/" {
		return fmt.Errorf("limits: refusing to remove the v1 roots")
	}
	var errs []error
	for _, mnt := range h.V1 {
		root := filepath.Join(mnt, rel)
		var dirs []string
		filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			g := Group{V1: map[string]string{"": dirs[i]}}
			if err := g.Remove(); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// RemoveTree removes the cgroup2 tree at abs (an absolute path; its tasks
// killed, frozen or not: cgroupfs.Remove) and then its v1 twins on hybrid
// hosts (RemoveV1Tree): the one removal for whoever made a sandbox or
// leaf cgroup that limits may have been applied to.
func RemoveTree(abs string) error {
	if err := cgroupfs.Remove(abs); err != nil {
		return err
	}
	h, err := Detect()
	if err != nil || len(h.V1) == 0 {
		return nil // no v1 hierarchies: no twins
	}
	rel, err := filepath.Rel(h.V2, abs)
	if err != nil || rel == "." || strings.HasPrefix(rel, "..") {
		return fmt.Errorf("limits: %s is not below the cgroup2 mount %s", abs, h.V2)
	}
	return h.RemoveV1Tree(rel)
}
