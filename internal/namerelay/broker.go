package namerelay

// Credential brokering: a sandbox holds placeholders, not secrets. For the
// hosts a secret is bound to, the relay terminates TLS with a per-sandbox
// CA the sandbox trusts, swaps the placeholder in the request headers (and
// query) for the real value, and re-encrypts upstream with full
// certificate verification. A placeholder on its way anywhere else, where
// the relay sees it, is refused and recorded as a leak attempt.

import (
	"bufio"
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
)

// Secret is a credential the sandbox knows only by its placeholder.
type Secret struct {
	// Name names the secret in events (never the value).
	Name string
	// Placeholder is what the sandbox holds and sends.
	Placeholder string
	// Value is the real credential; it never enters the sandbox.
	Value string
	// Hosts are the names the secret may be sent to.
	Hosts Names
}

// CA is a sandbox's certificate authority for terminated TLS: the sandbox
// trusts it (SSL_CERT_FILE and friends), nobody else does.
type CA struct {
	cert *x509.Certificate
	key  crypto.Signer
	pem  []byte

	mu     sync.Mutex
	leaves map[string]*tls.Certificate
}

// NewCA makes a CA named for sandbox, valid for validity.
func NewCA(sandbox string, validity time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("sandbox CA: %w", err)
	}
	serial, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: "watcher sandbox " + sandbox + " credential broker"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(validity),
		IsCA: true, BasicConstraintsValid: true, MaxPathLenZero: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("sandbox CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("sandbox CA: %w", err)
	}
	return &CA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		leaves: map[string]*tls.Certificate{}}, nil
}

// CertPEM is the CA certificate, for the sandbox's trust store.
func (c *CA) CertPEM() []byte { return c.pem }

// leaf returns a certificate for name signed by the CA.
func (c *CA) leaf(name string) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if l := c.leaves[name]; l != nil && time.Until(l.Leaf.NotAfter) > time.Hour {
		return l, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	notAfter := time.Now().Add(24 * time.Hour)
	if c.cert.NotAfter.Before(notAfter) {
		notAfter = c.cert.NotAfter
	}
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: notAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &key.PublicKey, c.key)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	l := &tls.Certificate{Certificate: [][]byte{der, c.cert.Raw}, PrivateKey: key, Leaf: leaf}
	c.leaves[name] = l
	return l, nil
}

// terminates reports whether the relay terminates TLS for name: a secret
// is bound to it, or the policy inspects it.
func (p *Policy) terminates(name string) bool {
	if p.CA == nil {
		return false
	}
	if p.Inspect.Match(name) {
		return true
	}
	for i := range p.Secrets {
		if p.Secrets[i].Hosts.Match(name) {
			return true
		}
	}
	return false
}

// prefixConn is a connection whose first bytes were already read.
type prefixConn struct {
	net.Conn
	r io.Reader
}

func (c *prefixConn) Read(b []byte) (int, error) { return c.r.Read(b) }

