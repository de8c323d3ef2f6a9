package egress_test

import (
	"context"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/testkit/poll"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/dnsproxy"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/cgroupbpf"
	"github.com/watcherhq/watcher/internal/enforce/egress"
	"github.com/watcherhq/watcher/internal/enforce/egress/dnsbind"
	"github.com/watcherhq/watcher/internal/enforce/enforcetest"
	"github.com/watcherhq/watcher/internal/enforce/rules/egressrules"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv("WATCHER_TEST_HELPER"); mode != "" {
		helperMain(mode)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

const (
	sandboxID = 1
	recordID  = 2
	grace     = time.Second
)

// fixture is a sandbox (with a child cgroup), a record-only sandbox, an
// outside cgroup, the test network, the real DNS proxy wired to the egress
// hooks, and an event reader.
type fixture struct {
	net                             *testNet
	eng                             *enforce.Engine
	eg                              *egress.Egress
	proxy                           *dnsproxy.Server
	proxy4, proxy6                  netip.AddrPort
	sandbox, child, record, outside string
	sbCg, recCg                     uint64
	admit                           *dnsbind.Admitter
	dir                             *dnsbind.Directory
	dnsEvents                       *eventLog
	kernelEvents                    *eventLog
	// onAnswer, when set, also sees every answer the proxy admits.
	onAnswer atomic.Pointer[func(dnsproxy.Answer)]
	// netnsOf, when set, tells the namespace of a listener in another
	// network namespace (ownnetns_test.go).
	netnsOf atomic.Pointer[func(netip.AddrPort) uint64]
}

type eventLog struct {
	mu  sync.Mutex
	evs []audit.Event
}

func (l *eventLog) Notify(ev audit.Event) error {
	l.mu.Lock()
	l.evs = append(l.evs, ev)
	l.mu.Unlock()
	return nil
}

// wait returns the first event matching pred, waiting up to 5s.
func (l *eventLog) wait(t *testing.T, what string, pred func(audit.Event) bool) audit.Event {
	t.Helper()
	var found audit.Event
	poll.Eventually(t, 5*time.Second, func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, ev := range l.evs {
			if pred(ev) {
				found = ev
				return true
			}
		}
		return false
	}, "no event for %s", what)
	return found
}

func setup(t testing.TB) *fixture {
	t.Helper()
	eng := enforcetest.Engine(t)
	if _, err := exec.LookPath("dig"); err != nil {
		t.Skip("dig (dnsutils) is not installed")
	}
	f := &fixture{eng: eng, net: newTestNet(t), dnsEvents: &eventLog{}, kernelEvents: &eventLog{}}
	var err error
	f.eg, err = egress.Load(eng, egress.Options{Grace: grace, Notify: func(ev audit.Event) { f.kernelEvents.Notify(ev) }})
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	t.Cleanup(func() { f.eg.Close() })

	dir := dnsbind.NewDirectory()
	dir.Set("sb", sandboxID)
	dir.Set("rec", recordID)
	f.admit = &dnsbind.Admitter{Egress: f.eg, Directory: dir}
	f.dir = dir
	pol := compiledPolicy(t, dnsSandbox("sb", ".allowed.test, .cdn.test", "")+dnsSandbox("rec", ".allowed.test", "")).DNS
	f.proxy, err = dnsproxy.New(dnsproxy.Config{
		Listeners: []dnsproxy.Listener{{Addr: "127.0.0.1:0"}, {Addr: "[::1]:0"}},
		Upstreams: []string{netip.AddrPortFrom(f.net.dnsSrv, 53).String()},
		Policy:    pol,
		Sandboxes: dnsbind.Resolver{Egress: f.eg, Directory: dir, Netns: func(local netip.AddrPort) uint64 {
			if h := f.netnsOf.Load(); h != nil {
				return (*h)(local)
			}
			return 0
		}},
		Events: f.dnsEvents,
		OnAnswer: func(a dnsproxy.Answer) {
			f.admit.OnAnswer(a)
			if h := f.onAnswer.Load(); h != nil {
				(*h)(a)
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.proxy.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.proxy.Close() })
	for _, a := range f.proxy.Addrs() {
		ap := netip.MustParseAddrPort(strings.SplitN(a, ":", 2)[1])
		if ap.Addr().Is4() {
			f.proxy4 = ap
		} else {
			f.proxy6 = ap
		}
	}

	f.sandbox = enforcetest.Cgroup(t, "sandbox")
	f.child = enforcetest.Child(t, f.sandbox, "child")
	f.record = enforcetest.Cgroup(t, "record")
	f.outside = enforcetest.Cgroup(t, "outside")
	if f.sbCg, err = eng.AddSandbox(f.sandbox, sandboxID, 0); err != nil {
		t.Fatal(err)
	}
	if f.recCg, err = eng.AddSandbox(f.record, recordID, enforce.SandboxRecordOnly); err != nil {
		t.Fatal(err)
	}
	for _, id := range []uint32{sandboxID, recordID} {
		if err := f.eg.SetSandbox(id, egressrules.SandboxConfig{Proxy4: f.proxy4, Proxy6: f.proxy6}); err != nil {
			t.Fatal(err)
		}
	}
	for _, cg := range []string{f.sandbox, f.record} {
		if err := f.eg.Attach(cg); err != nil {
			t.Fatalf("attach: %v", err)
		}
		t.Cleanup(func() {
			if err := f.eg.Detach(cg); err != nil {
				t.Errorf("detach: %v", err)
			}
		})
	}

	rd := eng.NewReader(enforce.ReaderOptions{PollInterval: 20 * time.Millisecond})
	f.eg.RegisterEvents(rd)
	cgroupbpf.Register(rd)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rd.Run(ctx) }()
	go func() {
		for ev := range rd.Events() {
			f.kernelEvents.Notify(ev)
		}
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("reader: %v", err)
		}
	})
	return f
}

