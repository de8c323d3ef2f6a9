package workloads

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestWallTime is the battery's wall-time bench (bench/workloads/run.sh):
// WL_BENCH=N rounds of every restricted session (or those WL_ONLY lists) bare and caged, in the
// same run, interleaved so load drifts hit all alike. It prints the total
// per mode and the ratios to bare:
//   - bare-no-agent: before the agent starts (the host without watcher);
//   - bare: outside every sandbox while the agent runs (the host-wide cost
//     of its tracepoints);
//   - exec: `watcher exec` (seccomp + Landlock + the kernel hooks);
//   - runtime: a runtime-placed cgroup (the kernel hooks alone; on a host
//     without BPF LSM that is the kill backstop).
func TestWallTime(t *testing.T) {
	rounds, _ := strconv.Atoi(os.Getenv("WL_BENCH"))
	if rounds <= 0 {
		t.Skip("set WL_BENCH=N (rounds) to run the wall-time bench")
	}
	b := newBattery(t)
	var names []string
	only := os.Getenv("WL_ONLY") // comma-separated session names (the qemu guest: a subset)
	for _, s := range sessions {
		if s.name != "net" && (only == "" || strings.Contains(","+only+",", ","+s.name+",")) { // net needs the agent's DNS proxy
			names = append(names, s.name)
		}
	}
	if len(names) == 0 {
		t.Fatalf("WL_ONLY=%q names no session of the bench", only)
	}
	bare := func(session string) time.Duration {
		dir := filepath.Join(b.base, "ws-restricted", session+"-bare")
		if session == "read" {
			dir = b.src
		} else {
			os.RemoveAll(dir)
			os.MkdirAll(dir, 0o755)
		}
		cmd := exec.Command("bash", sessionScript(session))
		cmd.Dir, cmd.Env = dir, b.env(dir)
		start := time.Now()
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("bare %s: %v\n%s", session, err, out)
		}
		return time.Since(start)
	}
	reset := func(session, suffix string) {
		if session != "read" {
			os.RemoveAll(filepath.Join(b.base, "ws-restricted", session+suffix))
		}
	}
	totals := map[string]time.Duration{}
	per := map[string]map[string]time.Duration{}
	add := func(mode, session string, d time.Duration) {
		totals[mode] += d
		if per[session] == nil {
			per[session] = map[string]time.Duration{}
		}
		per[session][mode] += d
	}
	// Warm the caches (Go's build cache, the page cache) once.
	for _, s := range names {
		bare(s)
	}
	for r := 0; r < rounds; r++ {
		for _, s := range names {
			add("bare-no-agent", s, bare(s))
		}
	}
	b.startAgent()
	for _, s := range names {
		b.viaExec(s, "restricted")
		reset(s, "-exec")
		b.inRuntimeCgroup(s, "restricted")
		reset(s, "-rt")
	}
	for r := 0; r < rounds; r++ {
		for i, s := range names {
			modes := []string{"bare", "exec", "runtime"}
			// Rotate the order per session and round.
			k := (r + i) % 3
			modes = append(modes[k:], modes[:k]...)
			for _, m := range modes {
				switch m {
				case "bare":
					add(m, s, bare(s))
				case "exec":
					res := b.viaExec(s, "restricted")
					if !res.ok {
						t.Fatalf("exec %s failed:\n%s", s, res.output)
					}
					add(m, s, res.wall)
					reset(s, "-exec")
				case "runtime":
					res := b.inRuntimeCgroup(s, "restricted")
					if !res.ok {
						t.Fatalf("runtime %s failed:\n%s", s, res.output)
					}
					add(m, s, res.wall)
					reset(s, "-rt")
				}
			}
		}
	}
	var lines []string
	sort.Strings(names)
	for _, s := range names {
		p := per[s]
		lines = append(lines, fmt.Sprintf("  %-7s bare-no-agent %8s  bare %8s  exec %8s (%.2fx)  runtime %8s (%.2fx)", s,
			p["bare-no-agent"].Round(time.Millisecond), p["bare"].Round(time.Millisecond),
			p["exec"].Round(time.Millisecond), ratio(p["exec"], p["bare"]),
			p["runtime"].Round(time.Millisecond), ratio(p["runtime"], p["bare"])))
	}
	summary := fmt.Sprintf("battery wall time, %d rounds of %d sessions (restricted preset):\n%s\n  total   bare-no-agent %s  bare %s (%.2fx of no agent)  exec %s (%.2fx of bare)  runtime %s (%.2fx of bare)",
		rounds, len(names), strings.Join(lines, "\n"),
		totals["bare-no-agent"].Round(time.Millisecond), totals["bare"].Round(time.Millisecond), ratio(totals["bare"], totals["bare-no-agent"]),
		totals["exec"].Round(time.Millisecond), ratio(totals["exec"], totals["bare"]),
		totals["runtime"].Round(time.Millisecond), ratio(totals["runtime"], totals["bare"]))
	fmt.Println(summary)
}

func ratio(a, b time.Duration) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}
