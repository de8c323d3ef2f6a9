package egress_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/dnsproxy"
	"github.com/watcherhq/watcher/internal/enforce/egress"
	"github.com/watcherhq/watcher/internal/enforce/enforcetest"
	"github.com/watcherhq/watcher/internal/enforce/rules/egressrules"
	"github.com/watcherhq/watcher/internal/namerelay"
)

// cdn is a small content delivery network on the test network's "allowed"
// host: one address, a TLS server (443) and a plain HTTP server (8080)
// answering for every name, a certificate for several names, and a
// server-first service (2222). Every response names the host it served.
type cdn struct {
	caFile string
	ca     *x509.CertPool
}

func newCDN(t testing.TB, n *testNet) *cdn {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "watcher test CDN CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "cdn.test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		DNSNames:    []string{"cdn.test", "*.cdn.test", "forbidden.test", "*.allowed.test"},
		IPAddresses: []net.IP{n.allowed.AsSlice(), n.allowed6.AsSlice()},
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	c := &cdn{caFile: filepath.Join(t.TempDir(), "ca.pem"), ca: x509.NewCertPool()}
	c.ca.AddCert(caCert)
	if err := os.WriteFile(c.caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o644); err != nil {
		t.Fatal(err)
	}
	cert := tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}

	repo := gitRepo(t)
	files := http.StripPrefix("/repo.git/", http.FileServer(http.Dir(repo)))
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/repo.git/") {
			files.ServeHTTP(w, r) // git's dumb HTTP protocol
			return
		}
		sni := ""
		if r.TLS != nil {
			sni = r.TLS.ServerName
		}
		if r.URL.Path == "/big" {
			size, _ := strconv.Atoi(r.URL.Query().Get("n"))
			w.Header().Set("Content-Length", strconv.Itoa(size))
			buf := bytes.Repeat([]byte("0123456789abcdef"), 4096)
			for size > 0 {
				k := min(size, len(buf))
				if _, err := w.Write(buf[:k]); err != nil {
					return
				}
				size -= k
			}
			return
		}
		io.Copy(io.Discard, r.Body)
		fmt.Fprintf(w, "%s host=%s sni=%s", r.Method, r.Host, sni)
		if a := r.Header.Get("Authorization"); a != "" {
			fmt.Fprintf(w, " auth=%s", a)
		}
	})
	for _, a := range []netip.Addr{n.allowed, n.allowed6} {
		tl := n.listen(t, "tcp", netip.AddrPortFrom(a, 443)).(net.Listener)
		srv := &http.Server{Handler: handler, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}}
		go srv.ServeTLS(tl, "", "")
		if a.Is4() {
			// TLS on a port no rule calls TLS's.
			tl2 := n.listen(t, "tcp", netip.AddrPortFrom(a, 8443)).(net.Listener)
			go (&http.Server{Handler: handler, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}}).ServeTLS(tl2, "", "")
		}
		pl := n.listen(t, "tcp", netip.AddrPortFrom(a, 8080)).(net.Listener)
		go (&http.Server{Handler: handler}).Serve(pl)
	}
	for _, port := range []uint16{2222, 2223} {
		banner := n.listen(t, "tcp", netip.AddrPortFrom(n.allowed, port)).(net.Listener)
		go func() {
			for {
				c, err := banner.Accept()
				if err != nil {
					return
				}
				c.Write([]byte("SSH-2.0-cdn\n"))
				c.Close()
			}
		}()
	}
	return c
}

// gitRepo makes a bare repository with one commit, ready for git's dumb
// HTTP protocol; "" when git is not installed.
func gitRepo(t testing.TB) string {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		return ""
	}
	dir := t.TempDir()
	bare, work := filepath.Join(dir, "repo.git"), filepath.Join(dir, "work")
	for _, args := range [][]string{
		{"init", "-q", "--bare", bare},
		{"init", "-q", work},
		{"-C", work, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "first"},
		{"-C", work, "push", "-q", bare, "HEAD:refs/heads/main"},
		{"-C", bare, "symbolic-ref", "HEAD", "refs/heads/main"},
		{"-C", bare, "update-server-info"},
	} {
		if out, err := exec.Command("git", args...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v: %s", args, err, out)
		}
	}
	return bare
}

