package agent

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/testkit/poll"
)

// TestStatusAndMetricsAgree: `watcher status` and /metrics read the same
// counts, the pipeline's. A process in the sandbox writes /proc/sys n times
// (each refused with EPERM by the cgroup sysctl hook, one kernel event
// each); then status's per-verdict counts equal /metrics'
// watcher_events_total of the sandbox summed over kinds, its losses equal
// watcher_losses_total, and the refused writes are all there (counted, or
// counted as lost by the ring).
func TestStatusAndMetricsAgree(t *testing.T) {
	a, cg := startTestAgent(t, func(cg string) string {
		return fmt.Sprintf(`  - name: counted
    select: {cgroups: [%s]}
    preset: restricted
    escape: {enabled: false}
    canary: {enabled: false}
`, cg)
	})
	srv, addr, err := a.metrics.Serve("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	root, err := cgroupfs.Abs(cg)
	if err != nil {
		t.Fatal(err)
	}
	if err := cgroupfs.Create(root); err != nil {
		t.Fatal(err)
	}
	leaf := filepath.Join(root, "writer")
	if err := cgroupfs.Create(leaf); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cgroupfs.Remove(leaf) })
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		poll.Eventually(t, 15*time.Second, cond, "timed out waiting for %s", what)
	}
	waitFor("the sandbox root to be registered", func() bool { return len(a.Status().Sandboxes) > 0 })

	const n = 200
	fd, err := os.Open(leaf)
	if err != nil {
		t.Fatal(err)
	}
	defer fd.Close()
	script := fmt.Sprintf(`refused=0; i=0
while [ $i -lt %d ]; do i=$((i+1)); echo 60 2>/dev/null >/proc/sys/vm/swappiness || refused=$((refused+1)); done
echo refused=$refused; cat /proc/self/cgroup >/dev/null && echo reads-ok`, n)
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(fd.Fd())}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("writer: %v\n%s", err, out)
	}
	if got := strings.TrimSpace(string(out)); got != fmt.Sprintf("refused=%d\nreads-ok", n) {
		t.Fatalf("writer printed %q, want all %d writes refused and the read working", got, n)
	}

	// The refused writes reach the counters (or the ring's loss count).
	var series map[string]float64
	sysctlDenied := func() uint64 {
		series = scrape(t, "http://"+addr.String()+"/metrics")
		return uint64(series[`watcher_events_total{kind="sysctl",sandbox="counted",verdict="denied"}`])
	}
	waitFor(fmt.Sprintf("%d sysctl refusals counted", n), func() bool {
		return sysctlDenied()+a.metrics.LossesByStage()["ringbuf_alert"] >= n
	})
	lostAlerts := a.metrics.LossesByStage()["ringbuf_alert"]
	if got := sysctlDenied(); got+lostAlerts != n {
		t.Errorf("/metrics counts %d sysctl refusals (+%d alerts lost in the ring), the process saw %d", got, lostAlerts, n)
	}

	// Let the rest of the process's events (exec, exit) arrive, then read
	// both views with nothing in flight: take status between two equal
	// scrapes.
	var st, before map[string]float64
	status := a.Status()
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(300 * time.Millisecond) {
		before = scrape(t, "http://"+addr.String()+"/metrics")
		status = a.Status()
		st = scrape(t, "http://"+addr.String()+"/metrics")
		if equalCounts(before, st) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the counters never settled")
		}
	}
	var events map[string]uint64
	for _, s := range status.Sandboxes {
		if s.Name == "counted" {
			events = s.Events
		}
	}
	if events == nil {
		t.Fatalf("status has no sandbox counted: %+v", status.Sandboxes)
	}
	byVerdict := map[string]uint64{}
	for k, v := range st {
		if m := eventSeries.FindStringSubmatch(k); m != nil && m[2] == "counted" {
			byVerdict[m[3]] += uint64(v)
		}
	}
	for _, v := range []audit.Verdict{audit.VerdictAllowed, audit.VerdictRecorded, audit.VerdictDenied, audit.VerdictKilled} {
		if events[string(v)] != byVerdict[string(v)] {
			t.Errorf("%s: status says %d, /metrics %d", v, events[string(v)], byVerdict[string(v)])
		}
	}
	if events["denied"] < n-lostAlerts {
		t.Errorf("status counts %d denied events, want at least the %d refused writes that were not lost", events["denied"], n-lostAlerts)
	}
	for stage, lost := range status.Losses {
		if got := uint64(st[`watcher_losses_total{stage="`+stage+`"}`]); got != lost {
			t.Errorf("losses at %s: status %d, /metrics %d", stage, lost, got)
		}
	}
	for k, v := range st {
		if m := lossSeries.FindStringSubmatch(k); m != nil && status.Losses[m[1]] != uint64(v) {
			t.Errorf("/metrics loses %v at %s, status %d", v, m[1], status.Losses[m[1]])
		}
	}
	t.Logf("status events %v, losses %v", events, status.Losses)
}

var (
	eventSeries = regexp.MustCompile(`^watcher_events_total\{kind="([^"]*)",sandbox="([^"]*)",verdict="([^"]*)"\}$`)
	lossSeries  = regexp.MustCompile(`^watcher_losses_total\{stage="([^"]*)"\}$`)
)

// scrape reads the watcher_events_total and watcher_losses_total series of
// a /metrics page over HTTP.
func scrape(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET %s: %s\n%s", url, resp.Status, body)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "watcher_events_total{") && !strings.HasPrefix(line, "watcher_losses_total{") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func equalCounts(a, b map[string]float64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