// broker terminates the client's TLS for sni (whose ClientHello is in
// hello), opens verified TLS to the destination and relays the requests
// (HTTP/1.1 here, HTTP/2 in h2.go) with placeholders swapped.
func (s *session) broker(hello []byte, sni string) {
	leaf, err := s.pol.CA.leaf(sni)
	if err != nil {
		s.refuse(sni, "terminated TLS: cannot issue a certificate: "+err.Error(), tlsAlert)
		return
	}
	client := tls.Server(&prefixConn{Conn: s.client, r: io.MultiReader(bytes.NewReader(hello), s.client)}, &tls.Config{
		Certificates: []tls.Certificate{*leaf},
		// Every request is judged on either: HTTP/1.1 one at a time,
		// HTTP/2 stream by stream (h2.go).
		NextProtos: []string{"h2", "http/1.1"},
		MinVersion: tls.VersionTLS12,
	})
	defer client.Close()
	client.SetDeadline(time.Now().Add(s.r.cfg.HelloTimeout))
	if err := client.Handshake(); err != nil {
		return // the client does not trust the sandbox CA, or hung up
	}
	client.SetDeadline(time.Time{})
	if client.ConnectionState().NegotiatedProtocol == "h2" {
		s.serveH2(client, sni)
		return
	}

	br := bufio.NewReader(client)
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	if !s.checkRequest(req, sni, s.answerH1(client)) {
		return
	}
	raw, err := s.dial()
	if err != nil {
		writeStatus(client, http.StatusBadGateway, "watcher: the destination refused the connection\n")
		return
	}
	up := tls.Client(raw, &tls.Config{ServerName: sni, RootCAs: s.r.cfg.UpstreamRoots, NextProtos: []string{"http/1.1"}})
	defer up.Close()
	up.SetDeadline(time.Now().Add(s.r.cfg.DialTimeout))
	if err := up.Handshake(); err != nil {
		s.refuse(sni, "terminated TLS: the destination's certificate does not verify: "+err.Error(), nil)
		writeStatus(client, http.StatusBadGateway, "watcher: the destination's certificate does not verify\n")
		return
	}
	up.SetDeadline(time.Time{})
	s.passed()
	s.requests(br, client, up, req, sni)
}

// substitute swaps the placeholders in req's headers and query for host:
// a placeholder bound to host becomes its value (recorded); one bound
// elsewhere is a leak attempt. Plain HTTP (tls false) never gets a value.
// It returns the leaked secret's name, or "".
func (s *session) substitute(req *http.Request, host string, tls bool) string {
	for i := range s.pol.Secrets {
		sec := &s.pol.Secrets[i]
		if sec.Placeholder == "" {
			continue
		}
		found := strings.Contains(req.URL.RawQuery, sec.Placeholder) || strings.Contains(req.URL.Path, sec.Placeholder)
		for _, vs := range req.Header {
			for _, v := range vs {
				found = found || strings.Contains(v, sec.Placeholder)
			}
		}
		if !found {
			continue
		}
		if !tls || !sec.Hosts.Match(host) {
			return sec.Name
		}
		for k, vs := range req.Header {
			for j, v := range vs {
				req.Header[k][j] = strings.ReplaceAll(v, sec.Placeholder, sec.Value)
			}
		}
		req.URL.RawQuery = strings.ReplaceAll(req.URL.RawQuery, sec.Placeholder, sec.Value)
		s.r.substituted(s.info, s.pol, sec.Name, host, req)
	}
	return ""
}

func (r *Relay) substituted(info Conn, pol *Policy, secret, host string, req *http.Request) {
	r.stats.substituted.Add(1)
	if r.cfg.Events == nil {
		return
	}
	call := req.Method + " " + req.URL.Path
	r.cfg.Events(audit.Event{
		Time: time.Now(), Kind: audit.KindNet, Verdict: audit.VerdictAllowed, Severity: audit.SeverityAlert,
		Rule: pol.Rule, RuleID: pol.RuleID, Mechanism: Mechanism,
		Sandbox: audit.Sandbox{Name: pol.Sandbox, ID: info.SandboxID},
		Process: audit.Process{TGID: info.PID, CgroupID: info.Cgroup},
		Net: &audit.NetDetail{Op: "secret", Protocol: 6, Addr: info.Dest.Addr().Unmap().String(), Port: info.Dest.Port(),
			Name: quote(host)[1 : len(quote(host))-1], Reason: fmt.Sprintf("secret %s substituted for %s in %s", quote(secret), quote(host), quote(call))},
		Message: fmt.Sprintf("credential broker: secret %s sent to %s (%s)", quote(secret), quote(host), quote(call)),
	})
}

func writeStatus(w io.Writer, code int, body string) {
	fmt.Fprintf(w, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		code, http.StatusText(code), len(body), body)
}