// relayFixture is the egress fixture with name binding on for the
// sandbox and the record-only sandbox.
type relayFixture struct {
	*fixture
	cdn     *cdn
	relay   *namerelay.Relay
	answers *namerelay.Answers
	rc      egress.RelayConfig
	// sandboxCA is the file of the sandbox's credential-broker CA.
	sandboxCA string
}

// The sandbox's secret: it holds the placeholder, the relay the value.
const (
	secretName        = "api-token"
	secretPlaceholder = "watcher-placeholder-api-token-5d1c"
	secretValue       = "real-token-8f2e91"
)

func setupRelay(t testing.TB) *relayFixture {
	t.Helper()
	f := setup(t)
	cookie, err := egress.NetnsCookie()
	if err != nil {
		t.Skipf("SO_NETNS_COOKIE (kernel 5.14+): %v", err)
	}
	rf := &relayFixture{fixture: f, cdn: newCDN(t, f.net), answers: namerelay.NewAnswers(grace)}
	// The CDN also serves plain HTTP on 8080, TLS on 8443 and a
	// server-first protocol on 2223: open them as egress.name_ports would
	// (answers admit TCP 80 and 443 only by default).
	open := []egressrules.PortSpan{{Lo: 80, Hi: 80, Protocol: egressrules.ProtoTCP}, {Lo: 443, Hi: 443, Protocol: egressrules.ProtoTCP},
		{Lo: 8080, Hi: 8080, Protocol: egressrules.ProtoTCP}, {Lo: 8443, Hi: 8443, Protocol: egressrules.ProtoTCP},
		{Lo: 2223, Hi: 2223, Protocol: egressrules.ProtoTCP}}
	f.admit.Scopes = func(string) *egressrules.Scope { return &egressrules.Scope{Default: open} }
	hook := func(a dnsproxy.Answer) {
		if id, ok := f.dir.ID(a.Sandbox); ok {
			rf.answers.Record(id, a.Name, a.Addrs, time.Duration(a.TTL)*time.Second)
		}
	}
	f.onAnswer.Store(&hook)
	ca, err := namerelay.NewCA("sb", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	rf.sandboxCA = filepath.Join(t.TempDir(), "sandbox-ca.pem")
	if err := os.WriteFile(rf.sandboxCA, ca.CertPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	policies := map[uint32]*namerelay.Policy{
		sandboxID: {Sandbox: "sb", NameAllowed: func(n string) bool { return f.proxy.NameListed("sb", n) },
			CA: ca, Secrets: []namerelay.Secret{{Name: secretName, Placeholder: secretPlaceholder, Value: secretValue,
				Hosts: namerelay.NewNames([]string{"api.cdn.test"})}},
			ReadOnly: namerelay.NewNames([]string{".ro.cdn.test"}), ECH: namerelay.NewNames([]string{"ech.cdn.test"}),
			UnnamedPorts: []namerelay.PortRange{{Lo: 2223, Hi: 2223}},
			Rule:         "egress names", RuleID: 77},
		recordID: {Sandbox: "rec", RecordOnly: true, NameAllowed: func(n string) bool { return f.proxy.NameListed("rec", n) }},
	}
	rf.relay, err = namerelay.New(namerelay.Config{
		Listen: []string{"127.0.0.1:0", "[::1]:0"},
		Lookup: func(src netip.AddrPort) (namerelay.Conn, bool) {
			r, ok := f.eg.LookupRelayed(src, time.Minute)
			return namerelay.Conn{SandboxID: r.SandboxID, Dest: r.Dest, PID: r.PID, Cgroup: r.Cgroup}, ok
		},
		Policy: func(id uint32) (*namerelay.Policy, bool) {
			p, ok := policies[id]
			return p, ok
		},
		Answers:       rf.answers,
		UpstreamRoots: rf.cdn.ca,
		Events:        func(ev audit.Event) { f.kernelEvents.Notify(ev) },
		HelloTimeout:  time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := rf.relay.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rf.relay.Close() })
	rc := egress.RelayConfig{NetnsCookie: cookie, RefuseQUIC: true}
	for _, a := range rf.relay.Addrs() {
		if a.Addr().Is4() {
			rc.Relay4 = a
		} else {
			rc.Relay6 = a
		}
	}
	rf.rc = rc
	for _, id := range []uint32{sandboxID, recordID} {
		if err := f.eg.SetRelay(id, rc); err != nil {
			t.Fatal(err)
		}
	}
	return rf
}

// run runs a command in the sandbox and returns its output and error.
func (rf *relayFixture) run(t testing.TB, cg string, env []string, name string, args ...string) (string, error) {
	t.Helper()
	cmd := enforcetest.Command(t, cg, name, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (rf *relayFixture) curl(t testing.TB, cg string, args ...string) (string, error) {
	t.Helper()
	return rf.run(t, cg, nil, "curl", append([]string{"-sS", "--max-time", "10", "--cacert", rf.cdn.caFile}, args...)...)
}

// refusal waits for the relay's refusal of name.
func (rf *relayFixture) refusal(t *testing.T, name string, verdict audit.Verdict) audit.Event {
	t.Helper()
	return rf.kernelEvents.wait(t, "relay refusal of "+name, func(ev audit.Event) bool {
		return ev.Mechanism == namerelay.Mechanism && ev.Net != nil && ev.Net.Name == name && ev.Verdict == verdict
	})
}

func TestNameBinding(t *testing.T) {
	rf := setupRelay(t)
	n := rf.net
	sb := rf.sandbox
	allowed443 := netip.AddrPortFrom(n.allowed, 443).String()

	t.Run("curl answered name", func(t *testing.T) {
		before := rf.relay.Stats().Passed
		out, err := rf.curl(t, sb, "https://a.cdn.test/")
		if err != nil || out != "GET host=a.cdn.test sni=a.cdn.test" {
			t.Fatalf("curl: %v: %s", err, out)
		}
		if rf.relay.Stats().Passed <= before {
			t.Fatal("the connection did not go through the relay")
		}
		out, err = rf.curl(t, sb, "-4", "http://a.cdn.test:8080/")
		if err != nil || out != "GET host=a.cdn.test:8080 sni=" {
			t.Fatalf("curl http: %v: %s", err, out)
		}
	})

	t.Run("curl fronting by SNI refused", func(t *testing.T) {
		// a.cdn.test was answered with the CDN's address; the client
		// connects there and names a site the policy does not allow.
		if out, err := rf.curl(t, sb, "https://a.cdn.test/"); err != nil {
			t.Fatalf("resolve first: %v: %s", err, out)
		}
		out, err := rf.curl(t, sb, "--resolve", "forbidden.test:443:"+n.allowed.String(), "https://forbidden.test/")
		if err == nil || strings.Contains(out, "host=") {
			t.Fatalf("fronted name reached the server: %s", out)
		}
		ev := rf.refusal(t, "forbidden.test", audit.VerdictDenied)
		if !strings.Contains(ev.Net.Reason, `"a.cdn.test"`) || ev.Net.Addr != n.allowed.String() || ev.Net.Port != 443 || ev.RuleID != 77 ||
			ev.Process.CgroupID != rf.sbCg {
			t.Errorf("refusal event: %+v %+v", ev, ev.Net)
		}
		// --connect-to: DNS for the allowed name, SNI of another.
		out, err = rf.curl(t, sb, "-4", "--connect-to", "evil.test:443:a.cdn.test:443", "https://evil.test/")
		if err == nil {
			t.Fatalf("connect-to fronting passed: %s", out)
		}
		rf.refusal(t, "evil.test", audit.VerdictDenied)
	})

	t.Run("IPv6 through the relay", func(t *testing.T) {
		before := rf.relay.Stats().Passed
		out, err := rf.curl(t, sb, "-6", "https://a.cdn.test/")
		if err != nil || out != "GET host=a.cdn.test sni=a.cdn.test" {
			t.Fatalf("curl -6: %v: %s", err, out)
		}
		if rf.relay.Stats().Passed <= before {
			t.Fatal("the IPv6 connection did not go through the relay")
		}
		out, err = rf.curl(t, sb, "-6", "--resolve", "forbidden6.test:443:["+n.allowed6.String()+"]", "https://forbidden6.test/")
		if err == nil || strings.Contains(out, "host=") {
			t.Fatalf("fronted name over IPv6 reached the server: %s", out)
		}
		ev := rf.refusal(t, "forbidden6.test", audit.VerdictDenied)
		if ev.Net.Addr != n.allowed6.String() || ev.Net.Family != 10 {
			t.Errorf("IPv6 refusal event: %+v", ev.Net)
		}
	})

	t.Run("curl fronting by Host refused with 403", func(t *testing.T) {
		out, err := rf.curl(t, sb, "-4", "-H", "Host: forbidden.test", "http://a.cdn.test:8080/")
		if err != nil || !strings.Contains(out, "not a name answered") {
			t.Fatalf("Host fronting: %v: %s", err, out)
		}
		rf.refusal(t, "forbidden.test", audit.VerdictDenied)
	})

	t.Run("listed name passes unanswered", func(t *testing.T) {
		// b.cdn.test is on the allow list but was never resolved.
		out, err := rf.curl(t, sb, "--resolve", "b.cdn.test:443:"+n.allowed.String(), "https://b.cdn.test/")
		if err != nil || out != "GET host=b.cdn.test sni=b.cdn.test" {
			t.Fatalf("curl: %v: %s", err, out)
		}
	})

	t.Run("no SNI refused", func(t *testing.T) {
		out, err := rf.curl(t, sb, "-k", "https://"+allowed443+"/")
		if err == nil {
			t.Fatalf("IP literal passed: %s", out)
		}
		rf.kernelEvents.wait(t, "no-SNI refusal", func(ev audit.Event) bool {
			return ev.Mechanism == namerelay.Mechanism && ev.Net != nil && strings.Contains(ev.Net.Reason, "without a server name")
		})
	})

	t.Run("server-first protocol refused", func(t *testing.T) {
		r, _ := rf.connect(t, sb, netip.AddrPortFrom(n.allowed, 2222))
		if r.ok && r.text != "" {
			t.Fatalf("unnamed connection got the banner: %s", r)
		}
	})

	t.Run("unnamed port passes without a name", func(t *testing.T) {
		r, _ := rf.connect(t, sb, netip.AddrPortFrom(n.allowed, 2223))
		mustOK(t, "server-first protocol on an unnamed port", r, "SSH-2.0-cdn")
	})

	t.Run("TLS on another port", func(t *testing.T) {
		out, err := rf.curl(t, sb, "-4", "https://a.cdn.test:8443/")
		if err != nil || out != "GET host=a.cdn.test:8443 sni=a.cdn.test" {
			t.Fatalf("curl :8443: %v: %s", err, out)
		}
		out, err = rf.curl(t, sb, "-4", "--resolve", "other8443.test:8443:"+n.allowed.String(), "https://other8443.test:8443/")
		if err == nil {
			t.Fatalf("fronting on :8443 passed: %s", out)
		}
		rf.refusal(t, "other8443.test", audit.VerdictDenied)
	})

	t.Run("read-only name", func(t *testing.T) {
		out, err := rf.curl(t, sb, "-4", "http://x.ro.cdn.test:8080/")
		if err != nil || out != "GET host=x.ro.cdn.test:8080 sni=" {
			t.Fatalf("GET: %v: %s", err, out)
		}
		out, err = rf.curl(t, sb, "-4", "-d", "secret=1", "http://x.ro.cdn.test:8080/")
		if err != nil || !strings.Contains(out, "read-only") || strings.Contains(out, "host=") {
			t.Fatalf("POST: %v: %s", err, out)
		}
		out, _ = rf.curl(t, sb, "-4", "-o", "/dev/null", "-w", "%{http_code}", "-X", "PUT", "http://x.ro.cdn.test:8080/")
		if out != "403" {
			t.Fatalf("PUT: status %s", out)
		}
		// A second request on the same connection is judged too.
		out, _ = rf.curl(t, sb, "-4", "http://x.ro.cdn.test:8080/", "-X", "DELETE", "http://x.ro.cdn.test:8080/")
		if strings.Contains(out, "DELETE host=") {
			t.Fatalf("second request's method passed: %s", out)
		}
	})

	t.Run("split ClientHello passes", func(t *testing.T) {
		r, _ := rf.op(t, sb, "tls-split", "WATCHER_NAME=a.cdn.test", "WATCHER_CA="+rf.cdn.caFile)
		mustOK(t, "split hello", r, "GET host=a.cdn.test sni=a.cdn.test")
	})

	t.Run("ECH refused unless the outer name is allowed", func(t *testing.T) {
		r, _ := rf.op(t, sb, "tls-ech", "WATCHER_NAME=a.cdn.test")
		mustOK(t, "ECH", r, "alert")
		rf.refusal(t, "a.cdn.test", audit.VerdictDenied)
		r, _ = rf.op(t, sb, "tls-ech", "WATCHER_NAME=ech.cdn.test")
		mustOK(t, "ECH, outer name allowed", r, "server hello")
		r, _ = rf.op(t, sb, "tls-ech", "WATCHER_NAME=a.cdn.test", "WATCHER_NO_ECH=1")
		mustOK(t, "same hello without ECH", r, "server hello")
	})

	t.Run("QUIC refused", func(t *testing.T) {
		r, pid := rf.op(t, sb, "udp", "WATCHER_ADDR="+allowed443)
		mustEPERM(t, "UDP 443", r)
		ev := rf.netEvent(t, pid, netip.AddrPortFrom(n.allowed, 443))
		if !strings.Contains(ev.Net.Reason, "QUIC") {
			t.Errorf("reason: %s", ev.Net.Reason)
		}
	})

	t.Run("getpeername shows the destination", func(t *testing.T) {
		r, _ := rf.op(t, sb, "peer", "WATCHER_ADDR="+allowed443)
		mustOK(t, "peer", r, allowed443)
	})

	t.Run("large download", func(t *testing.T) {
		const size = 64 << 20
		out, err := rf.curl(t, sb, "-o", "/dev/null", "-w", "%{size_download}", "https://a.cdn.test/big?n="+strconv.Itoa(size))
		if err != nil || out != strconv.Itoa(size) {
			t.Fatalf("download: %v: %s", err, out)
		}
	})

	t.Run("python", func(t *testing.T) {
		if _, err := exec.LookPath("python3"); err != nil {
			t.Skip("python3 is not installed")
		}
		script := `
import ssl, socket, sys, urllib.request
ctx = ssl.create_default_context(cafile=sys.argv[1])
print(urllib.request.urlopen("https://a.cdn.test/", context=ctx).read().decode())
try:
    import requests
    print(requests.get("https://b.cdn.test/", verify=sys.argv[1]).text)
except ImportError:
    print("GET host=b.cdn.test sni=b.cdn.test")
s = socket.create_connection(("a.cdn.test", 443))
try:
    ctx.wrap_socket(s, server_hostname="forbidden.test").sendall(b"GET / HTTP/1.0\r\n\r\n")
    print("fronted: passed")
except (ssl.SSLError, OSError) as e:
    print("fronted: refused")
`
		out, err := rf.run(t, sb, nil, "python3", "-c", script, rf.cdn.caFile)
		want := "GET host=a.cdn.test sni=a.cdn.test\nGET host=b.cdn.test sni=b.cdn.test\nfronted: refused\n"
		if err != nil || out != want {
			t.Fatalf("python: %v:\n%s", err, out)
		}
	})

	t.Run("IPv4-mapped address on an IPv6 socket", func(t *testing.T) {
		if _, err := exec.LookPath("python3"); err != nil {
			t.Skip("python3 is not installed")
		}
		script := `
import socket, ssl, sys
s = socket.socket(socket.AF_INET6)
s.connect(("::ffff:" + sys.argv[2], 443))
c = ssl.create_default_context(cafile=sys.argv[1]).wrap_socket(s, server_hostname="a.cdn.test")
print(c.getpeername()[0])
c.sendall(b"GET / HTTP/1.0\r\nHost: a.cdn.test\r\n\r\n")
data = b""
while True:
    b = c.recv(4096)
    if not b:
        break
    data += b
print(data.decode().split("\r\n\r\n", 1)[1])
`
		out, err := rf.run(t, sb, nil, "python3", "-c", script, rf.cdn.caFile, n.allowed.String())
		want := "::ffff:" + n.allowed.String() + "\nGET host=a.cdn.test sni=a.cdn.test\n"
		if err != nil || out != want {
			t.Fatalf("mapped: %v:\n%s\nwant:\n%s", err, out, want)
		}
	})

	t.Run("node fetch", func(t *testing.T) {
		if _, err := exec.LookPath("node"); err != nil {
			t.Skip("node is not installed")
		}
		script := `
const https = require("https");
(async () => {
  console.log(await (await fetch("https://a.cdn.test/")).text());
  // The CDN's name for the connection, another site's in the hello.
  https.get({host: "a.cdn.test", servername: "forbidden.test", family: 4}, (res) => {
    console.log("fronted: passed");
  }).on("error", () => console.log("fronted: refused"));
})();`
		out, err := rf.run(t, sb, []string{"NODE_EXTRA_CA_CERTS=" + rf.cdn.caFile}, "node", "-e", script)
		if err != nil || out != "GET host=a.cdn.test sni=a.cdn.test\nfronted: refused\n" {
			t.Fatalf("node: %v:\n%s", err, out)
		}
		rf.refusal(t, "forbidden.test", audit.VerdictDenied)
	})

	t.Run("git over HTTPS", func(t *testing.T) {
		if _, err := exec.LookPath("git"); err != nil {
			t.Skip("git is not installed")
		}
		env := []string{"GIT_SSL_CAINFO=" + rf.cdn.caFile, "GIT_TERMINAL_PROMPT=0", "HOME=" + t.TempDir()}
		dest := filepath.Join(t.TempDir(), "clone")
		if out, err := rf.run(t, sb, env, "git", "clone", "-q", "https://a.cdn.test/repo.git", dest); err != nil {
			t.Fatalf("clone: %v: %s", err, out)
		}
		out, err := rf.run(t, sb, env, "git", "-c", "http.curloptResolve=evil-git.test:443:"+n.allowed.String(), "clone", "-q", "https://evil-git.test/repo.git", dest+"2")
		if err == nil {
			t.Fatalf("fronted clone passed: %s", out)
		}
		rf.refusal(t, "evil-git.test", audit.VerdictDenied)
	})

	t.Run("go net/http fronting", func(t *testing.T) {
		r, _ := rf.op(t, sb, "https-get", "WATCHER_NAME=a.cdn.test", "WATCHER_SNI=a.cdn.test", "WATCHER_CA="+rf.cdn.caFile)
		mustOK(t, "go get", r, "GET host=a.cdn.test sni=a.cdn.test")
		r, _ = rf.op(t, sb, "https-get", "WATCHER_NAME=a.cdn.test", "WATCHER_SNI=forbidden.test", "WATCHER_CA="+rf.cdn.caFile)
		if r.ok {
			t.Fatalf("go fronting passed: %s", r)
		}
	})

	t.Run("credential brokering", func(t *testing.T) {
		auth := "Authorization: Bearer " + secretPlaceholder
		// The sandbox trusts its own CA only: the relay terminates TLS
		// for api.cdn.test and verifies the CDN with the CDN's CA.
		out, err := rf.run(t, sb, nil, "curl", "-sS", "--max-time", "10", "--cacert", rf.sandboxCA, "-H", auth, "https://api.cdn.test/v1/models")
		if err != nil || out != "GET host=api.cdn.test sni=api.cdn.test auth=Bearer "+secretValue {
			t.Fatalf("bound host: %v: %s", err, out)
		}
		ev := rf.kernelEvents.wait(t, "substitution", func(ev audit.Event) bool {
			return ev.Mechanism == namerelay.Mechanism && ev.Net != nil && ev.Net.Op == "secret"
		})
		if !strings.Contains(ev.Net.Reason, `"api-token"`) || !strings.Contains(ev.Net.Reason, "/v1/models") || ev.Net.Name != "api.cdn.test" {
			t.Errorf("substitution event: %+v", ev.Net)
		}
		rf.kernelEvents.mu.Lock()
		for _, e := range rf.kernelEvents.evs {
			if strings.Contains(fmt.Sprintf("%+v %+v", e, e.Net), secretValue) {
				t.Errorf("an event holds the secret: %+v", e.Net)
			}
		}
		rf.kernelEvents.mu.Unlock()
		// Python requests, trusting the sandbox CA through the
		// environment, with the placeholder from its environment.
		if _, err := exec.LookPath("python3"); err == nil {
			script := `import os, requests
print(requests.get("https://api.cdn.test/", headers={"Authorization": "Bearer " + os.environ["API_TOKEN"]}).text)`
			out, err := rf.run(t, sb, []string{"REQUESTS_CA_BUNDLE=" + rf.sandboxCA, "API_TOKEN=" + secretPlaceholder}, "python3", "-c", script)
			if err != nil || strings.TrimSpace(out) != "GET host=api.cdn.test sni=api.cdn.test auth=Bearer "+secretValue {
				t.Errorf("python requests: %v: %s", err, out)
			}
		}
		// Node fetch, trusting the sandbox CA through NODE_EXTRA_CA_CERTS.
		if _, err := exec.LookPath("node"); err == nil {
			script := `fetch("https://api.cdn.test/", {headers: {Authorization: "Bearer " + process.env.API_TOKEN}}).then(r => r.text()).then(console.log)`
			out, err := rf.run(t, sb, []string{"NODE_EXTRA_CA_CERTS=" + rf.sandboxCA, "API_TOKEN=" + secretPlaceholder}, "node", "-e", script)
			if err != nil || strings.TrimSpace(out) != "GET host=api.cdn.test sni=api.cdn.test auth=Bearer "+secretValue {
				t.Errorf("node fetch: %v: %s", err, out)
			}
		}
		// The placeholder sent to another host (plain HTTP: visible) is
		// a leak attempt, refused before it leaves.
		out, err = rf.curl(t, sb, "-4", "-H", auth, "http://a.cdn.test:8080/")
		if err != nil || !strings.Contains(out, "may not be sent") || strings.Contains(out, "host=") {
			t.Fatalf("leak over plain HTTP: %v: %s", err, out)
		}
		rf.kernelEvents.wait(t, "leak attempt", func(ev audit.Event) bool {
			return ev.Mechanism == namerelay.Mechanism && ev.Net != nil && strings.Contains(ev.Net.Reason, "leak attempt") && ev.Verdict == audit.VerdictDenied
		})
		// On the bound host, a Host header naming another site is refused.
		out, _ = rf.run(t, sb, nil, "curl", "-sS", "--max-time", "10", "--cacert", rf.sandboxCA, "-H", "Host: a.cdn.test", "https://api.cdn.test/")
		if strings.Contains(out, "host=") {
			t.Fatalf("Host switch inside terminated TLS: %s", out)
		}
		if rf.relay.Stats().Substituted < 1 {
			t.Error("no substitution counted")
		}
	})

	t.Run("record-only sandbox records fronting", func(t *testing.T) {
		if out, err := rf.curl(t, rf.record, "https://a.allowed.test/"); err != nil {
			t.Fatalf("resolve: %v: %s", err, out)
		}
		out, err := rf.curl(t, rf.record, "--resolve", "other.test:443:"+n.allowed.String(), "-k", "https://other.test/")
		if err != nil || out != "GET host=other.test sni=other.test" {
			t.Fatalf("record-only fronting: %v: %s", err, out)
		}
		rf.refusal(t, "other.test", audit.VerdictRecorded)
	})
}

// relayHelpers are helper modes of the name-binding test.
var relayHelpers = map[string]func(ctx context.Context) (string, error){
	"tls-split":      helperTLSSplit,
	"bench-requests": helperBenchRequests,
	"bench-download": helperBenchDownload,
	"tls-ech":        helperTLSECH,
	"peer":           helperPeer,
	"https-get":      helperHTTPSGet,
}

func loadCA() (*x509.CertPool, error) {
	b, err := os.ReadFile(os.Getenv("WATCHER_CA"))
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(b)
	return pool, nil
}

// splitConn re-frames the first TLS write (the ClientHello) as records of
// 100 bytes and sends it 40 bytes at a time, pausing between segments.
type splitConn struct {
	net.Conn
	done bool
}

func (c *splitConn) Write(b []byte) (int, error) {
	if c.done || len(b) < 5 || b[0] != 0x16 {
		return c.Conn.Write(b)
	}
	c.done = true
	var framed []byte
	for body := b[5:]; len(body) > 0; {
		k := min(100, len(body))
		framed = append(framed, 0x16, b[1], b[2], byte(k>>8), byte(k))
		framed = append(framed, body[:k]...)
		body = body[k:]
	}
	for p := framed; len(p) > 0; {
		k := min(40, len(p))
		if _, err := c.Conn.Write(p[:k]); err != nil {
			return 0, err
		}
		p = p[k:]
		time.Sleep(5 * time.Millisecond)
	}
	return len(b), nil
}

func helperTLSSplit(ctx context.Context) (string, error) {
	pool, err := loadCA()
	if err != nil {
		return "", err
	}
	name := os.Getenv("WATCHER_NAME")
	tr := &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool},
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, "tcp4", addr)
			if err != nil {
				return nil, err
			}
			c.(*net.TCPConn).SetNoDelay(true)
			return &splitConn{Conn: c}, nil
		},
	}
	return httpGet(ctx, &http.Client{Transport: tr}, "https://"+name+"/")
}

