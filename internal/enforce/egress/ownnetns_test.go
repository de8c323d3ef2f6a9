package egress_test

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/enforce/egress"
	"github.com/watcherhq/watcher/internal/enforce/enforcetest"
	"github.com/watcherhq/watcher/internal/netnsutil"
	"github.com/watcherhq/watcher/internal/nslisten"
)

// newRoutedNetns makes a network namespace for a sandboxed process, as a
// container on a bridge network has: lo up, and a veth pair to the test
// network's server namespace (198.19.x.0/24) as its default route. Its
// host is its own end of the pair, its allowed the server namespace's end.
// Removed at cleanup.
func newRoutedNetns(t *testing.T, srv *testNet) *testNet {
	t.Helper()
	suffix := randHex(3)
	ns := &testNet{ns: "wtc-" + suffix}
	run(t, "ip", "netns", "add", ns.ns)
	ownIf, srvIf := "wtc"+suffix+"o", "wtc"+suffix+"s"
	t.Cleanup(func() {
		exec.Command("ip", "netns", "del", ns.ns).Run()
		exec.Command("ip", "-n", srv.ns, "link", "del", srvIf).Run()
	})
	sub := fmt.Sprintf("198.19.%d", int(suffix[0])%250+2)
	run(t, "ip", "-n", ns.ns, "link", "set", "lo", "up")
	run(t, "ip", "-n", ns.ns, "link", "add", ownIf, "type", "veth", "peer", "name", srvIf, "netns", srv.ns)
	run(t, "ip", "-n", ns.ns, "addr", "add", sub+".2/24", "dev", ownIf)
	run(t, "ip", "-n", srv.ns, "addr", "add", sub+".1/24", "dev", srvIf)
	run(t, "ip", "-n", ns.ns, "link", "set", ownIf, "up")
	run(t, "ip", "-n", srv.ns, "link", "set", srvIf, "up")
	run(t, "ip", "-n", ns.ns, "route", "add", "default", "via", sub+".1")
	ns.host, ns.allowed = netip.MustParseAddr(sub+".2"), netip.MustParseAddr(sub+".1")
	return ns
}

// startIn starts a long-lived task of cgroup cg in namespace ns (a
// sandbox's process living there); killed at cleanup.
func startIn(t testing.TB, cg, ns string) *exec.Cmd {
	t.Helper()
	cmd := enforcetest.Command(t, cg, "ip", "netns", "exec", ns, "sleep", "120")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	want, err := netnsutil.Of("/run/netns/" + ns)
	if err != nil {
		t.Fatal(err)
	}
	if !waitFor(func() bool {
		got, err := netnsutil.Of(netnsutil.TaskPath(cmd.Process.Pid))
		return err == nil && got == want
	}) {
		t.Fatalf("task %d did not enter %s", cmd.Process.Pid, ns)
	}
	return cmd
}

// sweep is what the agent does at placement and on refusals: the
// namespaces of the tasks of the given cgroups get listeners, the others
// lose theirs.
func sweep(t testing.TB, m *nslisten.Manager, cgs ...string) {
	t.Helper()
	var pids []int
	for _, cg := range cgs {
		p, err := nslisten.CgroupTasks(cg)
		if err != nil {
			t.Fatal(err)
		}
		pids = append(pids, p...)
	}
	if err := m.Sweep(pids); err != nil {
		t.Fatalf("sweep: %v", err)
	}
}

func (f *fixture) netnsManager(t testing.TB) *nslisten.Manager {
	t.Helper()
	if f.eg.HomeNetns() == 0 {
		t.Skip("netns cookies (SO_NETNS_COOKIE, kernel 5.14+) are not available")
	}
	m, err := nslisten.New(nslisten.Config{Kernel: f.eg, DNS: f.proxy.HandlePacket, DNS4: f.proxy4, DNS6: f.proxy6})
	if err != nil {
		t.Fatal(err)
	}
	of := m.NetnsOf
	f.netnsOf.Store(&of)
	t.Cleanup(func() { m.Close(); f.netnsOf.Store(nil) })
	return m
}

