package namerelay

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/watcherhq/watcher/internal/audit"
)

// The brokered secrets of the terminated-name tests: one bound to
// api.test and ro.test, one to other.test; bad.test is bound too, but the
// destination has no certificate for it.
const (
	tokenPlaceholder = "watcher-placeholder-sb-token"
	tokenValue       = "real-token-61a0"
	otherPlaceholder = "watcher-placeholder-sb-other"
	otherValue       = "real-other-93be"
)

// brokerFixture is a relay terminating TLS for the sandbox's secret-bound
// names, in front of a TLS destination on loopback that answers for them
// all with a certificate from its own CA.
type brokerFixture struct {
	relay  *Relay
	addr   netip.AddrPort
	dest   netip.AddrPort // the destination, for a client that goes direct
	upCA   *x509.CertPool // the destination's CA
	pol    *Policy        // change before the first connection only
	caFile string         // the sandbox CA, as the sandbox trusts it
	roots  *x509.CertPool // the sandbox CA
	mu     sync.Mutex
	evs    []audit.Event
}

// newBrokerFixture starts the destination (HTTP/2 and HTTP/1.1, or
// HTTP/1.1 only) and the relay. Every response names the protocol, the
// method, the Host and the Authorization the destination saw.
func newBrokerFixture(t testing.TB, upstreamH2 bool) *brokerFixture {
	t.Helper()
	upCA, upCert := testCertificates(t, "api.test", "other.test", "ro.test", "inspect.test", "plain.test")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			fmt.Fprintf(w, "%s %s host=%s auth=%s", r.Proto, r.Method, r.Host, r.Header.Get("Authorization"))
		}),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{upCert}},
		ErrorLog:  log.New(io.Discard, "", 0), // the refused handshake of TestH2UpstreamUnverified
	}
	if !upstreamH2 {
		srv.TLSNextProto = map[string]func(*http.Server, *tls.Conn, http.Handler){} // HTTP/1.1 only
	}
	go srv.ServeTLS(ln, "", "")
	t.Cleanup(func() { srv.Close() })
	dest := ln.Addr().(*net.TCPAddr).AddrPort()

	ca, err := NewCA("sb", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	f := &brokerFixture{caFile: filepath.Join(t.TempDir(), "sandbox-ca.pem"), roots: x509.NewCertPool(), dest: dest, upCA: upCA}
	f.roots.AppendCertsFromPEM(ca.CertPEM())
	if err := os.WriteFile(f.caFile, ca.CertPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	answers := NewAnswers(time.Minute)
	answers.Record(1, "api.test", []netip.Addr{dest.Addr()}, time.Minute)
	answers.Record(1, "other.test", []netip.Addr{dest.Addr()}, time.Minute)
	answers.Record(1, "ro.test", []netip.Addr{dest.Addr()}, time.Minute)
	answers.Record(1, "bad.test", []netip.Addr{dest.Addr()}, time.Minute)
	answers.Record(1, "inspect.test", []netip.Addr{dest.Addr()}, time.Minute)
	answers.Record(1, "plain.test", []netip.Addr{dest.Addr()}, time.Minute)
	pol := &Policy{Sandbox: "sb", Rule: "egress names", RuleID: 7, CA: ca,
		ReadOnly: NewNames([]string{"ro.test", "inspect.test"}),
		Inspect:  NewNames([]string{"inspect.test"}),
		Secrets: []Secret{
			{Name: "token", Placeholder: tokenPlaceholder, Value: tokenValue, Hosts: NewNames([]string{"api.test", "ro.test", "bad.test"})},
			{Name: "other", Placeholder: otherPlaceholder, Value: otherValue, Hosts: NewNames([]string{"other.test"})},
		}}
	f.pol = pol
	f.relay, err = New(Config{
		Listen:        []string{"127.0.0.1:0"},
		Lookup:        func(netip.AddrPort) (Conn, bool) { return Conn{SandboxID: 1, Dest: dest, PID: 42}, true },
		Policy:        func(id uint32) (*Policy, bool) { return pol, id == 1 },
		Answers:       answers,
		Events:        func(e audit.Event) { f.mu.Lock(); f.evs = append(f.evs, e); f.mu.Unlock() },
		HelloTimeout:  3 * time.Second,
		UpstreamRoots: upCA,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.relay.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.relay.Close() })
	f.addr = f.relay.Addrs()[0]
	return f
}

// testCertificates makes a CA and a leaf for names signed by it.
func testCertificates(t testing.TB, names ...string) (*x509.CertPool, tls.Certificate) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test destination CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(caCert)
	return pool, tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// client is Go's net/http client as a sandbox process has it: it trusts
// the sandbox CA and every connection lands on the relay. h2 false turns
// HTTP/2 off (ALPN offers http/1.1 only).
func (f *brokerFixture) client(h2 bool) *http.Client {
	tr := &http.Transport{
		TLSClientConfig:     &tls.Config{RootCAs: f.roots},
		ForceAttemptHTTP2:   h2,
		MaxIdleConnsPerHost: 16, // BenchmarkTerminated's HTTP/1.1 workers keep theirs
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", f.addr.String())
		},
	}
	if !h2 {
		tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	}
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// do sends one request and returns the protocol the client saw, the
// status and the body.
func do(t *testing.T, c *http.Client, method, url, host, auth string) (proto string, code int, body string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(map[bool]string{true: "payload"}[method == http.MethodPost]))
	if host != "" {
		req.Host = host
	}
	if auth != "" {
		req.Header.Set("Authorization", "Bearer "+auth)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.Proto, resp.StatusCode, string(b)
}

// event returns the first event whose reason contains want.
func (f *brokerFixture) event(want string) (audit.Event, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, e := range f.evs {
		if e.Net != nil && strings.Contains(e.Net.Reason, want) {
			return e, true
		}
	}
	return audit.Event{}, false
}

// noSecretInEvents fails if any event holds a secret's value.
func (f *brokerFixture) noSecretInEvents(t *testing.T) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, e := range f.evs {
		if s := fmt.Sprintf("%+v %+v", e, e.Net); strings.Contains(s, tokenValue) || strings.Contains(s, otherValue) {
			t.Errorf("an event holds a secret's value: %s", s)
		}
	}
}

