package escape

import (
	"bufio"
	"compress/gzip"
	"os"
	"path"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
)

// clock is the injected clock: tests move it explicitly.
type clock struct{ t time.Time }

func (c *clock) now() time.Time          { return c.t }
func (c *clock) advance(d time.Duration) { c.t = c.t.Add(d) }
func newClock() *clock                   { return &clock{t: time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)} }
func newScorer(c *clock) *Scorer         { return New(Config{Threshold: 100, Window: time.Minute, Now: c.now}) }
func proc(pid uint32, comm string) audit.Process {
	return audit.Process{PID: pid, TGID: pid, Comm: comm, CgroupID: 4242}
}

var sandbox = audit.Sandbox{CgroupID: 4242, Name: "agent-1"}

func open(p string, write bool, verdict audit.Verdict) audit.Event {
	return audit.Event{Kind: audit.KindFileOpen, Verdict: verdict, Sandbox: sandbox, Process: proc(3001, "sh"),
		File: &audit.FileDetail{Path: p, Write: write}}
}

// escapeSequence is a scripted container escape as the kernel side reports
// it, step by step after Atomic Red Team T1611 (nsenter into PID 1's mount
// namespace, mounting the host disk) and the cgroup v1 release_agent escape:
// recon of PID 1, namespace entry, a mount, the release_agent write, then
// credential theft. Every dangerous step is refused (denied).
func escapeSequence() []audit.Event {
	blk := func(p string) audit.Event {
		ev := open(p, false, audit.VerdictDenied)
		ev.Kind = audit.KindFileOpen
		ev.File.Mode = 0o060660 // block device
		return ev
	}
	return []audit.Event{
		open("/proc/1/environ", false, audit.VerdictAllowed),
		open("/proc/1/root", false, audit.VerdictAllowed),
		open("/proc/1/mountinfo", false, audit.VerdictAllowed),
		open("/proc/1/ns/mnt", false, audit.VerdictAllowed),
		{Kind: audit.KindSyscall, Verdict: audit.VerdictDenied, Sandbox: sandbox, Process: proc(3002, "nsenter"),
			Syscall: &audit.SyscallDetail{Nr: 308, Name: "setns", Ret: -1}},
		blk("/dev/dm-0"),
		{Kind: audit.KindMount, Verdict: audit.VerdictDenied, Sandbox: sandbox, Process: proc(3003, "mount"),
			Mount: &audit.MountDetail{Op: "mount", Source: "/dev/dm-0", Target: "/mnt/T1611.002", FSType: "ext4"}},
		open("/sys/fs/cgroup/rdma/release_agent", true, audit.VerdictDenied),
		open("/etc/shadow", false, audit.VerdictDenied),
	}
}

func TestScriptedEscapeCrossesThreshold(t *testing.T) {
	c := newClock()
	s := newScorer(c)
	var d *Decision
	steps := escapeSequence()
	at := -1
	for i, ev := range steps {
		c.advance(2 * time.Second)
		if got := s.Observe(ev); got != nil {
			if d != nil {
				t.Fatalf("second decision at step %d: the decision must latch", i)
			}
			d, at = got, i
		}
	}
	if d == nil {
		t.Fatalf("escape sequence did not cross the threshold: score %.1f", s.Score("agent-1"))
	}
	// Caught before the credential theft at the end.
	if at >= len(steps)-1 {
		t.Errorf("crossed only at the last step")
	}
	t.Logf("crossed at step %d/%d: %s", at+1, len(steps), d.Summary())
	if d.Sandbox != "agent-1" || d.CgroupID != 4242 || d.Score < d.Threshold || d.Threshold != 100 {
		t.Errorf("decision %+v", d)
	}
	// The evidence is the contributing events, oldest first, including the
	// namespace entry and the mount; nothing that scored zero.
	seen := map[Signal]bool{}
	for i, e := range d.Evidence {
		if e.Score <= 0 {
			t.Errorf("evidence %d scored %v", i, e.Score)
		}
		if i > 0 && e.At.Before(d.Evidence[i-1].At) {
			t.Error("evidence not in time order")
		}
		seen[e.Signal] = true
	}
	for _, want := range []Signal{SigProcInternal, SigNamespace} {
		if !seen[want] {
			t.Errorf("evidence lacks %s: %+v", want, d.Signals)
		}
	}
	var sum float64
	for _, v := range d.Signals {
		sum += v
	}
	if sum != d.Score {
		t.Errorf("signals add up to %v, score %v", sum, d.Score)
	}
	if !s.Tripped("agent-1") {
		t.Error("not tripped")
	}
	// After an operator thaws the sandbox, the score starts again.
	s.Reset("agent-1")
	if s.Tripped("agent-1") || s.Score("agent-1") != 0 {
		t.Error("reset did not clear the sandbox")
	}
	// Other sandboxes are unaffected by this one's events.
	if s.Score("agent-2") != 0 {
		t.Error("score leaked between sandboxes")
	}
}