// digNS runs dig in cgroup cg, inside network namespace ns ("" for the
// agent's), with extra dig arguments.
func (f *fixture) digNS(t *testing.T, cg, ns, name string, extra ...string) (out string, pid int) {
	t.Helper()
	args := append([]string{"+tries=1", "+time=2", "@" + f.net.dnsSrv.String(), name, "A"}, extra...)
	var cmd *exec.Cmd
	if ns != "" {
		cmd = enforcetest.Command(t, cg, "ip", append([]string{"netns", "exec", ns, "dig"}, args...)...)
	} else {
		cmd = enforcetest.Command(t, cg, "dig", args...)
	}
	b, _ := cmd.CombinedOutput()
	if cmd.Process != nil {
		pid = cmd.Process.Pid
	}
	return string(b), pid
}

// TestOwnNetnsDNS: a sandboxed process in its own network namespace has
// its DNS answered by the proxy through a listener the agent opened in
// that namespace. Before there is one, the query is refused with an event
// that says why (not sent where nothing listens); the agent's-namespace
// neighbour is answered throughout.
func TestOwnNetnsDNS(t *testing.T) {
	f := setup(t)
	m := f.netnsManager(t)
	own := newRoutedNetns(t, f.net)
	reason := egress.ReasonText(egress.ReasonNetns)

	t.Run("refused before a listener", func(t *testing.T) {
		out, pid := f.digNS(t, f.sandbox, own.ns, "www.allowed.test")
		if status, _ := digResult(out); status != "" {
			t.Fatalf("own namespace without listener got status %s:\n%s", status, out)
		}
		f.kernelEvents.wait(t, "netns refusal of dig", func(ev audit.Event) bool {
			return ev.Net != nil && ev.Process.TGID == uint32(pid) && ev.Net.Reason == reason && ev.Net.Port == 53 &&
				ev.Verdict == audit.VerdictDenied
		})
	})

	startIn(t, f.sandbox, own.ns)
	sweep(t, m, f.sandbox)
	spaces := m.Spaces()
	if len(spaces) != 1 || spaces[0].Ports.DNS4 == 0 || spaces[0].Ports.DNS4 == f.proxy4.Port() {
		t.Fatalf("namespaces after sweep: %+v (agent's proxy port %d)", spaces, f.proxy4.Port())
	}

	t.Run("allowed name answered", func(t *testing.T) {
		out, _ := f.digNS(t, f.sandbox, own.ns, "www.allowed.test")
		status, srv := digResult(out)
		if status != "NOERROR" || !strings.Contains(out, f.net.allowed.String()) {
			t.Fatalf("status %q, want NOERROR with %s:\n%s", status, f.net.allowed, out)
		}
		// recvmsg shows the server dig asked, not the listener.
		if want := f.net.dnsSrv.String() + "#53"; srv != want {
			t.Errorf("reply from %s, want %s", srv, want)
		}
		f.dnsEvents.wait(t, "proxy answer for the own namespace", func(ev audit.Event) bool {
			return ev.Sandbox.Name == "sb" && ev.DNS != nil && ev.DNS.Name == "www.allowed.test." && ev.Verdict == audit.VerdictAllowed
		})
	})
	t.Run("over tcp", func(t *testing.T) {
		out, _ := f.digNS(t, f.sandbox, own.ns, "tcp.allowed.test", "+tcp")
		if status, _ := digResult(out); status != "NOERROR" {
			t.Fatalf("status %q over TCP, want NOERROR:\n%s", status, out)
		}
	})
	t.Run("over ipv6", func(t *testing.T) {
		cmd := enforcetest.Command(t, f.sandbox, "ip", "netns", "exec", own.ns, "dig", "+tries=1", "+time=2",
			"@"+f.net.dnsSrv6.String(), "v6.allowed.test", "AAAA")
		b, _ := cmd.CombinedOutput()
		out := string(b)
		if status, srv := digResult(out); status != "NOERROR" || !strings.Contains(out, f.net.allowed6.String()) ||
			srv != f.net.dnsSrv6.String()+"#53" {
			t.Fatalf("status %q from %s, want NOERROR with %s from the server asked:\n%s", status, srv, f.net.allowed6, out)
		}
	})
	t.Run("unlisted name NXDOMAIN with the policy's reason", func(t *testing.T) {
		out, _ := f.digNS(t, f.sandbox, own.ns, "forbidden.test")
		if status, _ := digResult(out); status != "NXDOMAIN" {
			t.Fatalf("status %q, want NXDOMAIN:\n%s", status, out)
		}
		ev := f.dnsEvents.wait(t, "proxy block of forbidden.test", func(ev audit.Event) bool {
			return ev.DNS != nil && ev.DNS.Name == "forbidden.test." && ev.Verdict == audit.VerdictDenied
		})
		if ev.Sandbox.Name != "sb" || ev.DNS.Reason == "" {
			t.Errorf("block event: sandbox %q reason %q", ev.Sandbox.Name, ev.DNS.Reason)
		}
	})
	t.Run("answered address reachable, others refused", func(t *testing.T) {
		get := func(a netip.Addr) (string, error) {
			cmd := enforcetest.Command(t, f.sandbox, "ip", "netns", "exec", own.ns, "bash", "-c",
				fmt.Sprintf("exec 3<>/dev/tcp/%s/80 && head -1 <&3", a))
			b, err := cmd.CombinedOutput()
			return strings.TrimSpace(string(b)), err
		}
		if got, err := get(f.net.allowed); err != nil || got != "allowed" {
			t.Errorf("answered address: %q, %v; want the banner", got, err)
		}
		if got, err := get(f.net.forbidden); err == nil || !strings.Contains(got, "not permitted") {
			t.Errorf("unanswered address: %q, %v; want EPERM", got, err)
		}
	})
	t.Run("agent's namespace neighbour", func(t *testing.T) {
		out, _ := f.digNS(t, f.sandbox, "", "www.allowed.test")
		if status, _ := digResult(out); status != "NOERROR" {
			t.Fatalf("agent's namespace: status %q:\n%s", status, out)
		}
	})
}

