package egress_test

import (
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/dnsproxy"
	"github.com/watcherhq/watcher/internal/enforce/enforcetest"
	"github.com/watcherhq/watcher/internal/enforce/rules/egressrules"
)

// testRebinding: an allowed name whose answer is a local address (the
// cloud metadata service, loopback, the host's own address, a private or
// unique-local network, 0.0.0.0) is refused by the proxy with an RFC 8914
// reason and never admitted, so a process in the sandbox cannot reach a
// host service through it; a sandbox whose policy names a loopback service
// (and so allows loopback answers) reaches that port only.
func testRebinding(t *testing.T, f *fixture) {
	n := f.net
	// Host services a sandbox must not reach: one on loopback (like the
	// agent's metrics port) and one on the host's own address.
	loopSvc := listenLoopback(t, "127.0.0.1")
	hostSvc := listenLoopback(t, n.host.String())
	otherLoop := listenLoopback(t, "127.0.0.1")

	for name, kind := range map[string]string{
		"meta.rebind.allowed.test": "cloud metadata", "loop.rebind.allowed.test": "loopback",
		"zero.rebind.allowed.test": "unspecified", "lan.rebind.allowed.test": "private",
		"host.rebind.allowed.test": "host address",
	} {
		out := dig(t, f.sandbox, "@"+n.dead.String(), "+notcp", name)
		if status, _ := digResult(out); status != "NXDOMAIN" || !strings.Contains(out, dnsproxy.ReasonLocalAnswer) || !strings.Contains(out, "("+kind+")") {
			t.Errorf("dig %s in the sandbox: status %q, want NXDOMAIN with EDE %q (%s)\n%s", name, status, dnsproxy.ReasonLocalAnswer, kind, out)
		}
	}
	for _, name := range []string{"ula.rebind.allowed.test", "mapped.rebind.allowed.test", "loop.rebind.allowed.test"} {
		out := dig(t, f.sandbox, "@"+n.dead.String(), "AAAA", name)
		if status, _ := digResult(out); status != "NXDOMAIN" || !strings.Contains(out, dnsproxy.ReasonLocalAnswer) {
			t.Errorf("dig AAAA %s in the sandbox: status %q\n%s", name, status, out)
		}
	}
	// Resolve and connect, as an attacker's program would: refused.
	for name, svc := range map[string]netip.AddrPort{"loop.rebind.allowed.test": loopSvc, "host.rebind.allowed.test": hostSvc} {
		r, _ := f.op(t, f.sandbox, "resolve-connect", "WATCHER_NAME="+name, "WATCHER_DNS="+netip.AddrPortFrom(n.dead, 53).String(),
			"WATCHER_NET=tcp4", "WATCHER_PORT="+strconv.Itoa(int(svc.Port())))
		if r.ok || !strings.Contains(r.text, "resolve") {
			t.Errorf("resolve %s and connect to port %d in the sandbox: %s, want a failed resolution", name, svc.Port(), r)
		}
		// Nothing was admitted, so the address itself is refused too.
		r, _ = f.connect(t, f.sandbox, svc)
		mustEPERM(t, "connect "+svc.String()+" in the sandbox", r)
		// The benign neighbour: outside the sandbox the service answers.
		r, _ = f.connect(t, f.outside, svc)
		mustOK(t, "connect "+svc.String()+" outside", r, "hello")
	}
	allowed := f.eg.Allowed(sandboxID)
	for a := range allowed {
		if dnsproxy.LocalKind(a) != "" || a == n.host {
			t.Errorf("local address %s admitted to the sandbox's allowlist", a)
		}
	}
	// The allowed name with a public answer still works.
	mustOK(t, "allowed.test", f.resolveConnect(t, f.sandbox, "allowed.test", n.dead, false, false), "allowed")
	ev := f.dnsEvents.wait(t, "alert for the metadata answer", func(ev audit.Event) bool {
		return ev.DNS != nil && ev.DNS.Name == "meta.rebind.allowed.test." && ev.Verdict == audit.VerdictDenied
	})
	if !ev.IsAlert() || !strings.Contains(ev.DNS.Reason, "169.254.169.254") {
		t.Errorf("metadata refusal event: %+v %+v", ev, ev.DNS)
	}

	// An explicit allowance: sandbox "local" names the loopback service
	// (egress rule) and so may resolve names to loopback, but reaches only
	// that port, and the answer admits nothing.
	const localID = 3
	cg := enforcetest.Cgroup(t, "local")
	if _, err := f.eng.AddSandbox(cg, localID, 0); err != nil {
		t.Fatal(err)
	}
	svcPorts := egressrules.PortRange{Lo: loopSvc.Port(), Hi: loopSvc.Port()}
	if err := f.eg.SetSandbox(localID, egressrules.SandboxConfig{Proxy4: f.proxy4, Proxy6: f.proxy6, Rules: []egressrules.Rule{
		{ID: 7, Prefix: netip.MustParsePrefix("127.0.0.0/8"), Ports: svcPorts, Protocol: egressrules.ProtoTCP},
	}}); err != nil {
		t.Fatal(err)
	}
	if err := f.eg.Attach(cg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.eg.Detach(cg) })
	f.dir.Set("local", localID)
	// "local" names loopback in its egress rules: its answers may carry
	// loopback addresses (the proxy's local allowance).
	pol := compiledPolicy(t, dnsSandbox("sb", ".allowed.test, .cdn.test", "")+dnsSandbox("rec", ".allowed.test", "")+
		dnsSandbox("local", ".allowed.test", "    egress: {allow: [{cidr: 127.0.0.0/8}]}\n")).DNS
	if err := f.proxy.SetPolicy(pol); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		port uint16
		want string
	}{{loopSvc.Port(), "ok hello"}, {otherLoop.Port(), "err EPERM"}} {
		r, _ := f.op(t, cg, "resolve-connect", "WATCHER_NAME=loop.rebind.allowed.test", "WATCHER_DNS="+netip.AddrPortFrom(n.dead, 53).String(),
			"WATCHER_NET=tcp4", "WATCHER_PORT="+strconv.Itoa(int(c.port)))
		if r.String() != c.want {
			t.Errorf("sandbox with a loopback allowance, loop.rebind.allowed.test port %d: %s, want %s", c.port, r, c.want)
		}
	}
	out := dig(t, cg, "@"+n.dead.String(), "meta.rebind.allowed.test")
	if status, _ := digResult(out); status != "NXDOMAIN" {
		t.Errorf("metadata answer outside the loopback allowance: %s", out)
	}
	if _, ok := f.eg.Allowed(localID)[netip.MustParseAddr("127.0.0.1")]; ok {
		t.Error("a loopback answer was admitted (it would open every loopback port)")
	}
}
