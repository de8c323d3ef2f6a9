// Package workloads runs the benign workload battery: scripted sessions of
// what coding and ops agents really do (sessions/*.sh), offline and
// self-contained, under the restricted, dev, ops and read-only presets, through
// `watcher exec` and in a runtime-placed cgroup under a running agent, in
// enforce and in record mode. Every session must pass with zero refusals
// (and, in record mode, zero would-refuse events).
package workloads

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/watcherhq/watcher/internal/agent"
	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/control"
	"github.com/watcherhq/watcher/internal/launch"
	"github.com/watcherhq/watcher/internal/tail"
	"github.com/watcherhq/watcher/internal/testkit/e2etest"
	"github.com/watcherhq/watcher/internal/testkit/poll"
)

// sessions and the sandboxes each runs in.
var sessions = []struct {
	name     string
	presets  []string
	readOnly bool // reads only: also under read-only
}{
	{"git", []string{"restricted", "dev", "ops"}, false},
	{"python", []string{"restricted", "dev", "ops"}, false},
	{"node", []string{"restricted", "dev", "ops"}, false},
	{"go", []string{"restricted", "dev", "ops"}, false},
	{"c", []string{"restricted", "dev", "ops"}, false},
	{"shell", []string{"restricted", "dev", "ops"}, false},
	{"net", []string{"restricted", "dev", "ops"}, false},
	{"read", []string{"read-only", "restricted", "dev", "ops"}, true},
}

// sandboxes of the battery's policy: one per preset, and record-mode twins.
var sandboxes = []struct{ name, preset, mode string }{
	{"restricted", "restricted", "enforce"},
	{"dev", "dev", "enforce"},
	{"ops", "ops", "enforce"},
	{"read-only", "read-only", "enforce"},
	{"restricted-record", "restricted", "record"},
	{"dev-record", "dev", "record"},
}

func TestMain(m *testing.M) {
	code := m.Run()
	e2etest.RemoveBinaries() // the watcher binary built once for all tests
	os.Exit(code)
}

// battery is one run's world: a home, workspaces, a loopback HTTP server
// and DNS upstream, and a running agent with the battery's policy.
type battery struct {
	*e2etest.World // the agent's pins, sockets, ledger and cgroups
	t              *testing.T
	id             string
	bin            string
	base           string // /tmp/wl-ID: workspaces live under /tmp on purpose
	home           string // /home/wl-ID: matched by the presets' /home/*/ rules
	src            string // a small checkout for the reading session
	cgroup         string // /watcher-wl-ID
	cgAbs          string
	socket         string
	httpNm         string
	httpPt         int
	agent          *e2etest.Process

	mu     sync.Mutex
	events []audit.Event
	stream *tail.Stream
}

func newBattery(t *testing.T) *battery {
	t.Helper()
	if launch.LandlockABI() == 0 {
		t.Skip("Landlock is not available on this kernel")
	}
	for _, tool := range []string{"git", "python3", "npm", "node", "go", "gcc", "make", "zstd", "ssh-keygen", "curl", "bash"} {
		if _, err := exec.LookPath(tool); err != nil {
			if _, err2 := os.Stat("/usr/local/go/bin/" + tool); tool != "go" || err2 != nil {
				t.Fatalf("%s is missing (scripts/setup.sh installs it): %v", tool, err)
			}
		}
	}
	w := e2etest.New(t, "wl")
	b := &battery{World: w, t: t, id: w.ID, cgroup: w.Cgroup, cgAbs: w.CgAbs, socket: w.ControlSocket()}
	b.base = "/tmp/wl-" + b.id
	b.home = "/home/wl-" + b.id
	b.httpNm = "wl-" + b.id + ".test"
	t.Cleanup(b.cleanup)
	for _, d := range []string{b.base, b.home + "/.cache", b.home + "/.npm", b.home + "/.config/wl", b.home + "/go"} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(b.home+"/.gitconfig", []byte("[user]\n\tname = Workload Battery\n\temail = wl@example.com\n[init]\n\tdefaultBranch = main\n"), 0o644)
	os.WriteFile(b.home+"/.config/wl/settings", []byte("x=1\n"), 0o644)
	for _, sb := range sandboxes {
		os.MkdirAll(filepath.Join(b.base, "ws-"+sb.name), 0o755)
	}
	b.src = filepath.Join(b.base, "src")
	os.MkdirAll(filepath.Join(b.src, "pkg"), 0o755)
	os.WriteFile(filepath.Join(b.src, "pkg", "a.go"), []byte("package pkg\n\nfunc A() {}\n"), 0o644)
	if out, err := b.bare("git init -q && git add -A && git commit -q -m init", b.src, nil); err != nil {
		t.Fatalf("prepare the checkout: %v\n%s", err, out)
	}
	b.bin = buildWatcher(t)
	return b
}