func httpGet(ctx context.Context, c *http.Client, url string) (string, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// helperHTTPSGet fetches https://WATCHER_NAME/ with Go's net/http, naming
// WATCHER_SNI in the ClientHello.
func helperHTTPSGet(ctx context.Context) (string, error) {
	pool, err := loadCA()
	if err != nil {
		return "", err
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: os.Getenv("WATCHER_SNI")}}
	return httpGet(ctx, &http.Client{Transport: tr}, "https://"+os.Getenv("WATCHER_NAME")+"/")
}

// helperTLSECH sends a ClientHello for WATCHER_NAME carrying an
// encrypted_client_hello extension (unless WATCHER_NO_ECH) and reports
// what came back: "alert" or "server hello".
func helperTLSECH(ctx context.Context) (string, error) {
	name := os.Getenv("WATCHER_NAME")
	hello, err := captureHello(name)
	if err != nil {
		return "", err
	}
	if os.Getenv("WATCHER_NO_ECH") == "" {
		// An outer ECH extension: type 0 (outer), a made-up config and
		// payload; the relay only looks at its presence.
		if hello, err = addExtension(hello, 0xfe0d, append([]byte{0, 0, 1, 0, 1, 7, 0, 0, 0, 4}, 1, 2, 3, 4)); err != nil {
			return "", err
		}
	}
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp4", net.JoinHostPort(name, "443"))
	if err != nil {
		return "", err
	}
	defer c.Close()
	if _, err := c.Write(hello); err != nil {
		return "", err
	}
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	b := make([]byte, 1)
	if _, err := io.ReadFull(c, b); err != nil {
		return "", err
	}
	switch b[0] {
	case 0x15:
		return "alert", nil
	case 0x16:
		return "server hello", nil
	}
	return fmt.Sprintf("record type %d", b[0]), nil
}