// TestOwnNetnsSamePort: two namespaces whose clients use the same source
// port are told apart (the kernel's records carry the netns cookie), and
// a namespace loses its listeners when its last sandbox task is gone,
// after which nothing of the agent's holds it.
func TestOwnNetnsSamePort(t *testing.T) {
	f := setup(t)
	m := f.netnsManager(t)
	a := newLoopbackNetns(t)
	// b has no bind mount: only its task and the agent's listeners hold it.
	bTask := enforcetest.Command(t, f.record, "unshare", "-n", "sh", "-c", "ip link set lo up && exec sleep 120")
	if err := bTask.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bTask.Process.Kill(); bTask.Wait() })
	bPath := netnsutil.TaskPath(bTask.Process.Pid)
	if !waitFor(func() bool {
		id, err := netnsutil.Of(bPath)
		self, _ := netnsutil.Self()
		return err == nil && id != self
	}) {
		t.Fatal("unshare did not enter a namespace")
	}
	startIn(t, f.sandbox, a.ns)
	sweep(t, m, f.sandbox, f.record)
	if n := len(m.Spaces()); n != 2 {
		t.Fatalf("%d namespaces with listeners, want 2: %+v", n, m.Spaces())
	}
	bID, _ := netnsutil.Of(bPath)
	var aCookie, bCookie uint64
	for _, s := range m.Spaces() {
		if s.ID == bID {
			bCookie = s.Cookie
		} else {
			aCookie = s.Cookie
		}
	}

	const port = 41853
	src := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port)
	outA, _ := f.digNS(t, f.sandbox, a.ns, "a.allowed.test", "-b", "127.0.0.1#"+strconv.Itoa(port))
	digB := func() string {
		cmd := enforcetest.Command(t, f.record, "nsenter", "-t", strconv.Itoa(bTask.Process.Pid), "-n",
			"dig", "+tries=1", "+time=2", "@"+f.net.dnsSrv.String(), "b.allowed.test", "A", "-b", "127.0.0.1#"+strconv.Itoa(port))
		b, _ := cmd.CombinedOutput()
		return string(b)
	}
	outB := digB()
	for what, out := range map[string]string{"a": outA, "b": outB} {
		if status, _ := digResult(out); status != "NOERROR" {
			t.Fatalf("namespace %s: status %q:\n%s", what, status, out)
		}
	}
	ca, okA := f.eg.LookupClientIn(aCookie, "udp", src)
	cb, okB := f.eg.LookupClientIn(bCookie, "udp", src)
	if !okA || !okB || ca.SandboxID != sandboxID || cb.SandboxID != recordID {
		t.Fatalf("port %d: namespace a -> %+v (%v), b -> %+v (%v); want sandbox %d and %d", port, ca, okA, cb, okB, sandboxID, recordID)
	}
	for _, want := range []struct{ sb, name string }{{"sb", "a.allowed.test."}, {"rec", "b.allowed.test."}} {
		f.dnsEvents.wait(t, want.name+" for "+want.sb, func(ev audit.Event) bool {
			return ev.Sandbox.Name == want.sb && ev.DNS != nil && ev.DNS.Name == want.name
		})
	}

	t.Run("listeners go with the last task", func(t *testing.T) {
		bTask.Process.Kill()
		bTask.Wait()
		sweep(t, m, f.sandbox, f.record)
		if n := len(m.Spaces()); n != 1 {
			t.Fatalf("%d namespaces with listeners after b's task ended, want 1", n)
		}
		cookies, err := f.eg.Netns()
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(cookies, bCookie) || !slices.Contains(cookies, aCookie) {
			t.Errorf("kernel map %v after b's task ended: b %d must be gone, a %d kept", cookies, bCookie, aCookie)
		}
		if held := socketsIn(t, bCookie); held > 0 {
			t.Errorf("%d sockets of the agent still in namespace b", held)
		}
		if holders := nsHolders(bID); len(holders) > 0 {
			t.Errorf("namespace b still held by %v", holders)
		}
		// a is still served.
		if out, _ := f.digNS(t, f.sandbox, a.ns, "again.allowed.test"); !strings.Contains(out, "NOERROR") {
			t.Errorf("namespace a after b's removal:\n%s", out)
		}
	})
}