func TestSlowEscapeOutsideWindowDoesNotCross(t *testing.T) {
	c := newClock()
	s := newScorer(c)
	for _, ev := range escapeSequence() {
		// One step every 61 s: no two steps share a 60 s window.
		c.advance(61 * time.Second)
		if d := s.Observe(ev); d != nil {
			t.Fatalf("crossed with steps 61 s apart: %s", d.Summary())
		}
	}
	// The same steps in quick succession do cross: the window matters.
	c.advance(time.Hour)
	crossed := false
	for _, ev := range escapeSequence() {
		c.advance(100 * time.Millisecond)
		crossed = crossed || s.Observe(ev) != nil
	}
	if !crossed {
		t.Fatal("fast sequence did not cross")
	}
}

func TestOneRepeatedSignalIsCapped(t *testing.T) {
	c := newClock()
	s := newScorer(c)
	// A script retrying a refused connection 200 times, and ps reading
	// every process's status.
	for i := 0; i < 200; i++ {
		c.advance(10 * time.Millisecond)
		ev := audit.Event{Kind: audit.KindNet, Verdict: audit.VerdictDenied, Sandbox: sandbox, Process: proc(77, "pip"),
			Net: &audit.NetDetail{Op: "connect", Addr: "203.0.113.7", Port: 443}}
		if d := s.Observe(ev); d != nil {
			t.Fatalf("repeated refused connects crossed: %s", d.Summary())
		}
		ps := open("/proc/"+strconv.Itoa(100+i)+"/status", false, audit.VerdictAllowed)
		if d := s.Observe(ps); d != nil {
			t.Fatalf("ps crossed: %s", d.Summary())
		}
	}
	w := DefaultWeights()[SigConnectDenied]
	if got := s.Score("agent-1"); got != w.Cap {
		t.Fatalf("score %v, want the connect_denied cap %v", got, w.Cap)
	}
}