// Over HTTP/2 (negotiated by Go's client; the relay speaks HTTP/2 to the
// destination too) the placeholder becomes the value for its host only,
// a read-only name refuses POST, and each refusal is one stream's: the
// next request on the same connection passes.
func TestH2GoClient(t *testing.T) {
	f := newBrokerFixture(t, true)
	c := f.client(true)

	proto, code, body := do(t, c, "GET", "https://api.test/v1/models", "", tokenPlaceholder)
	if proto != "HTTP/2.0" || code != 200 || body != "HTTP/2.0 GET host=api.test auth=Bearer "+tokenValue {
		t.Fatalf("bound host: %s %d %q", proto, code, body)
	}
	ev, ok := f.event(`secret "token" substituted for "api.test"`)
	if !ok || ev.Net.Op != "secret" || !strings.Contains(ev.Net.Reason, `"GET /v1/models"`) || ev.Net.Name != "api.test" {
		t.Errorf("substitution event: %v %+v", ok, ev.Net)
	}

	// The placeholder of the secret bound to other.test, sent to
	// api.test: a leak attempt, refused before it leaves.
	_, code, body = do(t, c, "GET", "https://api.test/", "", otherPlaceholder)
	if code != http.StatusForbidden || !strings.Contains(body, `placeholder of secret "other" may not be sent to "api.test"`) {
		t.Errorf("leak over h2: %d %q", code, body)
	}
	if ev, ok := f.event(`leak attempt: the placeholder of secret "other" sent to "api.test"`); !ok || ev.Verdict != audit.VerdictDenied {
		t.Errorf("leak attempt not recorded: %+v", ev)
	}

	_, code, body = do(t, c, "POST", "https://ro.test/upload", "", "")
	if code != http.StatusForbidden || !strings.Contains(body, `"ro.test" is read-only for this sandbox: "POST" refused`) {
		t.Errorf("POST to a read-only name over h2: %d %q", code, body)
	}
	if _, ok := f.event(`read-only name: method "POST" refused`); !ok {
		t.Error("read-only refusal not recorded")
	}
	proto, code, body = do(t, c, "GET", "https://ro.test/", "", "")
	if proto != "HTTP/2.0" || code != 200 || body != "HTTP/2.0 GET host=ro.test auth=" {
		t.Errorf("GET to the read-only name after the refused POST: %s %d %q", proto, code, body)
	}
	// The refused streams did not cost the connection: two names, one
	// TLS connection each, every request relayed or answered on them.
	if st := f.relay.Stats(); st.Accepted != 2 || st.Substituted != 1 || st.Refused != 2 {
		t.Errorf("stats %+v, want 2 connections, 1 substitution, 2 refusals", st)
	}
	f.noSecretInEvents(t)
}

