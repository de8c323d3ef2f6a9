package adversarial

// The world of the egress rows (egress_test.go): a network namespace joined
// to the host by a veth pair on a random 198.18.x.0/24, holding a CDN (one
// address, TLS and plain HTTP for every name under cdn.test and for
// evil.test), the DNS server the agent's proxy forwards to (it answers
// names under cdn.test with the CDN), and an address nothing answers
// (dark). On the host: a service on loopback and on the host's end of the
// veth. Every server writes what it saw to one log, which the rows read to
// judge from outside whether a fronted name or an unanswered address was
// reached.

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/policy"
)

// Ports of the egress world's servers.
const (
	egressDarkUDPPort = 9999
	egressCDNUDPPort  = 8443
	cdnName           = "a.cdn.test"
	frontedName       = "evil.test"
)

// seenLog is what the servers saw, one line each ("cdn80 host=evil.test").
type seenLog struct {
	mu    sync.Mutex
	lines []string
}

func (s *seenLog) add(format string, args ...any) {
	s.mu.Lock()
	s.lines = append(s.lines, fmt.Sprintf(format, args...))
	s.mu.Unlock()
}

func (s *seenLog) reset() {
	s.mu.Lock()
	s.lines = nil
	s.mu.Unlock()
}

// has reports the first line holding marker.
func (s *seenLog) has(marker string) (bool, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range s.lines {
		if strings.Contains(l, marker) {
			return true, l
		}
	}
	return false, ""
}

// egressWorld is the network the egress rows attack.
type egressWorld struct {
	cdn, dnsSrv, dark, hostAddr netip.Addr
	ruled                       netip.Addr // an egress.allow rule names it (TCP 80)
	cdn6, dark6                 netip.Addr // the CDN's and the dark address's IPv6 (2001:db8::/32)
	hostPort                    int        // host services on 127.0.0.1, ::1 and hostAddr
	seen                        seenLog
	ns                          string
}

// arg is the attacker's ADV_ARG: "CDN DNS DARK HOSTADDR HOSTPORT CDN6 DARK6".
func (w *egressWorld) arg() string {
	return fmt.Sprintf("%s %s %s %s %d %s %s", w.cdn, w.dnsSrv, w.dark, w.hostAddr, w.hostPort, w.cdn6, w.dark6)
}

// newEgressBed is the suite's bed with the sandbox allowed names under
// cdn.test (dns.allow; name binding is on in the preset) and the agent's
// proxy forwarding to the world's DNS server.
func newEgressBed(t *testing.T) (*bed, *egressWorld) {
	t.Helper()
	for _, tool := range []string{"ip", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed (iproute2, util-linux)", tool)
		}
	}
	if out, err := exec.Command("ip", "netns", "list").CombinedOutput(); err != nil {
		// busybox's ip (the qemu guest's initramfs): test/vm/lanes.sh runs
		// this suite again on the host's userland.
		t.Skipf("this ip has no netns command (iproute2 is needed): %v: %.80s", err, out)
	}
	w := &egressWorld{}
	w.netns(t)
	w.serve(t)
	b := newBed(t)
	b.stopAgent()
	pol, err := os.ReadFile(b.policyPath)
	if err != nil {
		t.Fatal(err)
	}
	listen := fmt.Sprintf(`dns: {listen: "127.0.0.1:%d"}`, b.DNSPort)
	s := strings.Replace(string(pol), listen, fmt.Sprintf(`dns: {listen: "127.0.0.1:%d", upstreams: ["%s"]}`,
		b.DNSPort, netip.AddrPortFrom(w.dnsSrv, 53)), 1)
	s = strings.Replace(s, "    escape: {enabled: false}\n", fmt.Sprintf("    escape: {enabled: false}\n    dns: {allow: [.cdn.test]}\n"+
		"    egress: {allow: [{cidr: %s/32, ports: [\"80\"], protocol: tcp}]}\n", w.ruled), 1)
	if s == string(pol) || !strings.Contains(s, "upstreams") || !strings.Contains(s, ".cdn.test") {
		t.Fatalf("policy not rewritten:\n%s", s)
	}
	if err := os.WriteFile(b.policyPath, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
	if b.pol, err = policy.Load(b.policyPath); err != nil {
		t.Fatal(err)
	}
	b.startAgent()
	return b, w
}