func TestClassify(t *testing.T) {
	self := proc(500, "go")
	cases := []struct {
		ev   audit.Event
		want Signal
	}{
		{audit.Event{Kind: audit.KindFileOpen, Process: self, File: &audit.FileDetail{Path: "/proc/500/mountinfo"}}, ""},
		{audit.Event{Kind: audit.KindFileOpen, Process: self, File: &audit.FileDetail{Path: "/proc/self/status"}}, ""},
		{audit.Event{Kind: audit.KindFileOpen, Process: self, File: &audit.FileDetail{Path: "/proc/1/ns/net"}}, SigNamespace},
		{audit.Event{Kind: audit.KindFileOpen, Process: self, File: &audit.FileDetail{Path: "/proc/77/task/78/mem"}}, SigProcMem},
		{audit.Event{Kind: audit.KindFileOpen, Process: self, File: &audit.FileDetail{Path: "/proc/77/cmdline"}}, ""},
		{audit.Event{Kind: audit.KindFileOpen, Process: self, File: &audit.FileDetail{Path: "/proc/sys/kernel/core_pattern", Write: true}}, SigEscapeHook},
		{audit.Event{Kind: audit.KindFileOpen, Process: self, File: &audit.FileDetail{Path: "/proc/sys/vm/overcommit_memory"}}, ""},
		{audit.Event{Kind: audit.KindFileOpen, Process: self, File: &audit.FileDetail{Path: "/proc/sys/net/core/somaxconn", Write: true}}, SigProcSysWrite},
		{audit.Event{Kind: audit.KindFileOpen, Process: self, File: &audit.FileDetail{Path: "/sys/fs/cgroup/x/cgroup.procs", Write: true}}, SigCgroupMove},
		{audit.Event{Kind: audit.KindFileOpen, Process: self, File: &audit.FileDetail{Path: "/sys/fs/cgroup/x/cpu.max"}}, ""},
		{audit.Event{Kind: audit.KindFileOpen, Process: self, File: &audit.FileDetail{Path: "/sys/kernel/security/lsm"}}, SigSysInternal},
		{audit.Event{Kind: audit.KindFileOpen, Process: self, File: &audit.FileDetail{Path: "/dev/urandom"}}, ""},
		{audit.Event{Kind: audit.KindFileOpen, Process: self, File: &audit.FileDetail{Path: "/dev/pts/3", Write: true}}, ""},
		{audit.Event{Kind: audit.KindFileOpen, Process: self, File: &audit.FileDetail{Path: "/dev/nvme0n1"}}, SigDevInternal},
		{audit.Event{Kind: audit.KindFileOpen, Process: self, File: &audit.FileDetail{Path: "/etc/ssh/ssh_host_ed25519_key"}}, SigCredential},
		{audit.Event{Kind: audit.KindFileOpen, Process: self, File: &audit.FileDetail{Path: "/etc/ssh/ssh_host_ed25519_key.pub"}}, ""},
		{audit.Event{Kind: audit.KindFileOpen, Process: self, File: &audit.FileDetail{Path: "/var/run/secrets/kubernetes.io/serviceaccount/token"}}, SigCredential},
		{audit.Event{Kind: audit.KindNet, Verdict: audit.VerdictAllowed, Net: &audit.NetDetail{Op: "connect", Addr: "/var/run/docker.sock"}}, SigHostAPI},
		{audit.Event{Kind: audit.KindNet, Verdict: audit.VerdictAllowed, Net: &audit.NetDetail{Op: "connect", Addr: "169.254.169.254", Port: 80}}, SigHostAPI},
		{audit.Event{Kind: audit.KindNet, Verdict: audit.VerdictAllowed, Net: &audit.NetDetail{Op: "connect", Addr: "151.101.0.223", Port: 443}}, ""},
		{audit.Event{Kind: audit.KindNet, Verdict: audit.VerdictDenied, Net: &audit.NetDetail{Op: "sock_create", Type: 3}}, SigRawSocket},
		{audit.Event{Kind: audit.KindMount, Mount: &audit.MountDetail{Op: "pivot_root"}}, SigRootChange},
		{audit.Event{Kind: audit.KindSignal, Verdict: audit.VerdictAllowed, Target: &audit.TargetDetail{PID: 9}}, ""},
		{audit.Event{Kind: audit.KindSignal, Verdict: audit.VerdictDenied, Target: &audit.TargetDetail{PID: 1}}, SigAgentAttack},
		{audit.Event{Kind: audit.KindSignal, Verdict: audit.VerdictKilled, Target: &audit.TargetDetail{PID: 1, Mode: 9}}, SigAgentKill},
		{audit.Event{Kind: audit.KindSignal, Verdict: audit.VerdictKilled, Target: &audit.TargetDetail{PID: 1, Mode: 28}}, SigAgentAttack},
		// signal_generate's record of a file owner's signal (F_SETSIG) sent by a write.
		{audit.Event{Kind: audit.KindSyscall, Verdict: audit.VerdictKilled, Target: &audit.TargetDetail{PID: 1},
			Syscall: &audit.SyscallDetail{Nr: 1, Name: "write"}, Message: "category=signal_agent ret=0"}, SigAgentKill},
		{audit.Event{Kind: audit.KindSyscall, Verdict: audit.VerdictKilled, Target: &audit.TargetDetail{PID: 1},
			Syscall: &audit.SyscallDetail{Nr: 1, Name: "write"}, Message: "category=io_uring ret=0"}, ""},
		{audit.Event{Kind: audit.KindCapability, Target: &audit.TargetDetail{Capability: 21}}, SigCapability},
		{audit.Event{Kind: audit.KindCapability, Target: &audit.TargetDetail{Capability: 0}}, ""},
		{audit.Event{Kind: audit.KindSyscall, Syscall: &audit.SyscallDetail{Name: "open_by_handle_at"}}, SigEscapeHook},
		{audit.Event{Kind: audit.KindDNS, DNS: &audit.DNSDetail{Name: "x.example"}}, ""},
	}
	for _, c := range cases {
		got, _, _ := Classify(&c.ev)
		if got != c.want {
			desc := string(c.ev.Kind)
			if c.ev.File != nil {
				desc += " " + c.ev.File.Path
			}
			t.Errorf("Classify(%s) = %q, want %q", desc, got, c.want)
		}
	}
	if _, m, _ := Classify(&audit.Event{Kind: audit.KindFileOpen, Process: self, File: &audit.FileDetail{Path: "/proc/1/environ"}}); m != 2 {
		t.Errorf("PID 1 multiplier %v", m)
	}
}