// op runs a helper operation in cgroup cg and returns its result and pid.
func (f *fixture) op(t testing.TB, cg, mode string, env ...string) (helperResult, int) {
	t.Helper()
	cmd := enforcetest.SelfCommand(t, cg, "TestEgress", mode, env...)
	out, _ := cmd.CombinedOutput()
	pid := 0
	if cmd.Process != nil {
		pid = cmd.Process.Pid
	}
	return parseHelper(out), pid
}

func (f *fixture) connect(t *testing.T, cg string, ap netip.AddrPort) (helperResult, int) {
	t.Helper()
	network := "tcp4"
	if ap.Addr().Is6() {
		network = "tcp6"
	}
	return f.op(t, cg, "connect", "WATCHER_ADDR="+ap.String(), "WATCHER_NET="+network)
}

func (f *fixture) resolveConnect(t *testing.T, cg, name string, server netip.Addr, v6, overTCP bool) helperResult {
	t.Helper()
	env := []string{"WATCHER_NAME=" + name, "WATCHER_DNS=" + netip.AddrPortFrom(server, 53).String(), "WATCHER_NET=tcp4"}
	if v6 {
		env[2] = "WATCHER_NET=tcp6"
	}
	if overTCP {
		env = append(env, "WATCHER_DNS_TCP=1")
	}
	r, _ := f.op(t, cg, "resolve-connect", env...)
	return r
}

// dig runs dig in cgroup cg and returns its output.
func dig(t *testing.T, cg string, args ...string) string {
	t.Helper()
	cmd := enforcetest.Command(t, cg, "dig", append([]string{"+tries=1", "+time=3"}, args...)...)
	out, _ := cmd.CombinedOutput()
	return string(out)
}

var statusRE = regexp.MustCompile(`status: ([A-Z]+)`)
var serverRE = regexp.MustCompile(`SERVER: ([^#\s]+)#(\d+)`)

// digResult extracts the status and the server dig says answered.
func digResult(out string) (status, server string) {
	if m := statusRE.FindStringSubmatch(out); m != nil {
		status = m[1]
	}
	if m := serverRE.FindStringSubmatch(out); m != nil {
		server = m[1] + "#" + m[2]
	}
	return
}

