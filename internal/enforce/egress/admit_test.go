package egress_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/miekg/dns"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/dnsproxy"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/egress"
	"github.com/watcherhq/watcher/internal/enforce/enforcetest"
	"github.com/watcherhq/watcher/internal/enforce/rules/egressrules"
)

// admitHelper runs in a helper child in the sandbox cgroup.
//
//	resolve-hold: resolve WATCHER_NAME through WATCHER_DNS, connect to
//	  port WATCHER_PORT of the answer, wait WATCHER_HOLD, then send "ping"
//	  and print the echo (an established connection past its admission).
//	dns-burst: ask every "name type" line of the file WATCHER_NAMES of
//	  WATCHER_DNS over UDP, one after the other; print how many were
//	  answered NOERROR and how many were refused.
func admitHelper(ctx context.Context, mode string) (string, error) {
	server := os.Getenv("WATCHER_DNS")
	switch mode {
	case "resolve-hold":
		r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, nw, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, nw, server)
		}}
		ips, err := r.LookupNetIP(ctx, "ip4", os.Getenv("WATCHER_NAME"))
		if err != nil {
			return "", fmt.Errorf("resolve: %w", err)
		}
		port, _ := strconv.Atoi(os.Getenv("WATCHER_PORT"))
		c, err := net.Dial("tcp4", netip.AddrPortFrom(ips[0], uint16(port)).String())
		if err != nil {
			return "", err
		}
		defer c.Close()
		hold, _ := time.ParseDuration(os.Getenv("WATCHER_HOLD"))
		time.Sleep(hold)
		c.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := c.Write([]byte("ping\n")); err != nil {
			return "", err
		}
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			return "", err
		}
		return strings.TrimSpace(line), nil
	case "dns-burst":
		f, err := os.Open(os.Getenv("WATCHER_NAMES"))
		if err != nil {
			return "", err
		}
		defer f.Close()
		c := &dns.Client{Net: "udp", Timeout: 2 * time.Second}
		conn, err := c.Dial(server)
		if err != nil {
			return "", err
		}
		defer conn.Close()
		ok, refused := 0, 0
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			name, typ, _ := strings.Cut(sc.Text(), " ")
			m := new(dns.Msg)
			m.SetQuestion(dns.Fqdn(name), dns.StringToType[typ])
			r, _, err := c.ExchangeWithConn(m, conn)
			if err != nil {
				return "", err
			}
			if r.Rcode == dns.RcodeSuccess {
				ok++
			} else {
				refused++
			}
		}
		return fmt.Sprintf("%d %d", ok, refused), nil
	}
	return "", fmt.Errorf("unknown mode %q", mode)
}

// serveTCP runs a server in the test namespace: each connection gets
// banner, or (banner "") an echo of its lines.
func (n *testNet) serveTCP(t *testing.T, ap netip.AddrPort, banner string) {
	ln := n.listen(t, "tcp", ap).(net.Listener)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if banner != "" {
					c.Write([]byte(banner + "\n"))
					return
				}
				c.SetDeadline(time.Now().Add(30 * time.Second))
				io.Copy(c, c)
			}()
		}
	}()
}

func (n *testNet) serveUDPEcho(t *testing.T, ap netip.AddrPort) {
	pc := n.listen(t, "udp", ap).(net.PacketConn)
	go func() {
		buf := make([]byte, 2048)
		for {
			k, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(buf[:k], from)
		}
	}()
}