// A destination that speaks HTTP/1.1 only gets HTTP/1.1 from the relay
// while the client keeps HTTP/2.
func TestH2UpstreamHTTP11(t *testing.T) {
	f := newBrokerFixture(t, false)
	proto, code, body := do(t, f.client(true), "GET", "https://api.test/", "", tokenPlaceholder)
	if proto != "HTTP/2.0" || code != 200 || body != "HTTP/1.1 GET host=api.test auth=Bearer "+tokenValue {
		t.Fatalf("h2 client, HTTP/1.1 destination: %s %d %q", proto, code, body)
	}
}

// A request for another name on a connection for api.test (HTTP/2
// connection coalescing) is answered 421 and recorded with both names;
// the next request on the same connection, for api.test, passes.
func TestH2Coalescing(t *testing.T) {
	f := newBrokerFixture(t, true)
	tc, err := tls.Dial("tcp", f.addr.String(), &tls.Config{ServerName: "api.test", RootCAs: f.roots, NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	if p := tc.ConnectionState().NegotiatedProtocol; p != "h2" {
		t.Fatalf("negotiated %q, want h2", p)
	}
	cc, err := (&http2.Transport{}).NewClientConn(tc)
	if err != nil {
		t.Fatal(err)
	}
	send := func(host string) (int, string) {
		req, _ := http.NewRequest("GET", "https://"+host+"/", nil)
		req.Header.Set("Authorization", "Bearer "+tokenPlaceholder)
		resp, err := cc.RoundTrip(req)
		if err != nil {
			t.Fatalf("%s: %v", host, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, body := send("other.test")
	if code != http.StatusMisdirectedRequest || body != "watcher: this connection was opened for \"api.test\"; \"other.test\" needs a connection of its own\n" {
		t.Errorf("coalesced request: %d %q", code, body)
	}
	ev, ok := f.event("connection coalescing")
	if !ok || ev.Net.Name != "other.test" || !strings.Contains(ev.Net.Reason, `"api.test"`) || ev.Rule != "egress names" || ev.Verdict != audit.VerdictDenied {
		t.Errorf("coalescing event: %v %+v %+v", ok, ev, ev.Net)
	}
	if code, body := send("api.test"); code != 200 || body != "HTTP/2.0 GET host=api.test auth=Bearer "+tokenValue {
		t.Errorf("the connection's own name after the refusal: %d %q", code, body)
	}
	// A tunnel on the connection would carry bytes nobody judges.
	req, _ := http.NewRequest("CONNECT", "", nil)
	req.Host = "api.test:443"
	if resp, err := cc.RoundTrip(req); err != nil || resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("CONNECT over h2: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	if ev, ok := f.event("CONNECT over HTTP/2"); !ok || ev.Net.Name != "api.test" {
		t.Errorf("CONNECT event: %v %+v", ok, ev.Net)
	}
	if st := f.relay.Stats(); st.Accepted != 1 {
		t.Errorf("%d connections, want both requests on one", st.Accepted)
	}
	f.noSecretInEvents(t)
}

// On HTTP/1.1 (the client offers only http/1.1) the terminated path is
// as before: the placeholder swapped, and a Host other than the TLS name
// refused with a 403 and recorded with both names.
func TestH1TerminatedHost(t *testing.T) {
	f := newBrokerFixture(t, true)
	c := f.client(false)
	proto, code, body := do(t, c, "GET", "https://api.test/", "", tokenPlaceholder)
	if proto != "HTTP/1.1" || code != 200 || body != "HTTP/1.1 GET host=api.test auth=Bearer "+tokenValue {
		t.Fatalf("bound host over HTTP/1.1: %s %d %q", proto, code, body)
	}
	_, code, body = do(t, c, "GET", "https://api.test/", "other.test", "")
	if code != http.StatusForbidden || body != "watcher: Host \"other.test\" differs from the TLS server name \"api.test\"\n" {
		t.Errorf("Host other than the TLS name: %d %q", code, body)
	}
	ev, ok := f.event(`Host "other.test" differs from the TLS server name "api.test"`)
	if !ok || ev.Net.Name != "other.test" || ev.Verdict != audit.VerdictDenied {
		t.Errorf("Host mismatch event: %v %+v", ok, ev.Net)
	}
	_, code, body = do(t, c, "POST", "https://ro.test/", "", "")
	if code != http.StatusForbidden || !strings.Contains(body, "read-only") {
		t.Errorf("POST to a read-only name over HTTP/1.1: %d %q", code, body)
	}
}

// A destination whose certificate does not verify for the name is a 502
// on the stream, and recorded.
func TestH2UpstreamUnverified(t *testing.T) {
	f := newBrokerFixture(t, true)
	_, code, body := do(t, f.client(true), "GET", "https://bad.test/", "", "")
	if code != http.StatusBadGateway || body != "watcher: the destination's certificate does not verify\n" {
		t.Errorf("unverified destination: %d %q", code, body)
	}
	if _, ok := f.event("certificate does not verify"); !ok {
		t.Error("verification failure not recorded")
	}
}

// In record-only mode a coalesced request is recorded and goes on, with
// its own Host, on the connection for the TLS name.
func TestH2CoalescingRecordOnly(t *testing.T) {
	f := newBrokerFixture(t, true)
	f.pol.RecordOnly = true
	_, code, body := do(t, f.client(true), "GET", "https://api.test/", "other.test", "")
	if code != 200 || body != "HTTP/2.0 GET host=other.test auth=" {
		t.Errorf("coalesced request in record-only mode: %d %q", code, body)
	}
	if ev, ok := f.event("connection coalescing"); !ok || ev.Verdict != audit.VerdictRecorded {
		t.Errorf("record: %v %+v", ok, ev)
	}
}

// An inspected name (egress.names.inspect) is terminated without a
// secret: its own Host passes, over HTTP/1.1 and HTTP/2, another site's
// Host inside the TLS is refused and recorded, and read_only applies. A
// name neither inspected nor secret-bound (plain.test) is passed through
// untouched: the client sees the destination's own certificate, and the
// Host inside is not judged (the limit inspect lifts).
func TestInspectedName(t *testing.T) {
	f := newBrokerFixture(t, true)
	for _, h2 := range []bool{false, true} {
		c := f.client(h2)
		want := map[bool]string{false: "HTTP/1.1", true: "HTTP/2.0"}[h2]
		proto, code, body := do(t, c, "GET", "https://inspect.test/", "", "")
		if proto != want || code != 200 || body != want+" GET host=inspect.test auth=" {
			t.Errorf("inspected name, own Host (%s): %s %d %q", want, proto, code, body)
		}
		_, code, body = do(t, c, "GET", "https://inspect.test/", "other.test", "")
		if code != http.StatusForbidden && code != http.StatusMisdirectedRequest {
			t.Errorf("inspected name, Host other.test (%s): %d %q, want 403 or 421", want, code, body)
		}
		_, code, body = do(t, c, "POST", "https://inspect.test/", "", "")
		if code != http.StatusForbidden || !strings.Contains(body, "read-only") {
			t.Errorf("POST to an inspected read-only name (%s): %d %q", want, code, body)
		}
	}
	if _, ok := f.event(`Host "other.test" differs from the TLS server name "inspect.test"`); !ok {
		t.Error("the fronted request on HTTP/1.1 was not recorded")
	}
	if _, ok := f.event(`HTTP/2 request for "other.test" on the connection for TLS server name "inspect.test"`); !ok {
		t.Error("the fronted request on HTTP/2 was not recorded")
	}

	// plain.test: passed through, the destination's certificate, the Host
	// inside unseen.
	tr := &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: f.upCA},
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", f.addr.String())
		},
	}
	c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	_, code, body := do(t, c, "GET", "https://plain.test/", "other.test", "")
	if code != 200 || !strings.Contains(body, "host=other.test") {
		t.Errorf("a name not inspected is passed through: %d %q", code, body)
	}
}
