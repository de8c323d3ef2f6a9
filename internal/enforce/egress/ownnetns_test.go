package egress_test

import (
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/enforce/enforcetest"
)

// newLoopbackNetns makes a network namespace with only lo up, as a
// container without a network of its own would have; removed at cleanup.
func newLoopbackNetns(t *testing.T) *testNet {
	t.Helper()
	ns := &testNet{ns: "wtc-" + randHex(3)}
	run(t, "ip", "netns", "add", ns.ns)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns.ns).Run() })
	run(t, "ip", "-n", ns.ns, "link", "set", "lo", "up")
	return ns
}

// TestOwnNetnsDNSToday records today's limit (docs/operations/known-limits.md):
// a sandboxed process in its own network namespace has its DNS query
// redirected to the proxy's address *inside that namespace*, where nothing
// listens, so it gets no answer; the same query from the agent's namespace
// is answered (benign neighbour). A probe listener on the proxy's port
// inside the namespace shows where the query went. When the agent opens
// listeners in such namespaces, this test is to be turned around.
func TestOwnNetnsDNSToday(t *testing.T) {
	f := setup(t)
	server := netip.AddrPortFrom(f.net.dnsSrv, 53).String()
	digIn := func(ns string) string {
		args := []string{"+tries=1", "+time=2", "@" + f.net.dnsSrv.String(), "www.allowed.test", "A"}
		if ns != "" {
			args = append([]string{"netns", "exec", ns, "dig"}, args...)
			out, _ := enforcetest.Command(t, f.sandbox, "ip", args...).CombinedOutput()
			return string(out)
		}
		out, _ := enforcetest.Command(t, f.sandbox, "dig", args...).CombinedOutput()
		return string(out)
	}

	// Benign neighbour: the agent's namespace is answered by the proxy.
	out := digIn("")
	if status, srv := digResult(out); status != "NOERROR" {
		t.Fatalf("agent's namespace: status %q from %s, want NOERROR:\n%s", status, srv, out)
	}

	own := newLoopbackNetns(t)
	t.Run("nothing listens", func(t *testing.T) {
		out := digIn(own.ns)
		if status, _ := digResult(out); status != "" {
			t.Fatalf("own namespace got status %s to %s: the limit is gone, turn this test around:\n%s", status, server, out)
		}
		t.Logf("own namespace, %s: %s", server, lastLine(out))
	})

	t.Run("query lands on the proxy port inside", func(t *testing.T) {
		var pc net.PacketConn
		err := own.inNetns(func() error {
			var err error
			pc, err = net.ListenPacket("udp", netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), f.proxy4.Port()).String())
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		defer pc.Close()
		got := make(chan string, 1)
		go func() {
			buf := make([]byte, 2048)
			pc.SetReadDeadline(time.Now().Add(5 * time.Second))
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				got <- "error: " + err.Error()
				return
			}
			got <- from.String() + " " + string(buf[:n])
		}()
		digIn(own.ns)
		seen := <-got
		if !strings.Contains(seen, "allowed") {
			t.Fatalf("probe on 127.0.0.1:%d in %s saw %q, want the redirected query", f.proxy4.Port(), own.ns, seen)
		}
	})
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