// netns makes the world's namespace and addresses (cleaned up at the end).
func (w *egressWorld) netns(t *testing.T) {
	rb := make([]byte, 4)
	rand.Read(rb)
	suffix := fmt.Sprintf("%x", rb[:3])
	w.ns = "wadv-" + suffix
	sub := int(rb[3])%250 + 2
	addr := func(h int) netip.Addr { return netip.MustParseAddr(fmt.Sprintf("198.18.%d.%d", sub, h)) }
	hostIf, nsIf := "wadv"+suffix+"h", "wadv"+suffix+"n"
	run := func(args ...string) {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	run("netns", "add", w.ns)
	t.Cleanup(func() {
		exec.Command("ip", "netns", "del", w.ns).Run()
		exec.Command("ip", "link", "del", hostIf).Run()
	})
	run("link", "add", hostIf, "type", "veth", "peer", "name", nsIf, "netns", w.ns)
	run("addr", "add", addr(1).String()+"/24", "dev", hostIf)
	run("link", "set", hostIf, "up")
	for _, h := range []int{2, 3, 4, 5} {
		run("-n", w.ns, "addr", "add", addr(h).String()+"/24", "dev", nsIf)
	}
	// IPv6 from the documentation prefix (the proxy refuses to answer
	// unique-local addresses), without duplicate address detection.
	addr6 := func(h int) netip.Addr { return netip.MustParseAddr(fmt.Sprintf("2001:db8:%x::%d", sub, h)) }
	run("addr", "add", addr6(1).String()+"/64", "dev", hostIf, "nodad")
	for _, h := range []int{2, 4} {
		run("-n", w.ns, "addr", "add", addr6(h).String()+"/64", "dev", nsIf, "nodad")
	}
	w.cdn6, w.dark6 = addr6(2), addr6(4)
	run("-n", w.ns, "link", "set", nsIf, "up")
	run("-n", w.ns, "link", "set", "lo", "up")
	w.hostAddr, w.cdn, w.dnsSrv, w.dark, w.ruled = addr(1), addr(2), addr(3), addr(4), addr(5)
}

// inNS runs f on a thread in the world's namespace.
func (w *egressWorld) inNS(f func() error) error {
	runtime.LockOSThread()
	self, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer self.Close()
	target, err := os.Open("/run/netns/" + w.ns)
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return err
	}
	ferr := f()
	if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
		return err // the thread stays locked and dies with the goroutine
	}
	runtime.UnlockOSThread()
	return ferr
}

