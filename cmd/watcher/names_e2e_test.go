package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/audit"
)

// TestNameBindingEndToEnd: the agent binary with egress.names.bind, a
// small CDN (one address, many names) in a network namespace, and curl in
// the sandbox resolving through the agent's DNS proxy. The allowed name
// passes the agent's relay; a fronted name on the same address is refused
// and the refusal reaches watcher tail with both names.
func TestNameBindingEndToEnd(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("curl is not installed")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("iproute2 (ip) is not installed")
	}
	cdnAddr, dnsAddr, inNS := cdnNamespace(t)
	caFile := serveCDN(t, cdnAddr, inNS)
	serveCDNDNS(t, dnsAddr, cdnAddr, inNS)

	// The agent verifies the CDN with the CDN's CA (Go reads
	// SSL_CERT_FILE) and reads the secret's value from its environment.
	t.Setenv("SSL_CERT_FILE", caFile)
	t.Setenv("WATCHER_E2E_API_VALUE", secretValue)
	tb := newTestbed(t, `    dns: {allow: [.cdn.test]}
    egress:
      names:
        bind: true
        secrets:
          - {name: api, env: API_TOKEN, from_env: WATCHER_E2E_API_VALUE, hosts: [api.cdn.test]}
`, "{enabled: false}")
	tb.resolveThrough(dnsAddr)
	tb.startAgent()
	events := tb.tailJSON(func(e audit.Event) bool { return e.Mechanism == "name-relay" })
	time.Sleep(300 * time.Millisecond)

	// The canary's fronting check: a hello for a name nobody answered, at
	// an address admitted for the sandbox, refused by the relay on both
	// paths, with its event.
	if out, code := tb.watcher("check", "--socket", tb.ControlSocket()); code != 0 ||
		!regexp.MustCompile(`(?m)^agents\s+runtime\s+sni_fronted\s.*\sdenied\s.*\sok$`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^agents\s+exec\s+sni_fronted\s.*\sok$`).MatchString(out) {
		t.Errorf("watcher check: exit %d\n%s", code, out)
	}

	curl := func(args ...string) (string, error) {
		script := "curl -sS --max-time 10 --cacert " + caFile + " " + strings.Join(args, " ")
		out, err := inSandbox(t, tb.cgAbs, "curl"+strconv.Itoa(int(time.Now().UnixNano()%1e6)), script).CombinedOutput()
		return string(out), err
	}
	out, err := curl("-4", "https://a.cdn.test/")
	if err != nil || out != "host=a.cdn.test sni=a.cdn.test" {
		t.Fatalf("allowed name: %v: %s\nagent log:\n%s", err, out, tb.agentLog)
	}
	out, err = curl("-4", "--resolve", "evil.test:443:"+cdnAddr.String(), "https://evil.test/")
	if err == nil || strings.Contains(out, "host=") {
		t.Fatalf("fronted name reached the CDN: %s", out)
	}
	// watcher exec: the command sees the placeholder, never the value,
	// and the relay swaps it on the way to the bound host, over the
	// HTTP/2 curl negotiates with the relay.
	script := `echo "token=$API_TOKEN"; env | grep -c e2e-value-7; curl -sS --max-time 10 -w " http=%{http_version}" -H "Authorization: Bearer $API_TOKEN" https://api.cdn.test/`
	out, code := tb.watcher("exec", "--socket", tb.ControlSocket(), "--", "/bin/sh", "-c", script)
	if !strings.Contains(out, "token=watcher-placeholder-agents-api\n0\n") || !strings.Contains(out, "host=api.cdn.test sni=api.cdn.test auth=Bearer "+secretValue+" http=2") {
		t.Fatalf("brokered secret (exit %d):\n%s\nagent log:\n%s", code, out, tb.agentLog)
	}
	timeout := time.After(10 * time.Second)
	for {
		select {
		case e, ok := <-events:
			if !ok {
				t.Fatal("tail ended early")
			}
			if e.Net == nil || e.Net.Name != "evil.test" {
				continue
			}
			if e.Verdict != audit.VerdictDenied || e.Sandbox.Name != "agents" || e.Rule != "egress-names" ||
				e.Net.Addr != cdnAddr.String() || !strings.Contains(e.Net.Reason, `"a.cdn.test"`) {
				t.Errorf("refusal event: %+v %+v", e, e.Net)
			}
			tb.stopAgent(syscall.SIGTERM)
			led, _ := tb.watcher("ledger", "cat", "--json", tb.ledger)
			if !strings.Contains(led, `secret \"api\" substituted`) || strings.Contains(led, secretValue) {
				t.Errorf("ledger: substitution missing or the value recorded:\n%s", grepLines([]byte(led), "name-relay"))
			}
			return
		case <-timeout:
			t.Fatalf("no name-relay refusal of evil.test reached watcher tail; agent log:\n%s", tb.agentLog)
		}
	}
}

const secretValue = "real-e2e-value-7c1"