// TestAdmissionScope: an answer admits its addresses on TCP 80 and 443
// and the ports the policy lists for the name, for min(TTL, cap) plus the
// grace; another port or UDP is refused with an alert that says so; an
// established connection outlives its admission; a reload that drops a
// name drops its admissions.
func TestAdmissionScope(t *testing.T) {
	f := setup(t)
	n := f.net
	for _, a := range []netip.Addr{n.allowed, n.allowed6} {
		n.serveTCP(t, netip.AddrPortFrom(a, 443), "tls")
		n.serveTCP(t, netip.AddrPortFrom(a, 4444), "port4444")
	}
	n.serveUDPEcho(t, netip.AddrPortFrom(n.allowed, 4445))
	n.serveTCP(t, netip.AddrPortFrom(n.short, 443), "")
	resolve := func(t *testing.T, name string, port int, v6 bool) helperResult {
		t.Helper()
		server := n.dead
		env := []string{"WATCHER_NAME=" + name, "WATCHER_NET=tcp4", "WATCHER_PORT=" + strconv.Itoa(port)}
		if v6 {
			server, env[1] = n.dead6, "WATCHER_NET=tcp6"
		}
		env = append(env, "WATCHER_DNS="+netip.AddrPortFrom(server, 53).String())
		r, _ := f.op(t, f.sandbox, "resolve-connect", env...)
		return r
	}
	portRefused := func(t *testing.T, what string, r helperResult, pid int, ap netip.AddrPort) {
		t.Helper()
		mustEPERM(t, what, r)
		ev := f.netEvent(t, pid, ap)
		if ev.Verdict != audit.VerdictDenied || ev.Severity != audit.SeverityAlert || !strings.Contains(ev.Net.Reason, "not on a port or protocol its name allows") ||
			ev.Message != "admitted for allowed.test on tcp/80, tcp/443" {
			t.Errorf("%s: event %s %s %q %q, want a denied alert for the port, admitted for allowed.test on tcp/80, tcp/443", what, ev.Verdict, ev.Severity, ev.Net.Reason, ev.Message)
		}
	}

	t.Run("web ports only by default", func(t *testing.T) {
		mustOK(t, "resolve, TCP 443", resolve(t, "allowed.test", 443, false), "tls")
		mustOK(t, "resolve over IPv6, TCP 443", resolve(t, "allowed.test", 443, true), "tls")
		for _, ap := range []netip.AddrPort{netip.AddrPortFrom(n.allowed, 4444), netip.AddrPortFrom(n.allowed6, 4444)} {
			r, pid := f.connect(t, f.sandbox, ap)
			portRefused(t, "TCP "+ap.String(), r, pid, ap)
		}
		udp := netip.AddrPortFrom(n.allowed, 4445)
		r, pid := f.op(t, f.sandbox, "udp", "WATCHER_ADDR="+udp.String())
		portRefused(t, "UDP "+udp.String(), r, pid, udp)
		r, _ = f.connect(t, f.sandbox, netip.AddrPortFrom(n.allowed, 443))
		mustOK(t, "TCP 443 again", r, "tls")
	})

	t.Run("a name's ports", func(t *testing.T) {
		f.admit.Scopes = func(string) *egressrules.Scope {
			return &egressrules.Scope{Names: []egressrules.NameSpans{{Pattern: ".cdn.test", Spans: []egressrules.PortSpan{
				{Lo: 4444, Hi: 4444, Protocol: egressrules.ProtoTCP}, {Lo: 4445, Hi: 4445, Protocol: egressrules.ProtoUDP}}}}}
		}
		defer func() { f.admit.Scopes = nil }()
		mustOK(t, "x.cdn.test TCP 4444", resolve(t, "x.cdn.test", 4444, false), "port4444")
		r, _ := f.op(t, f.sandbox, "udp", "WATCHER_ADDR="+netip.AddrPortFrom(n.allowed, 4445).String())
		mustOK(t, "x.cdn.test UDP 4445", r, "ping")
		spans, err := f.eg.Admitted(sandboxID, n.allowed)
		if err != nil {
			t.Fatal(err)
		}
		if len(spans) != 4 {
			t.Errorf("kernel holds %d spans for %s, want 4 (80, 443, 4444/tcp, 4445/udp): %+v", len(spans), n.allowed, spans)
		}
	})

	t.Run("a huge TTL is capped", func(t *testing.T) {
		n.ttl.Store(2147483647)
		defer n.ttl.Store(60)
		mustOK(t, "huge.allowed.test", resolve(t, "huge.allowed.test", 443, false), "tls")
		spans, err := f.eg.Admitted(sandboxID, n.allowed)
		if err != nil {
			t.Fatal(err)
		}
		limit := time.Now().Add(egressrules.DefaultAdmissionCap + grace + 5*time.Second)
		for _, s := range spans {
			if s.Expires.After(limit) {
				t.Errorf("span %d-%d admitted until %s, beyond the %s cap", s.Lo, s.Hi, s.Expires.Format(time.RFC3339), egressrules.DefaultAdmissionCap)
			}
		}
		if len(spans) == 0 {
			t.Error("no admission read from the kernel map")
		}
	})

	t.Run("an established connection outlives its admission", func(t *testing.T) {
		f.admit.Scopes = func(string) *egressrules.Scope { return &egressrules.Scope{Cap: time.Second} }
		defer func() { f.admit.Scopes = nil }()
		env := []string{"WATCHER_NAME=short.allowed.test", "WATCHER_PORT=443", "WATCHER_HOLD=3s",
			"WATCHER_DNS=" + netip.AddrPortFrom(n.dead, 53).String()}
		r, _ := f.op(t, f.sandbox, "resolve-hold", env...)
		mustOK(t, "held connection after 3s", r, "ping")
		r, pid := f.connect(t, f.sandbox, netip.AddrPortFrom(n.short, 443))
		mustEPERM(t, "new connection after the admission", r)
		if ev := f.netEvent(t, pid, netip.AddrPortFrom(n.short, 443)); !strings.Contains(ev.Net.Reason, "expired") {
			t.Errorf("reason %q, want expired", ev.Net.Reason)
		}
	})

	t.Run("a reload that drops a name drops its admissions", func(t *testing.T) {
		r, _ := f.connect(t, f.sandbox, netip.AddrPortFrom(n.allowed, 443))
		mustOK(t, "before the reload", r, "tls")
		// allowed.test dropped: the IPv6 address only it answered goes,
		// the IPv4 one x.cdn.test answered too stays.
		keep := (&dnsproxy.SandboxPolicy{Allow: []string{".cdn.test"}}).Allows()
		if _, err := f.eg.Revoke(sandboxID, keep); err != nil {
			t.Fatal(err)
		}
		r, _ = f.connect(t, f.sandbox, netip.AddrPortFrom(n.allowed, 443))
		mustOK(t, "address x.cdn.test answered too", r, "tls")
		r, _ = f.connect(t, f.sandbox, netip.AddrPortFrom(n.allowed6, 443))
		mustEPERM(t, "address only allowed.test answered", r)
		keep = (&dnsproxy.SandboxPolicy{Allow: []string{"other.test"}}).Allows()
		if k, err := f.eg.Revoke(sandboxID, keep); err != nil || k == 0 {
			t.Fatalf("revoke: %d dropped, %v", k, err)
		}
		r, _ = f.connect(t, f.sandbox, netip.AddrPortFrom(n.allowed, 443))
		mustEPERM(t, "after the reload", r)
	})
}

