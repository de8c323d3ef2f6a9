package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/ledger"
)

var (
	floodOnce sync.Once
	floodPath string
	floodErr  error
)

// floodBinary builds testdata/flood once, without cgo: it must not link
// cilium/ebpf (the kill backstop answers bpf(2) in a sandbox with SIGKILL).
func floodBinary(t *testing.T) string {
	t.Helper()
	floodOnce.Do(func() {
		dir, err := os.MkdirTemp("", "watcher-e2e-flood-")
		if err != nil {
			floodErr = err
			return
		}
		floodPath = filepath.Join(dir, "flood")
		cmd := exec.Command("go", "build", "-o", floodPath, "./testdata/flood")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			floodErr = fmt.Errorf("go build flood: %v\n%s", err, out)
		}
	})
	if floodErr != nil {
		t.Fatal(floodErr)
	}
	return floodPath
}

// ledgerEvents reads every record of a (closed) ledger.
func ledgerEvents(t *testing.T, dir string) []audit.Event {
	t.Helper()
	r, err := ledger.NewReader(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var out []audit.Event
	for {
		rec, err := r.Next()
		if err != nil {
			break
		}
		out = append(out, rec.Event)
	}
	return out
}

// vmHWM is a process's peak resident memory in KiB.
func vmHWM(pid int) int {
	data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	m := regexp.MustCompile(`VmHWM:\s+(\d+) kB`).FindSubmatch(data)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(string(m[1]))
	return n
}

// TestAlertsSurviveFlood: a sandbox floods routine events (the syscall
// stream of an open loop) and a million refused connects, and in the middle
// and at the end does a distinct forbidden operation (reading /etc/shadow).
// Both records reach the ledger; the refused connects are folded into few
// records whose counts add up exactly to what the process saw; no alert is
// dropped in user space; the agent's memory stays bounded.
func TestAlertsSurviveFlood(t *testing.T) {
	tb := newTestbed(t, "", "{enabled: false}\n    audit: {syscalls: true, sample_rate: 1}")
	// The restricted preset kills execs from /tmp: run it from the workspace.
	flood := filepath.Join(tb.ws, "flood")
	if data, err := os.ReadFile(floodBinary(t)); err != nil || os.WriteFile(flood, data, 0o755) != nil {
		t.Fatalf("copy flood: %v", err)
	}
	tb.startAgent()
	agentPID := tb.agent.Process.Pid
	port := freePort(t) // loopback, not in the policy: refused by the connect hook

	const connects = 1_000_000
	script := fmt.Sprintf(`F=%s
$F open /etc/hostname 400000 > "$OUT/open" &
$F connect 127.0.0.1:%d %d > "$OUT/connect" &
sleep 0.2; cat /etc/shadow; wait
cat /etc/shadow; cat "$OUT/open" "$OUT/connect"`, flood, port, connects)
	cmd := inSandbox(t, tb.cgAbs, "flood", script, "OUT="+tb.ws)
	out, _ := cmd.CombinedOutput()
	if strings.Contains(string(out), "root:") {
		t.Fatalf("/etc/shadow was read:\n%s", out)
	}
	m := regexp.MustCompile(`connect pid=(\d+) eperm=(\d+) ok=(\d+) other=(\d+)`).FindStringSubmatch(string(out))
	if m == nil {
		t.Fatalf("flood output:\n%s", out)
	}
	floodPID, _ := strconv.Atoi(m[1])
	eperm, _ := strconv.ParseUint(m[2], 10, 64)
	if eperm != connects {
		t.Fatalf("flood: %d of %d connects refused, want all:\n%s", eperm, connects, out)
	}
	peak := vmHWM(agentPID)
	tb.stopAgent(syscall.SIGTERM)

	var folded, connectRecords, shadow uint64
	losses := map[string]uint64{}
	for _, e := range ledgerEvents(t, tb.ledger) {
		switch {
		case e.Kind == audit.KindNet && e.Net != nil && e.Net.Port == uint16(port) && e.Process.TGID == uint32(floodPID):
			if e.Verdict != audit.VerdictDenied {
				t.Errorf("connect record with verdict %s", e.Verdict)
			}
			folded += e.Count()
			connectRecords++
			if r := e.Repeat; r != nil && (r.First.IsZero() || r.Last.Before(r.First)) {
				t.Errorf("burst record with times %v..%v", r.First, r.Last)
			}
		case e.Kind == audit.KindFileOpen && e.File != nil && e.File.Path == "/etc/shadow" && e.Process.Comm == "cat":
			shadow++
		case e.Kind == audit.KindLoss && e.Loss != nil:
			losses[e.Loss.Stage] += e.Loss.Count
		}
	}
	t.Logf("%d refused connects in %d records; /etc/shadow records %d; losses %v; agent peak RSS %d MiB",
		folded, connectRecords, shadow, losses, peak>>10)
	if shadow < 2 {
		t.Errorf("%d records of the two /etc/shadow reads, want 2 (one in the flood, one after it)", shadow)
	}
	if losses["queue_alert"] != 0 {
		t.Errorf("alerts lost: %v", losses)
	}
	if folded+losses["ringbuf_alert"] != eperm {
		t.Errorf("ledger counts %d refused connects (+%d lost in the kernel ring), the process saw %d", folded, losses["ringbuf_alert"], eperm)
	}
	if connectRecords > 1000 {
		t.Errorf("%d records for one repeated refusal: not folded", connectRecords)
	}
	if peak > 256<<10 {
		t.Errorf("agent peak RSS %d MiB, want at most 256", peak>>10)
	}
}

var _ = bufio.NewScanner
var _ = json.Marshal
