package egress_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// testNet is a network namespace joined to the host by a veth pair, with
// test hosts on the namespace side:
//
//	.2 / ::2  the "allowed" web server (TCP 80 "allowed", UDP 9999 echo)
//	.3 / ::3  the "forbidden" one (TCP 80 "forbidden", 22, UDP 9999 echo)
//	.4 / ::4  the DNS upstream (miekg/dns, UDP and TCP 53)
//	.5        a stand-in DNS-over-HTTPS resolver (TCP 443)
//	.6        short.allowed.test, answered with the TTL of the moment
//	.9 / ::9  no host at all: a DNS server address nobody answers on
//
// Processes in sandbox cgroups stay in the host namespace and reach these
// through the host end (.1 / ::1 of the subnet).
type testNet struct {
	ns                                          string
	host, allowed, forbidden, dnsSrv, doh, dead netip.Addr
	short                                       netip.Addr
	host6, allowed6, forbidden6, dnsSrv6, dead6 netip.Addr
	ttl                                         atomic.Uint32 // TTL of the upstream's answers
	queries                                     atomic.Uint64 // queries the upstream saw
	closers                                     []io.Closer
	mu                                          sync.Mutex
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func run(t testing.TB, name string, args ...string) {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

// newTestNet builds the namespace, the veth pair and the servers; all of it
// is removed at cleanup.
func newTestNet(t testing.TB) *testNet {
	t.Helper()
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("iproute2 (ip) is not installed")
	}
	suffix := randHex(3)
	n := &testNet{ns: "wte-" + suffix}
	b := make([]byte, 1)
	rand.Read(b)
	sub := int(b[0])%250 + 2
	v4 := func(h int) netip.Addr { return netip.MustParseAddr(fmt.Sprintf("198.18.%d.%d", sub, h)) }
	// Documentation space, not unique-local: the proxy refuses answers
	// with unique-local addresses (DNS rebinding).
	v6 := func(h int) netip.Addr { return netip.MustParseAddr(fmt.Sprintf("2001:db8:57a7:%x::%x", sub, h)) }
	n.host, n.allowed, n.forbidden, n.dnsSrv, n.doh, n.dead = v4(1), v4(2), v4(3), v4(4), v4(5), v4(9)
	n.short = v4(6)
	n.host6, n.allowed6, n.forbidden6, n.dnsSrv6, n.dead6 = v6(1), v6(2), v6(3), v6(4), v6(9)
	n.ttl.Store(60)

	hostIf, nsIf := "wte"+suffix+"h", "wte"+suffix+"n"
	run(t, "ip", "netns", "add", n.ns)
	t.Cleanup(func() {
		for i := len(n.closers) - 1; i >= 0; i-- {
			n.closers[i].Close()
		}
		exec.Command("ip", "netns", "del", n.ns).Run()
		exec.Command("ip", "link", "del", hostIf).Run()
	})
	run(t, "ip", "link", "add", hostIf, "type", "veth", "peer", "name", nsIf, "netns", n.ns)
	run(t, "ip", "addr", "add", n.host.String()+"/24", "dev", hostIf)
	run(t, "ip", "-6", "addr", "add", n.host6.String()+"/64", "dev", hostIf, "nodad")
	run(t, "ip", "link", "set", hostIf, "up")
	for _, a := range []netip.Addr{n.allowed, n.forbidden, n.dnsSrv, n.doh, n.short} {
		run(t, "ip", "-n", n.ns, "addr", "add", a.String()+"/24", "dev", nsIf)
	}
	for _, a := range []netip.Addr{n.allowed6, n.forbidden6, n.dnsSrv6} {
		run(t, "ip", "-n", n.ns, "-6", "addr", "add", a.String()+"/64", "dev", nsIf, "nodad")
	}
	run(t, "ip", "-n", n.ns, "link", "set", nsIf, "up")
	run(t, "ip", "-n", n.ns, "link", "set", "lo", "up")

	banner := func(a netip.Addr, port int, text string) {
		ln := n.listen(t, "tcp", netip.AddrPortFrom(a, uint16(port))).(net.Listener)
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
	}
	echo := func(a netip.Addr, port int) {
		pc := n.listen(t, "udp", netip.AddrPortFrom(a, uint16(port))).(net.PacketConn)
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
	banner(n.allowed, 80, "allowed")
	banner(n.forbidden, 80, "forbidden")
	banner(n.forbidden, 22, "SSH-2.0-forbidden")
	banner(n.doh, 443, "doh")
	banner(n.short, 80, "short")
	banner(n.allowed6, 80, "allowed6")
	banner(n.forbidden6, 80, "forbidden6")
	echo(n.allowed, 9999)
	echo(n.forbidden, 9999)

	mux := dns.NewServeMux()
	mux.HandleFunc(".", n.answer)
	for _, a := range []netip.Addr{n.dnsSrv, n.dnsSrv6} {
		ap := netip.AddrPortFrom(a, 53)
		pc := n.listen(t, "udp", ap).(net.PacketConn)
		ln := n.listen(t, "tcp", ap).(net.Listener)
		for _, srv := range []*dns.Server{{PacketConn: pc, Handler: mux}, {Listener: ln, Handler: mux}} {
			started := make(chan struct{})
			srv.NotifyStartedFunc = func() { close(started) }
			go srv.ActivateAndServe()
			<-started
			n.closers = append(n.closers, closerFunc(srv.Shutdown))
		}
	}
	return n
}

type closerFunc func() error

func (f closerFunc) Close() error { return f() }

// answer is the upstream: names under allowed.test and cdn.test resolve to the allowed
// host, forbidden.test and target.example.test to the forbidden one, names
// under nip.io to the address they spell (127.0.0.1 here); others NXDOMAIN.
func (n *testNet) answer(w dns.ResponseWriter, r *dns.Msg) {
	n.queries.Add(1)
	m := new(dns.Msg)
	m.SetReply(r)
	m.Authoritative = true
	q := r.Question[0]
	name := strings.ToLower(q.Name)
	var v4, v6 netip.Addr
	switch {
	case strings.HasSuffix(name, ".rebind.allowed.test."):
		// Allowed names whose answers are local addresses (DNS rebinding).
		switch strings.TrimSuffix(name, ".rebind.allowed.test.") {
		case "meta":
			v4 = netip.MustParseAddr("169.254.169.254")
		case "loop":
			v4, v6 = netip.MustParseAddr("127.0.0.1"), netip.IPv6Loopback()
		case "mapped":
			v6 = netip.MustParseAddr("::ffff:127.0.0.1")
		case "zero":
			v4 = netip.IPv4Unspecified()
		case "lan":
			v4 = netip.MustParseAddr("10.77.0.1")
		case "ula":
			v6 = netip.MustParseAddr("fd00:77::1")
		case "host":
			v4 = n.host // the host's own end of the veth pair
		}
	case name == "short.allowed.test.":
		v4 = n.short
	case name == "allowed.test." || strings.HasSuffix(name, ".allowed.test.") || strings.HasSuffix(name, ".cdn.test."):
		v4, v6 = n.allowed, n.allowed6
	case name == "forbidden.test." || name == "target.example.test.":
		v4, v6 = n.forbidden, n.forbidden6
	case strings.HasSuffix(name, ".nip.io.") || strings.HasSuffix(name, ".example.com."):
		v4 = netip.MustParseAddr("127.0.0.1")
	default:
		m.Rcode = dns.RcodeNameError
		w.WriteMsg(m)
		return
	}
	hdr := dns.RR_Header{Name: q.Name, Class: dns.ClassINET, Ttl: n.ttl.Load()}
	switch q.Qtype {
	case dns.TypeA:
		if v4.IsValid() {
			hdr.Rrtype = dns.TypeA
			m.Answer = append(m.Answer, &dns.A{Hdr: hdr, A: v4.AsSlice()})
		}
	case dns.TypeAAAA:
		if v6.IsValid() {
			hdr.Rrtype = dns.TypeAAAA
			m.Answer = append(m.Answer, &dns.AAAA{Hdr: hdr, AAAA: v6.AsSlice()})
		}
	case dns.TypeTXT:
		hdr.Rrtype = dns.TypeTXT
		m.Answer = append(m.Answer, &dns.TXT{Hdr: hdr, Txt: []string{"upstream"}})
	}
	w.WriteMsg(m)
}

// listen opens a listener inside the namespace: the socket belongs to the
// namespace it was created in, whatever thread serves it later.
func (n *testNet) listen(t testing.TB, network string, ap netip.AddrPort) io.Closer {
	t.Helper()
	var c io.Closer
	err := n.inNetns(func() error {
		var err error
		if network == "udp" {
			c, err = net.ListenPacket("udp", ap.String())
		} else {
			c, err = net.Listen("tcp", ap.String())
		}
		return err
	})
	if err != nil {
		t.Fatalf("listen %s %s in %s: %v", network, ap, n.ns, err)
	}
	n.mu.Lock()
	n.closers = append(n.closers, c)
	n.mu.Unlock()
	return c
}

func (n *testNet) inNetns(f func() error) error {
	runtime.LockOSThread()
	self, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer self.Close()
	target, err := os.Open("/run/netns/" + n.ns)
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("setns: %w", err)
	}
	ferr := f()
	if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
		// The thread stays locked and dies with this goroutine's end.
		return errors.Join(ferr, fmt.Errorf("restore netns: %w", err))
	}
	runtime.UnlockOSThread()
	return ferr
}