// TestDNSChannelsThroughKernel: the channels of issue 27 from a sandboxed
// process, its queries redirected by the kernel to the real proxy and on
// to the authoritative server in the test namespace (TTL 0, so every
// query reaches it): a choice among 256 names and among 8 query types is
// cut off within the budget with an alert that gives the numbers, and a
// flood of unlisted names does not lift the cut-off; a benign client
// asking its CDN names again every TTL is never refused.
func TestDNSChannelsThroughKernel(t *testing.T) {
	f := setup(t)
	n := f.net
	n.ttl.Store(0)
	dir := t.TempDir()
	burst := func(t *testing.T, lines []string) (ok, refused int) {
		t.Helper()
		path := filepath.Join(dir, "names")
		if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		r, _ := f.op(t, f.sandbox, "dns-burst", "WATCHER_NAMES="+path, "WATCHER_DNS="+netip.AddrPortFrom(n.dead, 53).String())
		if !r.ok {
			t.Fatalf("dns-burst: %s", r)
		}
		fmt.Sscanf(r.text, "%d %d", &ok, &refused)
		return ok, refused
	}
	words := []string{"api", "cdn", "img", "static", "edge", "assets", "media", "auth", "cache", "data", "files", "js", "css", "fonts", "video", "ws"}
	alert := func(t *testing.T, domain string) audit.Event {
		t.Helper()
		return f.dnsEvents.wait(t, "channel alert for "+domain, func(ev audit.Event) bool {
			return ev.Severity == audit.SeverityAlert && strings.HasPrefix(ev.Message, "DNS channel to "+domain+" over its budget")
		})
	}

	// First the benign neighbour: 40 CDN names under one parent, A, AAAA
	// and HTTPS each asked again as its 10 s TTL runs out, three rounds.
	t.Run("benign CDN names", func(t *testing.T) {
		n.ttl.Store(10)
		defer n.ttl.Store(0)
		var lines []string
		for i := range 40 {
			for _, typ := range []string{"A", "AAAA", "HTTPS"} {
				lines = append(lines, fmt.Sprintf("e%d.cdn.test %s", i, typ))
			}
		}
		for round := range 3 {
			if round > 0 {
				time.Sleep(10500 * time.Millisecond)
			}
			if ok, refused := burst(t, lines); refused != 0 {
				t.Fatalf("round %d: %d answered, %d refused", round, ok, refused)
			}
		}
	})

	t.Run("name choice", func(t *testing.T) {
		var names, lines []string
		for i := range 256 {
			names = append(names, fmt.Sprintf("%s-%s.allowed.test", words[i>>4], words[i&15]))
			lines = append(lines, names[i]+" A")
		}
		x := uint32(99)
		for range 3000 {
			x = x*1664525 + 1013904223
			lines = append(lines, names[int(x>>16)%256]+" A")
		}
		before := n.queries.Load()
		ok, refused := burst(t, lines)
		reached := n.queries.Load() - before
		// 4800 bits at 8 bits a choice: 600 queries after the 256 names.
		if reached > 256+700 || refused == 0 {
			t.Errorf("%d queries answered, %d refused, %d reached the server: want the budget to stop it near 856", ok, refused, reached)
		}
		ev := alert(t, "allowed.test")
		t.Logf("%d answered, %d refused, %d reached the authoritative server; alert: %s", ok, refused, reached, ev.Message)

		// A flood of names under more unlisted domains than the tables
		// hold does not lift the cut-off.
		var flood []string
		for i := range 2*4096 + 100 {
			flood = append(flood, fmt.Sprintf("www.site%d.test A", i))
		}
		flood = append(flood, names[0]+" A")
		ok, _ = burst(t, flood)
		if ok != 0 {
			t.Errorf("%d queries answered after the flood: the cut-off was lifted", ok)
		}
	})

	t.Run("query type", func(t *testing.T) {
		types := []string{"A", "AAAA", "CNAME", "MX", "NS", "SOA", "SRV", "HTTPS"}
		var lines []string
		x := uint32(7)
		for range 3000 {
			x = x*1664525 + 1013904223
			lines = append(lines, "api.cdn.test "+types[int(x>>16)%8])
		}
		before := n.queries.Load()
		ok, refused := burst(t, lines)
		reached := n.queries.Load() - before
		// At least 3 bits for most of them: well under 4800/3 = 1600.
		if reached > 1700 || refused == 0 {
			t.Errorf("%d answered, %d refused, %d reached the server: want the budget to stop the type channel", ok, refused, reached)
		}
		ev := alert(t, "cdn.test")
		t.Logf("%d answered, %d refused, %d reached the authoritative server; alert: %s", ok, refused, reached, ev.Message)
	})
}

// TestOldAllowMapUnpinned: an older agent's egress_allow pin (the value
// without port spans) is removed when the new programs load.
func TestOldAllowMapUnpinned(t *testing.T) {
	eng := enforcetest.Engine(t)
	old, err := ebpf.NewMap(&ebpf.MapSpec{Name: "egress_allow", Type: ebpf.Hash, KeySize: 20, ValueSize: 8, MaxEntries: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	pin := filepath.Join(enforce.MapPinDir(eng.PinDir()), "egress_allow")
	if err := old.Pin(pin); err != nil {
		t.Fatal(err)
	}
	eg, err := egress.Load(eng, egress.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer eg.Close()
	if _, err := os.Stat(pin); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("old pin %s still there: %v", pin, err)
	}
}