// buildWatcher builds cmd/watcher, or takes WATCHER_BIN (test/vm/run.sh
// --hostroot builds it on the host: the guest under TCG links slowly).
func buildWatcher(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("WATCHER_BIN"); bin != "" {
		if _, err := os.Stat(bin); err != nil {
			t.Fatalf("WATCHER_BIN: %v", err)
		}
		return bin
	}
	return e2etest.Binary(t, "github.com/watcherhq/watcher/cmd/watcher")
}

// cleanup runs before the world's (its cgroups, pins and agent files go
// after): the agent has stopped (e2etest.Start registered that later).
func (b *battery) cleanup() {
	if b.stream != nil {
		b.stream.Close()
	}
	os.RemoveAll(b.base)
	os.RemoveAll(b.home)
}

// env is the sessions' environment: the battery's home, a plain PATH.
func (b *battery) env(dir string) []string {
	return []string{
		"PATH=/usr/local/go/bin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=" + b.home, "USER=root", "LANG=C.UTF-8", "TMPDIR=/tmp",
		"WL_DIR=" + dir, "WL_SRC=" + b.src,
		"WL_HTTP_NAME=" + b.httpNm, "WL_HTTP_PORT=" + strconv.Itoa(b.httpPt),
	}
}

// bare runs a shell command with no cage.
func (b *battery) bare(script, dir string, env []string) ([]byte, error) {
	cmd := exec.Command("bash", "-c", script)
	cmd.Dir = dir
	cmd.Env = env
	if env == nil {
		cmd.Env = b.env(dir)
	}
	return cmd.CombinedOutput()
}

// serveLoopback starts the HTTP server and the DNS upstream that answers
// the battery's name with 127.0.0.1.
func (b *battery) serveLoopback() (dnsAddr string) {
	t := b.t
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b.httpPt = ln.Addr().(*net.TCPAddr).Port
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello-from-loopback")
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := dns.NewServeMux()
	mux.HandleFunc(".", func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		if len(q.Question) == 1 && strings.EqualFold(q.Question[0].Name, b.httpNm+".") && q.Question[0].Qtype == dns.TypeA {
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.IPv4(127, 0, 0, 1)})
		} else if len(q.Question) == 1 && !strings.EqualFold(q.Question[0].Name, b.httpNm+".") {
			m.Rcode = dns.RcodeNameError
		}
		w.WriteMsg(m)
	})
	ds := &dns.Server{PacketConn: pc, Handler: mux}
	go ds.ActivateAndServe()
	t.Cleanup(func() { ds.Shutdown() })
	return pc.LocalAddr().String()
}

// startAgent writes the battery's policy and starts `watcher run`.
func (b *battery) startAgent() {
	t := b.t
	upstream := b.serveLoopback()
	var sbs strings.Builder
	for _, sb := range sandboxes {
		fmt.Fprintf(&sbs, `  - name: %s
    select: {cgroups: [%s/%s]}
    preset: %s
    mode: %s
    workspace: [%s]
    dns: {allow: [%s]}
    egress: {loopback: [{name: wl-http, port: %d}]}
`, sb.name, b.cgroup, sb.name, sb.preset, sb.mode, filepath.Join(b.base, "ws-"+sb.name), b.httpNm, b.httpPt)
		if err := cgroupfs.Create(filepath.Join(b.cgAbs, sb.name)); err != nil {
			t.Fatal(err)
		}
	}
	b.DNSUpstreams = []string{strconv.Quote(upstream)}
	pol := b.PolicyHead("127.0.0.1:"+strconv.Itoa(e2etest.FreePort(t))) + sbs.String()
	polPath := filepath.Join(b.AgentDir, "policy.yaml")
	if err := os.WriteFile(polPath, []byte(pol), 0o600); err != nil {
		t.Fatal(err)
	}
	b.agent = e2etest.Start(t, exec.Command(b.bin, "run", "--policy", polPath, "--quiet"))
	// Generous: under qemu TCG on a loaded host the agent takes minutes.
	start := time.Now()
	err := b.agent.WaitReady(5*time.Minute, func() bool {
		// status exits 1 also when a required layer is missing (on 6.1:
		// the cgroup unix socket hooks): up is an answer with a pid.
		var st control.Status
		out, _ := exec.Command(b.bin, "status", "--json", "--socket", b.socket).Output()
		if json.Unmarshal(out, &st) != nil || st.PID == 0 {
			return false
		}
		if len(st.Missing) > 0 {
			t.Logf("layers this kernel lacks: %s", strings.Join(st.Missing, "; "))
		}
		return true
	})
	if err != nil {
		t.Fatalf("agent did not come up in %s: %v", time.Since(start).Round(time.Second), err)
	}
	t.Logf("agent up in %s", time.Since(start).Round(10*time.Millisecond))
	// Where the start went (the agent logs it once Start returns, which
	// may be just after status first answers).
	poll.Within(5*time.Second, func() bool {
		_, rest, ok := strings.Cut(b.agent.Log.String(), `startup="`)
		if ok {
			line, _, _ := strings.Cut(rest, `"`)
			t.Logf("agent start-up: %s", line)
		}
		return ok
	})
	st, err := tail.Dial(b.EventsSocket(), tail.Filter{
		Verdicts: []audit.Verdict{audit.VerdictDenied, audit.VerdictKilled, audit.VerdictRecorded}})
	if err != nil {
		t.Fatal(err)
	}
	b.stream = st
	go func() {
		for {
			m, err := st.Next()
			if err != nil {
				return
			}
			if m.Event != nil {
				b.mu.Lock()
				b.events = append(b.events, *m.Event)
				b.mu.Unlock()
			}
		}
	}()
}