// socketsIn counts this process's sockets in the namespace with cookie c.
func socketsIn(t *testing.T, c uint64) int {
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range fds {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if got, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE); err == nil && got == c {
			n++
		}
	}
	return n
}

// nsHolders lists the /proc entries (a task's namespace or an open fd)
// that refer to namespace id.
func nsHolders(id netnsutil.ID) []string {
	var out []string
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		if got, err := netnsutil.Of(p + "/ns/net"); err == nil && got == id {
			out = append(out, p+"/ns/net")
		}
		fds, _ := filepath.Glob(p + "/fd/*")
		for _, fd := range fds {
			var st syscall.Stat_t
			if syscall.Stat(fd, &st) == nil && st.Ino == id.Ino && st.Dev == id.Dev {
				out = append(out, fd)
			}
		}
	}
	return out
}

func waitFor(cond func() bool) bool {
	for range 100 {
		if cond() {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

// newLoopbackNetns makes a network namespace with only lo up, as a
// container without a network of its own would have; removed at cleanup.
func newLoopbackNetns(t testing.TB) *testNet {
	t.Helper()
	ns := &testNet{ns: "wtc-" + randHex(3)}
	run(t, "ip", "netns", "add", ns.ns)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns.ns).Run() })
	run(t, "ip", "-n", ns.ns, "link", "set", "lo", "up")
	return ns
}

// TestOwnNetnsLoopbackDown: in a namespace whose lo is down the listeners
// still bind (the loopback addresses exist), and answer once lo is up,
// without another sweep; before, the namespace has no network at all.
func TestOwnNetnsLoopbackDown(t *testing.T) {
	f := setup(t)
	m := f.netnsManager(t)
	ns := &testNet{ns: "wtc-" + randHex(3)}
	run(t, "ip", "netns", "add", ns.ns)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns.ns).Run() })
	startIn(t, f.sandbox, ns.ns)
	sweep(t, m, f.sandbox)
	if sp := m.Spaces(); len(sp) != 1 || sp[0].Ports.DNS4 == 0 {
		t.Fatalf("namespaces with lo down: %+v, want one with a DNS listener", sp)
	}
	if out, _ := f.digNS(t, f.sandbox, ns.ns, "www.allowed.test"); strings.Contains(out, "NOERROR") {
		t.Fatalf("answered with lo down:\n%s", out)
	}
	run(t, "ip", "-n", ns.ns, "link", "set", "lo", "up")
	if out, _ := f.digNS(t, f.sandbox, ns.ns, "www.allowed.test"); !strings.Contains(out, "NOERROR") {
		t.Errorf("after lo came up:\n%s", out)
	}
}