// resolveThrough points the testbed agent's DNS proxy at the server at
// dnsAddr:53 (in the test's namespace) instead of the host's resolvers: the
// policy's dns listen line gains the upstream. Call it before startAgent.
func (tb *testbed) resolveThrough(dnsAddr netip.Addr) {
	tb.t.Helper()
	pol, err := os.ReadFile(tb.policy)
	if err != nil {
		tb.t.Fatal(err)
	}
	listen := fmt.Sprintf(`dns: {listen: "127.0.0.1:%d"}`, tb.DNSPort)
	if !strings.Contains(string(pol), listen) {
		tb.t.Fatalf("the testbed policy has no %s line to add the upstream to", listen)
	}
	withUpstream := fmt.Sprintf(`dns: {listen: "127.0.0.1:%d", upstreams: ["%s"]}`, tb.DNSPort, netip.AddrPortFrom(dnsAddr, 53))
	pol = []byte(strings.Replace(string(pol), listen, withUpstream, 1))
	if err := os.WriteFile(tb.policy, pol, 0o600); err != nil {
		tb.t.Fatal(err)
	}
}

// cdnNamespace makes a network namespace joined to the host by a veth pair
// on a random 198.18.x.0/24 and returns the CDN's and the DNS server's
// addresses there, and a function that runs f inside it.
func cdnNamespace(t *testing.T) (cdn, dnsSrv netip.Addr, inNS func(f func() error) error) {
	t.Helper()
	b := make([]byte, 4)
	rand.Read(b)
	suffix := fmt.Sprintf("%x", b[:3])
	ns := "wtn-" + suffix
	sub := int(b[3])%250 + 2
	addr := func(h int) netip.Addr { return netip.MustParseAddr(fmt.Sprintf("198.19.%d.%d", sub, h)) }
	hostIf, nsIf := "wtn"+suffix+"h", "wtn"+suffix+"n"
	run := func(args ...string) {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	run("netns", "add", ns)
	t.Cleanup(func() {
		exec.Command("ip", "netns", "del", ns).Run()
		exec.Command("ip", "link", "del", hostIf).Run()
	})
	run("link", "add", hostIf, "type", "veth", "peer", "name", nsIf, "netns", ns)
	run("addr", "add", addr(1).String()+"/24", "dev", hostIf)
	run("link", "set", hostIf, "up")
	run("-n", ns, "addr", "add", addr(2).String()+"/24", "dev", nsIf)
	run("-n", ns, "addr", "add", addr(3).String()+"/24", "dev", nsIf)
	run("-n", ns, "link", "set", nsIf, "up")
	inNS = func(f func() error) error {
		runtime.LockOSThread()
		self, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			return err
		}
		defer self.Close()
		target, err := os.Open("/run/netns/" + ns)
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
	return addr(2), addr(3), inNS
}

// serveCDN serves HTTPS on cdn:443 for every name under cdn.test (and
// evil.test: the CDN hosts both), answering with the Host and SNI it saw.
// It returns the CA file.
func serveCDN(t *testing.T, cdn netip.Addr, inNS func(func() error) error) string {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "cdn.test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		DNSNames: []string{"*.cdn.test", "evil.test"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	// Under the world's base would do too; a temp dir any sandbox reads.
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	caFile := filepath.Join(dir, "cdn-ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	var ln net.Listener
	if err := inNS(func() (err error) {
		ln, err = net.Listen("tcp", netip.AddrPortFrom(cdn, 443).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}},
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "host=%s sni=%s", r.Host, r.TLS.ServerName)
			if a := r.Header.Get("Authorization"); a != "" {
				fmt.Fprintf(w, " auth=%s", a)
			}
		}),
	}
	go srv.ServeTLS(ln, "", "")
	t.Cleanup(func() { srv.Close() })
	return caFile
}

// serveCDNDNS answers A queries for names under cdn.test with the CDN's
// address; everything else is NXDOMAIN.
func serveCDNDNS(t *testing.T, at, cdn netip.Addr, inNS func(func() error) error) {
	t.Helper()
	serveDNSIn(t, at, inNS, func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		q := r.Question[0]
		if !strings.HasSuffix(strings.ToLower(q.Name), ".cdn.test.") {
			m.Rcode = dns.RcodeNameError
		} else if q.Qtype == dns.TypeA {
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 300}, A: cdn.AsSlice()})
		}
		w.WriteMsg(m)
	})
}

// serveDNSIn serves DNS over UDP on port 53 of at, inside the test's
// namespace, until the test ends.
func serveDNSIn(t *testing.T, at netip.Addr, inNS func(func() error) error, handler dns.HandlerFunc) {
	t.Helper()
	var pc net.PacketConn
	if err := inNS(func() (err error) {
		pc, err = net.ListenPacket("udp", netip.AddrPortFrom(at, 53).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: handler}
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	go srv.ActivateAndServe()
	<-started
	t.Cleanup(func() { srv.Shutdown() })
}