func mustOK(t *testing.T, what string, r helperResult, want string) {
	t.Helper()
	if !r.ok || r.text != want {
		t.Errorf("%s: %s, want ok %s", what, r, want)
	}
}

func mustEPERM(t *testing.T, what string, r helperResult) {
	t.Helper()
	if r.ok || r.text != "EPERM" {
		t.Errorf("%s: %s, want err EPERM", what, r)
	}
}

// netEvent waits for the refusal event of pid towards ap.
func (f *fixture) netEvent(t *testing.T, pid int, ap netip.AddrPort) audit.Event {
	t.Helper()
	return f.kernelEvents.wait(t, "refusal of "+ap.String(), func(ev audit.Event) bool {
		return ev.Kind == audit.KindNet && ev.Net != nil && ev.Process.TGID == uint32(pid) &&
			ev.Net.Addr == ap.Addr().String() && ev.Net.Port == ap.Port()
	})
}

func TestEgress(t *testing.T) {
	f := setup(t)
	n := f.net
	web := func(a netip.Addr) netip.AddrPort { return netip.AddrPortFrom(a, 80) }

	t.Run("resolve and connect to the allowed name", func(t *testing.T) {
		for _, cg := range []string{f.sandbox, f.child} {
			// The name server is an address where nothing listens: the
			// query only succeeds because the kernel sent it to the proxy.
			mustOK(t, "udp dns "+filepath.Base(cg), f.resolveConnect(t, cg, "allowed.test", n.dead, false, false), "allowed")
			mustOK(t, "tcp dns "+filepath.Base(cg), f.resolveConnect(t, cg, "allowed.test", n.dead, false, true), "allowed")
			mustOK(t, "ipv6 "+filepath.Base(cg), f.resolveConnect(t, cg, "allowed.test", n.dead6, true, false), "allowed6")
		}
		if _, ok := f.eg.Allowed(sandboxID)[n.allowed]; !ok {
			t.Errorf("allowed address not in the sandbox's allowlist: %v", f.eg.Allowed(sandboxID))
		}
		if st, _ := f.eg.Stats(); st.DNSRedirects == 0 || st.AllowedAnswer == 0 {
			t.Errorf("stats %+v", st)
		}
		// The proxy attributed the queries to the sandbox.
		f.dnsEvents.wait(t, "proxy decision for sb", func(ev audit.Event) bool {
			return ev.Sandbox.Name == "sb" && ev.DNS != nil && strings.HasPrefix(ev.DNS.Name, "allowed.test")
		})
	})

	t.Run("direct connection to the forbidden address", func(t *testing.T) {
		for _, cg := range []string{f.sandbox, f.child} {
			for _, ap := range []netip.AddrPort{web(n.forbidden), web(n.forbidden6), netip.AddrPortFrom(n.forbidden, 22)} {
				r, pid := f.connect(t, cg, ap)
				mustEPERM(t, "connect "+ap.String()+" in "+filepath.Base(cg), r)
				ev := f.netEvent(t, pid, ap)
				cgID, _ := cgroupfs.ID(cg)
				if ev.Verdict != audit.VerdictDenied || ev.Sandbox.CgroupID != f.sbCg || ev.Process.CgroupID != cgID ||
					ev.Process.Comm == "" || ev.Net.Op != "connect" || ev.Mechanism != "cgroup_bpf" ||
					!strings.Contains(ev.Net.Reason, "not resolved") {
					t.Errorf("event %+v net %+v", ev, ev.Net)
				}
			}
		}
		r, pid := f.op(t, f.sandbox, "udp", "WATCHER_ADDR="+netip.AddrPortFrom(n.forbidden, 9999).String())
		mustEPERM(t, "udp to forbidden", r)
		if ev := f.netEvent(t, pid, netip.AddrPortFrom(n.forbidden, 9999)); ev.Net.Op != "sendmsg" || ev.Net.Protocol != unix.IPPROTO_UDP {
			t.Errorf("udp event %+v", ev.Net)
		}
		// A resolved address takes no datagrams unless a rule opens
		// them for its name (admit_test.go).
		r, pid = f.op(t, f.sandbox, "udp", "WATCHER_ADDR="+netip.AddrPortFrom(n.allowed, 9999).String())
		mustEPERM(t, "udp to allowed", r)
		if ev := f.netEvent(t, pid, netip.AddrPortFrom(n.allowed, 9999)); ev.Net.Reason != "answered address, but not on a port or protocol its name allows" {
			t.Errorf("udp to allowed: reason %q", ev.Net.Reason)
		}
		// A DoH resolver at a hard-coded address is just another address.
		r, _ = f.connect(t, f.sandbox, netip.AddrPortFrom(n.doh, 443))
		mustEPERM(t, "DoH to a hard-coded resolver", r)
	})

	t.Run("dig at any address is answered by the proxy", func(t *testing.T) {
		for _, server := range []string{n.dnsSrv.String(), n.dead.String(), n.dnsSrv6.String(), "127.0.0.1"} {
			for _, proto := range []string{"+notcp", "+tcp"} {
				out := dig(t, f.sandbox, "@"+server, proto, "forbidden.test")
				status, from := digResult(out)
				want := server + "#53"
				if status != "NXDOMAIN" || from != want {
					t.Errorf("dig @%s %s forbidden.test in sandbox: status %q from %q, want NXDOMAIN from %s\n%s", server, proto, status, from, want, out)
				}
			}
		}
		// The upstream itself would have answered.
		before := n.queries.Load()
		out := dig(t, f.outside, "@"+n.dnsSrv.String(), "forbidden.test")
		if status, _ := digResult(out); status != "NOERROR" || !strings.Contains(out, n.forbidden.String()) {
			t.Errorf("dig outside: %s", out)
		}
		if n.queries.Load() == before {
			t.Error("the query from outside did not reach the upstream")
		}
		ev := f.dnsEvents.wait(t, "proxy block of forbidden.test", func(ev audit.Event) bool {
			return ev.DNS != nil && ev.DNS.Name == "forbidden.test." && ev.Verdict == audit.VerdictDenied
		})
		if ev.Sandbox.Name != "sb" {
			t.Errorf("proxy attributed the query to %q", ev.Sandbox.Name)
		}
	})

	t.Run("outside the sandbox nothing changes", func(t *testing.T) {
		r, _ := f.connect(t, f.outside, web(n.forbidden))
		mustOK(t, "connect forbidden outside", r, "forbidden")
		r, _ = f.connect(t, f.outside, web(n.forbidden6))
		mustOK(t, "connect forbidden6 outside", r, "forbidden6")
		r, _ = f.op(t, f.outside, "udp", "WATCHER_ADDR="+netip.AddrPortFrom(n.forbidden, 9999).String())
		mustOK(t, "udp outside", r, "ping")
		// Not redirected: the dead address does not answer.
		out := dig(t, f.outside, "@"+n.dead.String(), "+time=1", "allowed.test")
		if status, _ := digResult(out); status != "" {
			t.Errorf("dig at a dead address outside got an answer: %s", out)
		}
	})

	t.Run("record-only mode allows and records", func(t *testing.T) {
		r, pid := f.connect(t, f.record, web(n.forbidden))
		mustOK(t, "connect forbidden in record-only sandbox", r, "forbidden")
		ev := f.netEvent(t, pid, web(n.forbidden))
		if ev.Verdict != audit.VerdictRecorded || ev.Sandbox.CgroupID != f.recCg || ev.Severity != audit.SeverityAlert {
			t.Errorf("record-only event %+v", ev)
		}
	})

	t.Run("raw socket", func(t *testing.T) {
		hooks, err := cgroupbpf.Load(f.eng)
		if err != nil {
			t.Fatalf("load cgroupbpf: %v", err)
		}
		defer hooks.Close()
		cg, err := hooks.Attach(f.sandbox)
		if err != nil {
			t.Fatal(err)
		}
		defer hooks.Detach(cg)
		if err := hooks.SetSocketRules(cgroupbpf.DefaultSocketRules(99)); err != nil {
			t.Fatal(err)
		}
		r, _ := f.op(t, f.sandbox, "raw")
		mustEPERM(t, "raw socket in sandbox", r)
		r, _ = f.op(t, f.outside, "raw")
		mustOK(t, "raw socket outside", r, "raw socket")
	})

	t.Run("atomic red team DNS tests", func(t *testing.T) { testAtomic(t, f) })

	t.Run("DNS rebinding to local addresses", func(t *testing.T) { testRebinding(t, f) })

	t.Run("answers expire after TTL plus grace", func(t *testing.T) {
		n.ttl.Store(1)
		defer n.ttl.Store(60)
		// A name only this subtest asks, so no cached answer has a longer TTL.
		mustOK(t, "first resolve", f.resolveConnect(t, f.sandbox, "short.allowed.test", n.dead, false, false), "short")
		r, _ := f.connect(t, f.sandbox, web(n.short))
		mustOK(t, "connect before expiry", r, "short")
		time.Sleep(time.Second + grace + 500*time.Millisecond)
		r, pid := f.connect(t, f.sandbox, web(n.short))
		mustEPERM(t, "connect after expiry", r)
		if ev := f.netEvent(t, pid, web(n.short)); !strings.Contains(ev.Net.Reason, "expired") {
			t.Errorf("reason %q, want expired", ev.Net.Reason)
		}
		mustOK(t, "resolve again", f.resolveConnect(t, f.sandbox, "short.allowed.test", n.dead, false, false), "short")
		if removed, err := f.eg.Expire(); err != nil {
			t.Fatal(err)
		} else {
			t.Logf("expired %d entries", removed)
		}
	})

	if e := f.admit.Errors.Load(); e != 0 {
		t.Errorf("%d answers could not be admitted: %v", e, *f.admit.LastError.Load())
	}
}

