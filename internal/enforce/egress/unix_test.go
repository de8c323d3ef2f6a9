package egress_test

import (
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/enforce/enforcetest"
	"github.com/watcherhq/watcher/internal/enforce/rules/egressrules"
)

// TestUnixSocketsAndResolverPorts: a sandbox whose egress is not allow
// cannot reach host brokers over unix sockets (a stand-in for the D-Bus
// system bus, systemd-resolved's varlink socket, nscd, docker.sock): not by
// absolute path, not by a relative path, "..", nor an abstract name, by
// connect or by datagram; a socket inside its workspace still works. It
// cannot reach DNS over TLS or QUIC (853) at an answered address either,
// while port 80 there works.
func TestUnixSocketsAndResolverPorts(t *testing.T) {
	f := setup(t)
	if err := f.eg.UnixErr(); err != nil {
		t.Skipf("this kernel has no cgroup unix socket hooks: %v", err)
	}
	n := f.net
	base := t.TempDir()
	ws := filepath.Join(base, "workspace")
	hostRun := filepath.Join(base, "run")
	for _, d := range []string{ws, hostRun} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	broker := filepath.Join(hostRun, "system_bus_socket")
	serveBanner(t, "unix", broker, "broker")
	serveBanner(t, "unix", filepath.Join(ws, "dev.sock"), "workspace")
	abstract := "@watcher-test-" + randHex(4)
	serveBanner(t, "unix", abstract, "abstract")
	gram, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: filepath.Join(hostRun, "resolver.sock"), Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gram.Close() })
	wsGram, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: filepath.Join(ws, "log.sock"), Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { wsGram.Close() })
	dot := netip.AddrPortFrom(n.allowed, 853)
	dotLn := n.listen(t, "tcp", dot).(net.Listener)
	go func() {
		for {
			c, err := dotLn.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("dot\n"))
			c.Close()
		}
	}()

	const id = 5
	cg := enforcetest.Cgroup(t, "unix")
	if _, err := f.eng.AddSandbox(cg, id, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.eg.SetSandbox(id, egressrules.SandboxConfig{Proxy4: f.proxy4, Proxy6: f.proxy6,
		ResolverPorts: true, RestrictUnix: true, UnixPaths: []string{ws + "/"}}); err != nil {
		t.Fatal(err)
	}
	if err := f.eg.Attach(cg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.eg.Detach(cg) })
	f.dir.Set("sb", id) // the proxy's "sb" policy, answers admitted for id

	cases := []struct {
		what, mode, addr, dir string
		inside, outside       string
		reason                string
	}{
		{"host broker by absolute path", "unix-connect", broker, "", "err EPERM", "ok broker", "outside the sandbox's paths"},
		{"host broker by relative path", "unix-connect", "run/system_bus_socket", base, "err EPERM", "ok broker", "relative"},
		{"host broker through ..", "unix-connect", ws + "/../run/system_bus_socket", "", "err EPERM", "ok broker", `".."`},
		{"abstract socket", "unix-connect", abstract, "", "err EPERM", "ok abstract", "abstract"},
		{"datagram to a host resolver", "unixgram-send", filepath.Join(hostRun, "resolver.sock"), "", "err EPERM", "ok sent", "outside the sandbox's paths"},
		{"workspace socket", "unix-connect", filepath.Join(ws, "dev.sock"), "", "ok workspace", "ok workspace", ""},
		{"workspace datagram", "unixgram-send", filepath.Join(ws, "log.sock"), "", "ok sent", "ok sent", ""},
	}
	for _, c := range cases {
		env := []string{"WATCHER_ADDR=" + c.addr}
		if c.dir != "" {
			env = append(env, "WATCHER_DIR="+c.dir)
		}
		r, pid := f.op(t, cg, c.mode, env...)
		if r.String() != c.inside {
			t.Errorf("%s in the sandbox: %s, want %s", c.what, r, c.inside)
		} else if c.reason != "" {
			want := c.addr // as passed; abstract names as "@name"
			ev := f.kernelEvents.wait(t, "refusal of "+c.what, func(ev audit.Event) bool {
				return ev.Kind == audit.KindNet && ev.Net != nil && ev.Process.TGID == uint32(pid) && ev.Net.Family == 1
			})
			if !strings.Contains(ev.Net.Reason, c.reason) || ev.Net.Addr != want || ev.Verdict != audit.VerdictDenied {
				t.Errorf("%s: event addr %q reason %q verdict %s, want %q and %q", c.what, ev.Net.Addr, ev.Net.Reason, ev.Verdict, want, c.reason)
			}
		}
		if r, _ := f.op(t, f.outside, c.mode, env...); r.String() != c.outside {
			t.Errorf("%s outside: %s, want %s", c.what, r, c.outside)
		}
	}

	// A record-only sandbox reaches the broker, and the connect is recorded.
	if err := f.eg.SetSandbox(recordID, egressrules.SandboxConfig{Proxy4: f.proxy4, Proxy6: f.proxy6, RecordOnly: true,
		RestrictUnix: true, UnixPaths: []string{ws + "/"}}); err != nil {
		t.Fatal(err)
	}
	if r, pid := f.op(t, f.record, "unix-connect", "WATCHER_ADDR="+broker); r.String() != "ok broker" {
		t.Errorf("record-only sandbox: %s, want ok broker", r)
	} else {
		ev := f.kernelEvents.wait(t, "record of the broker connect", func(ev audit.Event) bool {
			return ev.Kind == audit.KindNet && ev.Net != nil && ev.Process.TGID == uint32(pid) && ev.Net.Family == 1
		})
		if ev.Verdict != audit.VerdictRecorded || ev.Net.Addr != broker {
			t.Errorf("record-only event: verdict %s addr %q", ev.Verdict, ev.Net.Addr)
		}
	}

	// Resolver ports: allowed.test is answered and admitted, its port 80
	// works, its port 853 (DNS over TLS) does not.
	r, _ := f.op(t, cg, "resolve-connect", "WATCHER_NAME=allowed.test", "WATCHER_DNS="+netip.AddrPortFrom(n.dead, 53).String(), "WATCHER_NET=tcp4")
	mustOK(t, "allowed.test:80", r, "allowed")
	r, pid := f.connect(t, cg, dot)
	mustEPERM(t, "DNS over TLS to an answered address", r)
	if ev := f.netEvent(t, pid, dot); !strings.Contains(ev.Net.Reason, "another resolver") {
		t.Errorf("DoT refusal reason %q", ev.Net.Reason)
	}
	r, _ = f.op(t, cg, "udp", "WATCHER_ADDR="+netip.AddrPortFrom(n.allowed, 853).String())
	mustEPERM(t, "DNS over QUIC (udp 853) to an answered address", r)
	r, _ = f.connect(t, f.outside, dot)
	mustOK(t, "DoT outside", r, "dot")
	f.dir.Set("sb", sandboxID)
}
