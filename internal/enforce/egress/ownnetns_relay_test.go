package egress_test

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/enforce/egress"
	"github.com/watcherhq/watcher/internal/namerelay"
	"github.com/watcherhq/watcher/internal/nslisten"
)

// TestOwnNetnsNameBinding: a sandbox's TCP connection from its own
// network namespace (a veth to the CDN's namespace) is name-bound like
// one from the agent's: sent to the relay listener the agent opened in
// that namespace, which dials the destination from there. Before the
// listener exists the connect is refused (not let out bound only to the
// address).
func TestOwnNetnsNameBinding(t *testing.T) {
	rf := setupRelay(t)
	if rf.eg.HomeNetns() == 0 {
		t.Skip("netns cookies (SO_NETNS_COOKIE, kernel 5.14+) are not available")
	}
	rf.relay.SetNetnsLookup(func(ns uint64, src netip.AddrPort) (namerelay.Conn, bool) {
		r, ok := rf.eg.LookupRelayedIn(ns, src, time.Minute)
		return namerelay.Conn{SandboxID: r.SandboxID, Dest: r.Dest, PID: r.PID, Cgroup: r.Cgroup}, ok
	})
	m, err := nslisten.New(nslisten.Config{Kernel: rf.eg, DNS: rf.proxy.HandlePacket, DNS4: rf.proxy4, DNS6: rf.proxy6,
		Relay: rf.relay, RelayAddrs: rf.relay.Addrs()})
	if err != nil {
		t.Fatal(err)
	}
	of := m.NetnsOf
	rf.netnsOf.Store(&of)
	t.Cleanup(func() { m.Close(); rf.netnsOf.Store(nil) })
	own := newRoutedNetns(t, rf.net)
	curlIn := func(args ...string) (string, error) {
		args = append([]string{"netns", "exec", own.ns, "curl", "-4", "-sS", "--max-time", "10", "--cacert", rf.cdn.caFile}, args...)
		return rf.run(t, rf.sandbox, nil, "ip", args...)
	}
	cdnAt := "a.cdn.test:443:" + rf.net.allowed.String()

	t.Run("refused before a listener", func(t *testing.T) {
		// The address is admitted for the sandbox (resolved in the
		// agent's namespace), but the own namespace has no relay yet.
		if out, err := rf.curl(t, rf.sandbox, "-4", "https://a.cdn.test/"); err != nil {
			t.Fatalf("agent's namespace: %v: %s", err, out)
		}
		out, err := curlIn("--resolve", cdnAt, "https://a.cdn.test/")
		if err == nil || strings.Contains(out, "host=") {
			t.Fatalf("own namespace without a relay listener reached the server: %s", out)
		}
		rf.kernelEvents.wait(t, "netns refusal of the connect", func(ev audit.Event) bool {
			return ev.Net != nil && ev.Net.Reason == egress.ReasonText(egress.ReasonNetns) && ev.Net.Port == 443 &&
				ev.Net.Addr == rf.net.allowed.String()
		})
	})

	startIn(t, rf.sandbox, own.ns)
	sweep(t, m, rf.sandbox)
	if sp := m.Spaces(); len(sp) != 1 || sp[0].Ports.Relay4 == 0 || sp[0].Ports.DNS4 == 0 {
		t.Fatalf("namespaces after sweep: %+v", sp)
	}

	t.Run("allowed SNI passes through the relay", func(t *testing.T) {
		before := rf.relay.Stats().Passed
		out, err := curlIn("https://b.cdn.test/")
		if err != nil || out != "GET host=b.cdn.test sni=b.cdn.test" {
			t.Fatalf("curl in own namespace: %v: %s", err, out)
		}
		if rf.relay.Stats().Passed <= before {
			t.Fatal("the connection did not go through the relay")
		}
	})
	t.Run("fronted SNI refused and recorded", func(t *testing.T) {
		out, err := curlIn("--resolve", "forbidden.test:443:"+rf.net.allowed.String(), "https://forbidden.test/")
		if err == nil || strings.Contains(out, "host=") {
			t.Fatalf("fronted name reached the server: %s", out)
		}
		ev := rf.refusal(t, "forbidden.test", audit.VerdictDenied)
		if ev.Net.Addr != rf.net.allowed.String() || ev.Net.Port != 443 || ev.Process.CgroupID != rf.sbCg {
			t.Errorf("refusal event: %+v %+v", ev, ev.Net)
		}
	})
	t.Run("agent's namespace neighbour", func(t *testing.T) {
		out, err := rf.curl(t, rf.sandbox, "-4", "https://c.cdn.test/")
		if err != nil || out != "GET host=c.cdn.test sni=c.cdn.test" {
			t.Fatalf("agent's namespace: %v: %s", err, out)
		}
	})
	t.Run("relay dials from the client's namespace", func(t *testing.T) {
		// The server shows where the connection came from: the own
		// namespace's address when the relay dialled from there (from
		// the agent's it would be the host's end of the test network).
		srv := netip.AddrPortFrom(rf.net.allowed, 8081)
		ln := rf.net.listen(t, "tcp", srv).(net.Listener)
		go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			from, _ := netip.ParseAddrPort(r.RemoteAddr)
			fmt.Fprintf(w, "host=%s from=%s", r.Host, from.Addr())
		}))
		// As if the proxy had answered near.cdn.test with it.
		if err := rf.eg.Allow(sandboxID, []netip.Addr{rf.net.allowed}, time.Minute); err != nil {
			t.Fatal(err)
		}
		rf.answers.Record(sandboxID, "near.cdn.test.", []netip.Addr{rf.net.allowed}, time.Minute)
		before := rf.relay.Stats().Passed
		out, err := curlIn("--resolve", "near.cdn.test:8081:"+rf.net.allowed.String(), "http://near.cdn.test:8081/")
		if want := "host=near.cdn.test:8081 from=" + own.host.String(); err != nil || out != want {
			t.Fatalf("curl in own namespace: %v: %q, want %q", err, out, want)
		}
		if rf.relay.Stats().Passed <= before {
			t.Fatal("the connection did not go through the relay")
		}
	})
	t.Run("connections close with the namespace's listeners", func(t *testing.T) {
		m.Keep(nil)
		out, err := curlIn("--resolve", cdnAt, "https://a.cdn.test/")
		if err == nil || strings.Contains(out, "host=") {
			t.Fatalf("after the listeners closed the connect passed: %s", out)
		}
	})
}