// captureHello is the ClientHello crypto/tls sends for name.
func captureHello(name string) ([]byte, error) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	go tls.Client(a, &tls.Config{ServerName: name, InsecureSkipVerify: true}).Handshake()
	b.SetReadDeadline(time.Now().Add(3 * time.Second))
	hdr := make([]byte, 5)
	if _, err := io.ReadFull(b, hdr); err != nil {
		return nil, err
	}
	body := make([]byte, binary.BigEndian.Uint16(hdr[3:]))
	if _, err := io.ReadFull(b, body); err != nil {
		return nil, err
	}
	return append(hdr, body...), nil
}

// addExtension appends an extension to a one-record ClientHello, fixing
// the three lengths around it.
func addExtension(rec []byte, typ uint16, data []byte) ([]byte, error) {
	body := rec[9:]
	off := 2 + 32
	off += 1 + int(body[off])
	off += 2 + int(binary.BigEndian.Uint16(body[off:]))
	off += 1 + int(body[off])
	if off+2 > len(body) {
		return nil, errors.New("hello without extensions")
	}
	extLen := int(binary.BigEndian.Uint16(body[off:]))
	add := binary.BigEndian.AppendUint16(nil, typ)
	add = binary.BigEndian.AppendUint16(add, uint16(len(data)))
	add = append(add, data...)
	out := append([]byte(nil), rec...)
	out = append(out, add...)
	binary.BigEndian.PutUint16(out[9+off:], uint16(extLen+len(add)))
	hl := len(out) - 9
	out[6], out[7], out[8] = byte(hl>>16), byte(hl>>8), byte(hl)
	binary.BigEndian.PutUint16(out[3:], uint16(len(out)-5))
	return out, nil
}

// helperPeer connects and prints the peer address getpeername reports.
func helperPeer(ctx context.Context) (string, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp4", os.Getenv("WATCHER_ADDR"))
	if err != nil {
		return "", err
	}
	defer c.Close()
	return c.RemoteAddr().String(), nil
}