// result is one session's run.
type result struct {
	session, sandbox, path string
	ok                     bool
	output                 string
	wall                   time.Duration
	cgroupID               uint64
	label                  string
	refusals               []agent.Refusal // from watcher exec's report
}

// viaExec runs a session with `watcher exec` under the running agent.
func (b *battery) viaExec(session, sandbox string) result {
	r := result{session: session, sandbox: sandbox, path: "exec", label: "wl-" + sandbox + "-" + session}
	dir := filepath.Join(b.base, "ws-"+sandbox, session+"-exec")
	if session == "read" {
		dir = b.src
	} else {
		os.MkdirAll(dir, 0o755)
	}
	report := filepath.Join(b.base, "report-"+r.label+".json")
	cmd := exec.Command(b.bin, "exec", "--socket", b.socket, "--sandbox", sandbox, "--label", r.label, "--report", report, "--",
		"bash", sessionScript(session))
	cmd.Dir = dir
	cmd.Env = b.env(dir)
	start := time.Now()
	out, err := cmd.CombinedOutput()
	r.wall = time.Since(start)
	r.output = string(out)
	r.ok = err == nil && strings.Contains(r.output, session+"-ok")
	var rep agent.RunReport
	if data, err := os.ReadFile(report); err == nil && json.Unmarshal(data, &rep) == nil {
		r.refusals = rep.Refusals
	} else {
		r.ok = false
		r.output += "\n(no report)"
	}
	return r
}

// inRuntimeCgroup runs a session in a fresh cgroup below the sandbox's
// root, as a container runtime places a process (no seccomp, no
// Landlock: the kernel hooks alone).
func (b *battery) inRuntimeCgroup(session, sandbox string) result {
	r := result{session: session, sandbox: sandbox, path: "runtime"}
	dir := filepath.Join(b.base, "ws-"+sandbox, session+"-rt")
	if session == "read" {
		dir = b.src
	} else {
		os.MkdirAll(dir, 0o755)
	}
	cg := filepath.Join(b.cgAbs, sandbox, "rt-"+session)
	if err := cgroupfs.Create(cg); err != nil {
		r.output = err.Error()
		return r
	}
	defer func() { cgroupfs.Kill(cg); cgroupfs.Remove(cg) }()
	r.cgroupID, _ = cgroupfs.ID(cg)
	fd, err := os.Open(cg)
	if err != nil {
		r.output = err.Error()
		return r
	}
	defer fd.Close()
	cmd := exec.Command("bash", sessionScript(session))
	cmd.Dir = dir
	cmd.Env = b.env(dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(fd.Fd())}
	cmd.WaitDelay = 5 * time.Second
	start := time.Now()
	out, err := cmd.CombinedOutput()
	r.wall = time.Since(start)
	r.output = string(out)
	r.ok = err == nil && strings.Contains(r.output, session+"-ok")
	return r
}

func sessionScript(name string) string {
	p, _ := filepath.Abs(filepath.Join("sessions", name+".sh"))
	return p
}