// TestAgentKillIsDecisive: one signal that lands on the agent trips the
// sandbox whatever its threshold; a refused harmless signal does not.
func TestAgentKillIsDecisive(t *testing.T) {
	c := newClock()
	s := New(Config{Now: c.now, Limits: func(string) (float64, time.Duration, bool) { return 500, time.Minute, true }})
	sb := audit.Sandbox{Name: "agent-1", CgroupID: 7}
	winch := audit.Event{Kind: audit.KindSignal, Verdict: audit.VerdictKilled, Sandbox: sb, Target: &audit.TargetDetail{PID: 1, Mode: 28}}
	if d := s.Observe(winch); d != nil {
		t.Fatalf("a refused SIGWINCH to the agent tripped threshold 500: %s", d.Summary())
	}
	kill := audit.Event{Kind: audit.KindSyscall, Verdict: audit.VerdictKilled, Sandbox: sb, Target: &audit.TargetDetail{PID: 1},
		Syscall: &audit.SyscallDetail{Nr: 1, Name: "write"}, Message: "category=signal_agent ret=0"}
	d := s.Observe(kill)
	if d == nil {
		t.Fatal("a file-owner signal that reached the agent did not trip its sandbox")
	}
	if d.Sandbox != "agent-1" || d.CgroupID != 7 || d.Signals[SigAgentKill] == 0 {
		t.Errorf("decision %+v", d)
	}
	if s.Observe(kill) != nil {
		t.Error("a second decision before Reset")
	}
}

func TestEventsOutsideSandboxesAndDisabledSandboxes(t *testing.T) {
	c := newClock()
	s := New(Config{Now: c.now, Limits: func(sb string) (float64, time.Duration, bool) {
		return 100, time.Minute, sb != "agent-1"
	}})
	for _, ev := range escapeSequence() {
		host := ev
		host.Sandbox = audit.Sandbox{}
		if s.Observe(host) != nil || s.Observe(ev) != nil {
			t.Fatal("decision for a host event or a sandbox with the escape watch off")
		}
	}
	if len(s.Scores()) != 0 {
		t.Errorf("scores kept: %v", s.Scores())
	}
}

// --- Benign workloads, replayed from strace recordings (testdata/gen.sh).

var (
	straceLine = regexp.MustCompile(`^(\d+)\s+(?:<\.\.\. (\w+) resumed>|(\w+)\()(.*)$`)
	openArgs   = regexp.MustCompile(`^(?:(AT_FDCWD|\d+)(?:<([^>]*)>)?, )?"((?:[^"\\]|\\.)*)", ([A-Z_|0-9]+)`)
	result     = regexp.MustCompile(`\)\s+= (-?\d+)(?:<([^>]*)>)?`)
	unixAddr   = regexp.MustCompile(`sun_path=@?"([^"]*)"`)
	inetAddr   = regexp.MustCompile(`sin6?_port=htons\((\d+)\).*?(?:inet_addr\("([^"]+)"\)|inet_pton\(AF_INET6, "([^"]+)"\))`)
)