// helperResult is what a helper child printed: "ok <text>" or "err <errno>".
type helperResult struct {
	ok   bool
	text string
}

func (r helperResult) String() string {
	if r.ok {
		return "ok " + r.text
	}
	return "err " + r.text
}

func parseHelper(out []byte) helperResult {
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if s, ok := strings.CutPrefix(line, "RESULT ok "); ok {
			return helperResult{ok: true, text: s}
		}
		if s, ok := strings.CutPrefix(line, "RESULT err "); ok {
			return helperResult{text: s}
		}
	}
	return helperResult{text: "no result: " + string(out)}
}

// helperMain runs in a child started by enforcetest.SelfCommand: it does
// one network operation and prints its result.
func helperMain(mode string) {
	res, err := helperOp(mode)
	if err != nil {
		var errno syscall.Errno
		if errors.As(err, &errno) {
			fmt.Printf("RESULT err %s\n", unix.ErrnoName(errno))
		} else {
			fmt.Printf("RESULT err %v\n", err)
		}
		return
	}
	fmt.Printf("RESULT ok %s\n", res)
}

func helperOp(mode string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	addr := os.Getenv("WATCHER_ADDR")
	switch mode {
	case "connect":
		network := os.Getenv("WATCHER_NET")
		if network == "" {
			network = "tcp"
		}
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return "", err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(3 * time.Second))
		b, _ := io.ReadAll(c)
		return strings.TrimSpace(string(b)), nil
	case "resolve-connect":
		// Resolve with the name server WATCHER_DNS (any address: the kernel
		// sends the query to the proxy), then connect to the answer.
		server := os.Getenv("WATCHER_DNS")
		network := os.Getenv("WATCHER_NET")
		r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, nw, _ string) (net.Conn, error) {
			if os.Getenv("WATCHER_DNS_TCP") != "" {
				nw = "tcp"
			}
			return (&net.Dialer{}).DialContext(ctx, nw, server)
		}}
		ipNet := "ip4"
		if network == "tcp6" {
			ipNet = "ip6"
		}
		ips, err := r.LookupNetIP(ctx, ipNet, os.Getenv("WATCHER_NAME"))
		if err != nil {
			return "", fmt.Errorf("resolve: %w", err)
		}
		port := uint16(80)
		if p, err := strconv.Atoi(os.Getenv("WATCHER_PORT")); err == nil {
			port = uint16(p)
		}
		if os.Getenv("WATCHER_FD") == "3" {
			// The answered address, on a socket inherited as fd 3.
			return connectFD(3, netip.AddrPortFrom(ips[0], port))
		}
		c, err := (&net.Dialer{}).DialContext(ctx, network, netip.AddrPortFrom(ips[0], port).String())
		if err != nil {
			return "", err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(3 * time.Second))
		b, _ := io.ReadAll(c)
		return strings.TrimSpace(string(b)), nil
	case "udp":
		// An unconnected socket: sendmsg carries the destination.
		pc, err := net.ListenPacket("udp4", "0.0.0.0:0")
		if err != nil {
			return "", err
		}
		defer pc.Close()
		to, err := net.ResolveUDPAddr("udp4", addr)
		if err != nil {
			return "", err
		}
		if _, err := pc.WriteTo([]byte("ping"), to); err != nil {
			return "", err
		}
		pc.SetReadDeadline(time.Now().Add(3 * time.Second))
		buf := make([]byte, 64)
		k, _, err := pc.ReadFrom(buf)
		if err != nil {
			return "", err
		}
		return string(buf[:k]), nil
	case "unix-connect", "unixgram-send":
		// A unix socket path as given (relative ones from WATCHER_DIR).
		if d := os.Getenv("WATCHER_DIR"); d != "" {
			if err := os.Chdir(d); err != nil {
				return "", err
			}
		}
		if mode == "unixgram-send" {
			// An unconnected datagram: sendmsg carries the path.
			fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM, 0)
			if err != nil {
				return "", err
			}
			defer unix.Close(fd)
			if err := unix.Sendto(fd, []byte("hi"), 0, &unix.SockaddrUnix{Name: addr}); err != nil {
				return "", err
			}
			return "sent", nil
		}
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
		if err != nil {
			return "", err
		}
		defer unix.Close(fd)
		if err := unix.Connect(fd, &unix.SockaddrUnix{Name: addr}); err != nil {
			return "", err
		}
		buf := make([]byte, 64)
		k, err := unix.Read(fd, buf)
		if err != nil {
			return "", err
		}
		return strings.TrimSpace(string(buf[:k])), nil
	case "bench-connect", "bench-udp", "bench-dns":
		return benchLoop(mode)
	case "resolve-hold", "dns-burst":
		return admitHelper(ctx, mode)
	case "raw":
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP)
		if err != nil {
			return "", err
		}
		unix.Close(fd)
		return "raw socket", nil
	}
	if h, ok := foreignHelpers[mode]; ok {
		return h(ctx)
	}
	if h, ok := relayHelpers[mode]; ok {
		return h(ctx)
	}
	return "", fmt.Errorf("unknown helper mode %q", mode)
}