// kernelRefusals returns the agent's refusal events of one run (by leaf
// cgroup for the runtime path, by label for watcher exec), as refusals.
func (b *battery) kernelRefusals(r result) []audit.Event {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []audit.Event
	for _, e := range b.events {
		if e.Sandbox.Name != r.sandbox {
			continue
		}
		if e.Verdict == audit.VerdictRecorded && e.Rule == "" {
			continue // routine records, not would-refuse
		}
		if (r.cgroupID != 0 && e.Process.CgroupID == r.cgroupID) || (r.label != "" && e.Sandbox.Labels["label"] == r.label) {
			out = append(out, e)
		}
	}
	return out
}

func describeEvent(e audit.Event) string {
	what := e.Message
	if e.File != nil {
		what = e.File.Path
	} else if e.Syscall != nil {
		what = e.Syscall.Name
	} else if e.DNS != nil {
		what = e.DNS.Name
	} else if e.Net != nil {
		what = fmt.Sprintf("%s %s:%d", e.Net.Op, e.Net.Addr, e.Net.Port)
	}
	if e.Target != nil {
		// The ptrace mode or the capability check's options (NOAUDIT
		// probes are the kernel asking, not the process).
		what += fmt.Sprintf(" target=%d/%s mode=%#x", e.Target.PID, e.Target.Comm, e.Target.Mode)
	}
	return fmt.Sprintf("%s %s %s rule=%s by=%s comm=%s args=%q", e.Kind, e.Verdict, what, e.Rule, e.Mechanism, e.Process.Comm, e.Process.Args)
}

// TestBattery runs every session on both paths in every sandbox it
// belongs to and fails on any failed session, any refusal, and any
// would-refuse event in record mode. WL_ONLY and WL_SANDBOXES narrow it
// to the listed sessions and sandboxes (the qemu guest splits the battery
// over two boots and leaves out the record-mode twins: see Makefile).
func TestBattery(t *testing.T) {
	b := newBattery(t)
	b.startAgent()
	var results []result
	only := os.Getenv("WL_ONLY")        // comma-separated session names
	onlySB := os.Getenv("WL_SANDBOXES") // comma-separated sandbox names
	listed := func(list, name string) bool { return list == "" || strings.Contains(","+list+",", ","+name+",") }
	for _, s := range sessions {
		if !listed(only, s.name) {
			continue
		}
		for _, preset := range s.presets {
			for _, sb := range sandboxes {
				if sb.preset != preset || (sb.mode == "record" && s.readOnly && preset == "read-only") || !listed(onlySB, sb.name) {
					continue
				}
				start := time.Now()
				ex, rt := b.viaExec(s.name, sb.name), b.inRuntimeCgroup(s.name, sb.name)
				results = append(results, ex, rt)
				// Progress for long runs (the qemu guest): -v streams it.
				// Kernel refusal events are counted at the end.
				t.Logf("%s under %s: both paths in %s (exec ok=%t, %d refusals in its report; runtime ok=%t)", s.name, sb.name,
					time.Since(start).Round(100*time.Millisecond), ex.ok, len(ex.refusals), rt.ok)
			}
		}
	}
	// Events reach the tail within the reader's deadline.
	time.Sleep(500 * time.Millisecond)
	var table []string
	for _, r := range results {
		ev := b.kernelRefusals(r)
		status := "pass"
		if !r.ok || len(ev) > 0 || len(r.refusals) > 0 {
			status = "FAIL"
			t.Errorf("%s under %s via %s: ok=%t, %d kernel refusal events, %d in the exec report\n%s",
				r.session, r.sandbox, r.path, r.ok, len(ev), len(r.refusals), lastLines(r.output, 15))
			for _, e := range ev {
				t.Errorf("  %s", describeEvent(e))
			}
			for _, rf := range r.refusals {
				t.Errorf("  report: %s %s%s rule=%s layer=%s %s", rf.Operation, rf.Path, rf.Address, rf.Rule, rf.Layer, rf.Note)
			}
		}
		table = append(table, fmt.Sprintf("%-7s %-18s %-8s %s refusals=%d wall=%s", r.session, r.sandbox, r.path, status,
			len(ev)+len(r.refusals), r.wall.Round(10*time.Millisecond)))
	}
	sort.Strings(table)
	t.Logf("battery results (session, sandbox, path):\n%s", strings.Join(table, "\n"))
	if out := os.Getenv("WL_RESULTS"); out != "" {
		os.WriteFile(out, []byte(strings.Join(table, "\n")+"\n"), 0o644)
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