// listenLoopback starts a TCP banner server on addr:0 and returns its port.
func listenLoopback(t *testing.T, addr string) netip.AddrPort {
	t.Helper()
	return netip.MustParseAddrPort(serveBanner(t, "tcp", addr+":0", "hello").String())
}

// serveBanner listens on network/addr and writes text to every connection
// until the test ends; it returns the bound address.
func serveBanner(t *testing.T, network, addr, text string) net.Addr {
	t.Helper()
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte(text + "\n"))
			c.Close()
		}
	}()
	return ln.Addr()
}

// TestRulesOverflowAndReattach uses loopback servers only: policy rules
// (services and CIDRs), the per-sandbox address cap, and a restarted agent.
func TestRulesOverflowAndReattach(t *testing.T) {
	eng := enforcetest.Engine(t)
	var notified []audit.Event
	var mu sync.Mutex
	eg, err := egress.Load(eng, egress.Options{MaxAddresses: 4, Grace: time.Minute, Notify: func(ev audit.Event) {
		mu.Lock()
		notified = append(notified, ev)
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	sb := enforcetest.Cgroup(t, "sb")
	if _, err := eng.AddSandbox(sb, sandboxID, 0); err != nil {
		t.Fatal(err)
	}
	svc := listenLoopback(t, "127.0.0.1")
	other := listenLoopback(t, "127.0.0.1")
	cidr := listenLoopback(t, "127.0.0.8")
	// A loopback service and a network rule, as the agent compiles them.
	pl := compiledPolicy(t, "  - name: sb\n    select: {cgroups: [/sb]}\n    egress:\n"+
		"      loopback: [{name: db, port: "+itoa(svc.Port())+"}]\n"+
		"      allow: [{cidr: 127.0.0.8/32, ports: ["+itoa(cidr.Port())+"], protocol: tcp}]\n")
	cfg := pl.Egress[pl.SandboxIDs["sb"]]
	if err := eg.SetSandbox(sandboxID, cfg); err != nil {
		t.Fatal(err)
	}
	if err := eg.Attach(sb); err != nil {
		t.Fatal(err)
	}
	detach := eg.Detach
	defer func() { detach(sb) }()
	f := &fixture{}
	conn := func(ap netip.AddrPort) helperResult {
		r, _ := f.connect(t, sb, ap)
		return r
	}
	mustOK(t, "service port", conn(svc), "hello")
	mustEPERM(t, "other loopback port", conn(other))
	mustOK(t, "cidr rule", conn(cidr), "hello")

	// Overflow: six addresses into a cap of four. The two earliest
	// expiries go, are counted and reported, and are refused again.
	evictFirst := netip.MustParseAddr("127.0.0.2")
	evicted := listenLoopback(t, evictFirst.String())
	keptAddr := netip.MustParseAddr("127.0.0.7")
	kept := listenLoopback(t, keptAddr.String())
	if err := eg.Allow(sandboxID, []netip.Addr{evictFirst}, time.Second); err != nil {
		t.Fatal(err)
	}
	mustOK(t, "allowed before overflow", conn(evicted), "hello")
	if err := eg.Allow(sandboxID, []netip.Addr{netip.MustParseAddr("127.0.0.3")}, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := eg.Allow(sandboxID, []netip.Addr{
		netip.MustParseAddr("127.0.0.4"), netip.MustParseAddr("127.0.0.5"),
		netip.MustParseAddr("127.0.0.6"), keptAddr,
	}, time.Hour); err != nil {
		t.Fatal(err)
	}
	allowed := eg.Allowed(sandboxID)
	if len(allowed) != 4 {
		t.Errorf("allowlist holds %d, want 4: %v", len(allowed), allowed)
	}
	for _, gone := range []string{"127.0.0.2", "127.0.0.3"} {
		if _, ok := allowed[netip.MustParseAddr(gone)]; ok {
			t.Errorf("%s not evicted", gone)
		}
	}
	st, err := eg.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.Overflow != 2 || st.OverflowBySbox[sandboxID] != 2 {
		t.Errorf("overflow %d (%v), want 2", st.Overflow, st.OverflowBySbox)
	}
	mu.Lock()
	if len(notified) != 1 || notified[0].Net == nil || !strings.Contains(notified[0].Net.Reason, "2 unexpired") {
		t.Errorf("overflow events %+v", notified)
	}
	mu.Unlock()
	mustEPERM(t, "evicted address", conn(evicted))
	mustOK(t, "kept address", conn(kept), "hello")

	// A restarted agent: the old one exits (its pins stay), a new Load
	// adopts the pinned maps, and a second Attach replaces the pinned links
	// with no gap.
	eg.Close()
	mustEPERM(t, "other port while no agent runs", conn(other))
	eg2, err := egress.Load(eng, egress.Options{MaxAddresses: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer eg2.Close()
	if got := eg2.Allowed(sandboxID); len(got) != 4 {
		t.Errorf("adopted allowlist %v", got)
	}
	detach = eg2.Detach
	if err := eg2.Attach(sb); err != nil {
		t.Fatal(err)
	}
	cgID, _ := cgroupfs.ID(sb)
	pins, _ := os.ReadDir(filepath.Join(enforce.LinkPinDir(eng.PinDir(), egress.Group), itoa64(cgID)))
	wantPins := 10 // 8 inet programs and the 2 unix socket programs
	if eg2.UnixErr() != nil {
		wantPins = 8
	}
	if len(pins) != wantPins {
		t.Errorf("%d link pins, want %d", len(pins), wantPins)
	}
	progs := attachedPrograms(t, sb, ebpf.AttachCGroupInet4Connect)
	if progs != 1 {
		t.Errorf("%d connect4 programs attached after re-attach, want 1", progs)
	}
	mustEPERM(t, "other port after re-attach", conn(other))
	mustOK(t, "kept address after re-attach", conn(kept), "hello")
}

func itoa(p uint16) string   { return strconv.Itoa(int(p)) }
func itoa64(v uint64) string { return strconv.FormatUint(v, 10) }

// attachedPrograms counts the programs attached to cgroup path for typ.
func attachedPrograms(t *testing.T, path string, typ ebpf.AttachType) int {
	t.Helper()
	fd, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer fd.Close()
	res, err := link.QueryPrograms(link.QueryOptions{Target: int(fd.Fd()), Attach: typ})
	if err != nil {
		t.Fatalf("query programs: %v", err)
	}
	return len(res.Programs)
}
