package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/ledger"
)

func TestLifeFileRoundTrip(t *testing.T) {
	path := lifeFile(t.TempDir())
	if s, err := readLife(path); s != nil || err != nil {
		t.Fatalf("no life file: %+v, %v; want nil, nil (a first start)", s, err)
	}
	want := lifeState{PID: 42, Started: time.Unix(100, 0).UTC(), Alive: time.Unix(160, 0).UTC(), RingRoutine: 7,
		SandboxSignals: map[int]uint64{9: 2}}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// A longer beat first: the shorter one written over it must still read.
	long := want
	long.SandboxSignals = map[int]uint64{1: 1, 2: 2, 3: 3, 9: 99999, 15: 5}
	if err := writeLife(f, &long); err != nil {
		t.Fatal(err)
	}
	if err := writeLife(f, &want); err != nil {
		t.Fatal(err)
	}
	got, err := readLife(path)
	if err != nil || got.PID != 42 || !got.Alive.Equal(want.Alive) || got.RingRoutine != 7 || got.SandboxSignals[9] != 2 || len(got.SandboxSignals) != 1 || !got.Stopped.IsZero() {
		t.Fatalf("read back %+v, %v", got, err)
	}
}

// TestLastRecordBefore: the previous agent's last record is found in the
// ledger's last segment; records dated after the restart (this agent's
// own, the ledger's recovery record) are not it.
func TestLastRecordBefore(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ledger")
	l, err := ledger.Open(dir, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// Later than the genesis record, dated at Open.
	base := time.Now().Add(time.Minute).Truncate(time.Millisecond)
	for i, at := range []time.Time{base, base.Add(3 * time.Second), base.Add(time.Second), base.Add(2 * time.Minute)} {
		if _, _, err := l.Append(audit.Event{Time: at, Kind: audit.KindAgent, Verdict: audit.VerdictRecorded, Message: "r" + string(rune('0'+i))}); err != nil {
			t.Fatal(err)
		}
	}
	head, _ := l.Head()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	got, err := lastRecordBefore(dir, head, base.Add(time.Minute))
	if err != nil || !got.Equal(base.Add(3*time.Second)) {
		t.Fatalf("last record before the restart: %v, %v; want %v", got, err, base.Add(3*time.Second))
	}
}

// TestGapRecord: the queued events dated before the restart are counted,
// the one aimed at the dead agent names the suspect, and the record says
// how long no agent ran and what the kernel dropped.
func TestGapRecord(t *testing.T) {
	restart := time.Now()
	g := &gapWatch{prev: lifeState{PID: 4242, Alive: restart.Add(-3 * time.Second)}, restart: restart,
		lastRecord: restart.Add(-4 * time.Second), lostRoutine: 5, signals: map[int]uint64{9: 1}}
	sb := audit.Sandbox{Name: "agents", CgroupID: 99}
	events := []audit.Event{
		{Time: restart.Add(-2 * time.Second), Kind: audit.KindFileOpen, Verdict: audit.VerdictKilled, Sandbox: sb,
			File: &audit.FileDetail{Path: "/etc/shadow"}},
		// The signal_generate record of the F_SETSIG SIGKILL, by a write.
		{Time: restart.Add(-2900 * time.Millisecond), Kind: audit.KindSyscall, Verdict: audit.VerdictKilled, Sandbox: sb,
			Process: audit.Process{TGID: 777, PID: 777, Comm: "python3"}, Target: &audit.TargetDetail{PID: 4242},
			Syscall: &audit.SyscallDetail{Nr: 1, Name: "write"}, Message: "category=signal_agent ret=0"},
		// Aimed at another pid: not the suspect.
		{Time: restart.Add(-time.Second), Kind: audit.KindSignal, Verdict: audit.VerdictKilled, Sandbox: sb,
			Process: audit.Process{TGID: 778, Comm: "sh"}, Target: &audit.TargetDetail{PID: 1, Mode: 9}},
		// After the restart: not queued while away.
		{Time: restart.Add(time.Second), Kind: audit.KindFileOpen, Verdict: audit.VerdictKilled, Sandbox: sb,
			File: &audit.FileDetail{Path: "/etc/shadow"}},
	}
	for i := range events {
		g.Consume(&events[i])
	}
	ev := g.record()
	if ev.Rule != RuleAgentGap || ev.Kind != audit.KindAgent || ev.Sandbox.Name != "agents" || ev.Process.TGID != 777 {
		t.Fatalf("gap record %+v: want rule %s, sandbox agents, process 777", ev, RuleAgentGap)
	}
	for _, want := range []string{"pid 4242", "no agent for 3s", "lost while away: 5 events", "queued while away and recorded now: 3 events",
		"SIGKILL x1", "suspected: sandbox agents, python3 (pid 777)", "via write"} {
		if !strings.Contains(ev.Message, want) {
			t.Errorf("gap record lacks %q:\n%s", want, ev.Message)
		}
	}

	// No event aimed at the agent: no suspect, and it says so.
	g2 := &gapWatch{prev: lifeState{PID: 1}, restart: restart, lastRecord: restart.Add(-time.Second)}
	g2.Consume(&events[0])
	if ev := g2.record(); ev.Sandbox.Name != "" || !strings.Contains(ev.Message, "suspected: none") {
		t.Errorf("gap record without a suspect: %+v", ev)
	}
}

// TestPendingGapSurvives: the gap record an agent had not written yet is
// in its life file, fits the fixed size with a long message and a
// sandbox-written process name, and reads back as the same record.
func TestPendingGapSurvives(t *testing.T) {
	path := lifeFile(t.TempDir())
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	restart := time.Now().UTC()
	g := &gapWatch{prev: lifeState{PID: 4242, Alive: restart.Add(-3 * time.Second)}, restart: restart,
		lastRecord: restart.Add(-4 * time.Second), signals: map[int]uint64{1: 3, 9: 2, 15: 1, 19: 4}}
	g.suspect = &audit.Event{Time: restart.Add(-time.Second), Kind: audit.KindSignal, Verdict: audit.VerdictKilled,
		Sandbox: audit.Sandbox{Name: "agents", CgroupID: 7}, Process: audit.Process{TGID: 9, PID: 9, Comm: "\x1b[2Kxxxxxxxxxxx"},
		Target: &audit.TargetDetail{PID: 4242, Mode: 9}}
	want := g.record()
	s := lifeState{PID: 5000, Started: restart, Alive: restart, SandboxSignals: map[int]uint64{9: 1000000}, Pending: pendingOf(want)}
	if err := writeLife(f, &s); err != nil {
		t.Fatalf("a pending gap does not fit the life file: %v", err)
	}
	got, err := readLife(path)
	if err != nil || got.Pending == nil {
		t.Fatalf("read back: %+v, %v", got, err)
	}
	ev := got.Pending.event()
	if ev.Rule != RuleAgentGap || ev.Message != want.Message || ev.Process.Comm != want.Process.Comm || ev.Sandbox.Name != "agents" || !ev.Time.Equal(want.Time) {
		t.Fatalf("pending gap read back as %+v, want %+v", ev, want)
	}
}