// replayStrace turns an strace -f -y recording into the events the kernel
// side would report for a sandbox, in order.
func replayStrace(t *testing.T, file string) []audit.Event {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tgid := map[uint32]uint32{}
	pending := map[uint32]string{}
	var evs []audit.Event
	sc := bufio.NewScanner(zr)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		m := straceLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		p64, _ := strconv.ParseUint(m[1], 10, 32)
		pid := uint32(p64)
		name, rest := m[3], m[4]
		if m[2] != "" { // "<... openat resumed>": join with the start
			name, rest = m[2], pending[pid]+rest
			delete(pending, pid)
		}
		if strings.HasSuffix(rest, "<unfinished ...>") {
			pending[pid] = strings.TrimSuffix(rest, "<unfinished ...>")
			continue
		}
		if _, ok := tgid[pid]; !ok {
			tgid[pid] = pid
		}
		pr := audit.Process{PID: pid, TGID: tgid[pid], CgroupID: 4242}
		res := result.FindStringSubmatch(rest)
		switch name {
		case "clone", "clone3", "fork", "vfork":
			if res != nil {
				if child, err := strconv.ParseUint(res[1], 10, 32); err == nil && child > 0 {
					if strings.Contains(rest, "CLONE_THREAD") {
						tgid[uint32(child)] = tgid[pid]
					} else {
						tgid[uint32(child)] = uint32(child)
					}
				}
			}
		case "openat", "open", "creat":
			a := openArgs.FindStringSubmatch(rest)
			if a == nil {
				t.Fatalf("unparsed %s line: %s", name, sc.Text())
			}
			p := a[3]
			if res != nil && res[2] != "" {
				p = res[2] // the kernel-resolved path strace -y shows
			} else if !strings.HasPrefix(p, "/") {
				p = path.Join(a[2], p)
			}
			write := name == "creat" || strings.Contains(a[4], "O_WRONLY") || strings.Contains(a[4], "O_RDWR") ||
				strings.Contains(a[4], "O_CREAT") || strings.Contains(a[4], "O_TRUNC")
			evs = append(evs, audit.Event{Kind: audit.KindFileOpen, Verdict: audit.VerdictAllowed, Sandbox: sandbox,
				Process: pr, File: &audit.FileDetail{Path: p, Write: write}})
		case "connect":
			n := &audit.NetDetail{Op: "connect"}
			if u := unixAddr.FindStringSubmatch(rest); u != nil {
				n.Addr = u[1]
			} else if in := inetAddr.FindStringSubmatch(rest); in != nil {
				port, _ := strconv.Atoi(in[1])
				n.Port, n.Addr = uint16(port), in[2]+in[3]
			} else {
				continue
			}
			evs = append(evs, audit.Event{Kind: audit.KindNet, Verdict: audit.VerdictAllowed, Sandbox: sandbox, Process: pr, Net: n})
		default:
			// The recordings trace the escape-relevant syscalls too: any
			// that a benign workload makes must show up in the score.
			evs = append(evs, audit.Event{Kind: audit.KindSyscall, Verdict: audit.VerdictAllowed, Sandbox: sandbox,
				Process: pr, Syscall: &audit.SyscallDetail{Name: name}})
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return evs
}

var benignWorkloads = []struct {
	file    string
	minOpen int
}{
	{"testdata/go-build.strace.gz", 5000},
	{"testdata/python-script.strace.gz", 500},
	{"testdata/git-workspace.strace.gz", 500},
	{"testdata/diagnostics.strace.gz", 500},
}

func TestBenignWorkloadsStayBelowThreshold(t *testing.T) {
	for _, w := range benignWorkloads {
		t.Run(path.Base(w.file), func(t *testing.T) {
			evs := replayStrace(t, w.file)
			opens := 0
			for _, ev := range evs {
				if ev.Kind == audit.KindFileOpen {
					opens++
				}
			}
			if opens < w.minOpen {
				t.Fatalf("%d opens parsed from %s, expected at least %d: parser broken?", opens, w.file, w.minOpen)
			}
			c := newClock()
			s := newScorer(c)
			var max float64
			signals := map[Signal]int{}
			for _, ev := range evs {
				// 1 ms apart: the whole workload inside one window, the
				// worst case for a sliding-window score.
				c.advance(time.Millisecond)
				if sig, _, ok := Classify(&ev); ok {
					signals[sig]++
				}
				if d := s.Observe(ev); d != nil {
					t.Fatalf("benign workload crossed the threshold: %s\nevidence: %+v", d.Summary(), d.Evidence)
				}
				if sc := s.Score("agent-1"); sc > max {
					max = sc
				}
			}
			t.Logf("%s: %d events (%d opens), max score %.1f of 100, signals %v", path.Base(w.file), len(evs), opens, max, signals)
			// Well clear of the threshold, not just below it.
			if max >= 50 {
				t.Errorf("max score %.1f: a benign workload should stay below half the threshold", max)
			}
		})
	}
}

// An escape attempt inside a busy benign workload is still caught: routine
// events do not dilute the score.
func TestEscapeInsideBenignWorkloadIsCaught(t *testing.T) {
	evs := replayStrace(t, benignWorkloads[0].file)
	esc := escapeSequence()
	c := newClock()
	s := newScorer(c)
	step := len(evs) / (len(esc) + 1)
	var d *Decision
	for i, ev := range evs {
		c.advance(time.Millisecond)
		if got := s.Observe(ev); got != nil {
			t.Fatalf("crossed on a benign event %d", i)
		}
		if i > 0 && i%step == 0 && i/step-1 < len(esc) {
			if got := s.Observe(esc[i/step-1]); got != nil && d == nil {
				d = got
			}
		}
	}
	if d == nil {
		t.Fatalf("escape interleaved with a Go build was not caught (score %.1f)", s.Score("agent-1"))
	}
	for _, e := range d.Evidence {
		if e.Event.Process.PID != 3001 && e.Event.Process.PID != 3002 && e.Event.Process.PID != 3003 {
			t.Errorf("benign event in the evidence: %+v", e.Event)
		}
	}
}

// TestLeavesScoredApart: two `watcher exec` runs share a sandbox name; one
// replays the escape sequence, the other does benign work with a few
// refusals of its own. The decision names the attacker's leaf only, and
// the benign leaf's refusals never add to the attacker's score (or the
// reverse).
func TestLeavesScoredApart(t *testing.T) {
	c := newClock()
	s := New(Config{Threshold: 100, Window: time.Minute, Now: c.now,
		Leaf: func(ev *audit.Event) uint64 { return ev.Process.CgroupID }})
	const attacker, benign = 5001, 5002
	var decisions []*Decision
	for i, ev := range escapeSequence() {
		ev.Process.CgroupID = attacker
		if d := s.Observe(ev); d != nil {
			decisions = append(decisions, d)
		}
		// The neighbour reads /etc/shadow once (refused) between steps.
		if i == 2 {
			nb := open("/etc/shadow", false, audit.VerdictDenied)
			nb.Process.CgroupID = benign
			if d := s.Observe(nb); d != nil {
				t.Fatalf("benign leaf tripped: %s", d.Summary())
			}
		}
		c.advance(time.Second)
	}
	if len(decisions) != 1 || decisions[0].Leaf != attacker || decisions[0].Sandbox != sandbox.Name {
		t.Fatalf("decisions %+v, want one for leaf %d", decisions, attacker)
	}
	for _, e := range decisions[0].Evidence {
		if e.Event.Process.CgroupID != attacker {
			t.Fatalf("evidence from leaf %d in the attacker's decision", e.Event.Process.CgroupID)
		}
	}
	if !strings.Contains(decisions[0].Summary(), "cgroup 5001 of sandbox agent-1") {
		t.Errorf("summary %q does not name the leaf", decisions[0].Summary())
	}
	if !s.Tripped(sandbox.Name) || s.Score(sandbox.Name) < 100 {
		t.Errorf("sandbox score %v tripped %v", s.Score(sandbox.Name), s.Tripped(sandbox.Name))
	}
	s.Reset(sandbox.Name)
	if s.Tripped(sandbox.Name) || s.Score(sandbox.Name) != 0 {
		t.Error("Reset left a leaf's score")
	}
}