func (w *egressWorld) listen(t *testing.T, network, addr string) net.Listener {
	var ln net.Listener
	if err := w.inNS(func() (err error) { ln, err = net.Listen(network, addr); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// serve starts every server of the world.
func (w *egressWorld) serve(t *testing.T) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "cdn.test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		DNSNames: []string{"*.cdn.test", frontedName}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	handler := func(tag string) http.Handler {
		return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			sni := ""
			if r.TLS != nil {
				sni = r.TLS.ServerName
			}
			w.seen.add("%s host=%s sni=%s", tag, r.Host, sni)
			fmt.Fprintf(rw, "host=%s sni=%s", r.Host, sni)
		})
	}
	tlsSrv := &http.Server{Handler: handler("cdn443"), TLSConfig: &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}},
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			w.seen.add("cdn443 hello sni=%s", h.ServerName) // before any request
			return nil, nil
		}}}
	go tlsSrv.ServeTLS(w.listen(t, "tcp4", netip.AddrPortFrom(w.cdn, 443).String()), "", "")
	plain := &http.Server{Handler: handler("cdn80")}
	go plain.Serve(w.listen(t, "tcp4", netip.AddrPortFrom(w.cdn, 80).String()))
	go plain.Serve(w.listen(t, "tcp6", netip.AddrPortFrom(w.cdn6, 80).String()))
	t.Cleanup(func() { tlsSrv.Close(); plain.Close() })

	// The unanswered address: any connection, any datagram, is a hit.
	go acceptLog(w.listen(t, "tcp4", netip.AddrPortFrom(w.dark, 80).String()), &w.seen, "dark tcp")
	go acceptLog(w.listen(t, "tcp6", netip.AddrPortFrom(w.dark6, 80).String()), &w.seen, "dark tcp")
	go acceptLog(w.listen(t, "tcp4", netip.AddrPortFrom(w.ruled, 80).String()), &w.seen, "ruled tcp")
	w.udpLog(t, netip.AddrPortFrom(w.dark, egressDarkUDPPort), "dark udp")
	w.udpLog(t, netip.AddrPortFrom(w.cdn, egressCDNUDPPort), "cdn udp")
	w.udpLog(t, netip.AddrPortFrom(w.cdn, 443), "cdn quic")

	// DNS: names under cdn.test are the CDN, everything else NXDOMAIN.
	var dpc net.PacketConn
	if err := w.inNS(func() (err error) {
		dpc, err = net.ListenPacket("udp4", netip.AddrPortFrom(w.dnsSrv, 53).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	dsrv := &dns.Server{PacketConn: dpc, Handler: dns.HandlerFunc(func(rw dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		q := r.Question[0]
		if !strings.HasSuffix(strings.ToLower(q.Name), ".cdn.test.") {
			m.Rcode = dns.RcodeNameError
		} else if q.Qtype == dns.TypeA {
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 300}, A: w.cdn.AsSlice()})
		} else if q.Qtype == dns.TypeAAAA {
			m.Answer = append(m.Answer, &dns.AAAA{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeAAAA, Class: dns.ClassINET, Ttl: 300}, AAAA: w.cdn6.AsSlice()})
		}
		rw.WriteMsg(m)
	})}
	started := make(chan struct{})
	dsrv.NotifyStartedFunc = func() { close(started) }
	go dsrv.ActivateAndServe()
	<-started
	t.Cleanup(func() { dsrv.Shutdown() })

	// Host services: loopback (where connects to 0.0.0.0 and :: land) and
	// the host's own address on the veth, one port for all three.
	for i := 0; i < 20 && w.hostPort == 0; i++ {
		ln4, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := ln4.Addr().(*net.TCPAddr).Port
		ln6, err6 := net.Listen("tcp6", fmt.Sprintf("[::1]:%d", port))
		lnh, errh := net.Listen("tcp4", netip.AddrPortFrom(w.hostAddr, uint16(port)).String())
		if err6 != nil || errh != nil {
			ln4.Close()
			for _, l := range []net.Listener{ln6, lnh} {
				if l != nil {
					l.Close()
				}
			}
			continue
		}
		w.hostPort = port
		for _, l := range []net.Listener{ln4, ln6, lnh} {
			t.Cleanup(func() { l.Close() })
			go acceptLog(l, &w.seen, "host-local")
		}
	}
	if w.hostPort == 0 {
		t.Fatal("no port free on 127.0.0.1, ::1 and the veth at once")
	}
}

// udpLog logs every datagram to at.
func (w *egressWorld) udpLog(t *testing.T, at netip.AddrPort, tag string) {
	var pc net.PacketConn
	if err := w.inNS(func() (err error) {
		pc, err = net.ListenPacket("udp4", at.String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			w.seen.add("%s from %s: %q", tag, from, buf[:n])
		}
	}()
}

// acceptLog logs every connection to ln with its first line, and answers.
func acceptLog(ln net.Listener, seen *seenLog, tag string) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			seen.add("%s %s accepted from %s", tag, c.LocalAddr(), c.RemoteAddr())
			c.SetDeadline(time.Now().Add(5 * time.Second))
			line, _ := bufio.NewReader(c).ReadString('\n')
			seen.add("%s %s from %s: %q", tag, c.LocalAddr(), c.RemoteAddr(), line)
			c.Write([]byte(tag + " SERVED\n"))
		}()
	}
}
