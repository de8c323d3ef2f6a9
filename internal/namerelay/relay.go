// Package namerelay binds a sandbox's TCP connections to the names the
// policy allowed. The kernel (bpf/include/relay.h) redirects a sandbox's
// connect to an address the DNS proxy answered to this relay on loopback;
// the relay reads the name the connection carries (the TLS ClientHello's
// SNI, or the Host header of a plain HTTP request), checks it was answered
// with that address to that sandbox (or that the sandbox's name policy
// allows it), and only then dials the original destination and splices
// the two sockets. A mismatch (domain fronting) is closed before any
// application data leaves the host, and recorded with both names.
//
// On plain HTTP every request is judged (its Host, and its method where
// the name is read-only). For names a brokered secret is bound to, the
// relay terminates TLS with the sandbox's CA and swaps placeholders for
// the real values (broker.go).
package namerelay

import (
	"bufio"
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/textesc"
)

// Mechanism names the relay in events.
const Mechanism = "name-relay"

// Conn is what the kernel recorded of a redirected connection.
type Conn struct {
	SandboxID uint32
	// Dest is where the client connected, before the redirect.
	Dest netip.AddrPort
	PID  uint32
	// Cgroup is the connecting process's cgroup (0: unknown).
	Cgroup uint64
}

// Config configures a Relay.
type Config struct {
	// Listen are the relay's addresses ("127.0.0.1:0", "[::1]:0").
	Listen []string
	// Lookup tells where an accepted connection from src was going
	// (egress.LookupRelayed).
	Lookup func(src netip.AddrPort) (Conn, bool)
	// Policy returns the name binding of a sandbox.
	Policy func(sandboxID uint32) (*Policy, bool)
	// Answers are the names the DNS proxy answered.
	Answers *Answers
	// Events receives refusals (and, in record-only mode, what would have
	// been refused). Optional.
	Events func(audit.Event)
	// HelloTimeout bounds the wait for the first bytes. Default 10s.
	HelloTimeout time.Duration
	// DialTimeout bounds the connect to the original destination.
	// Default 10s.
	DialTimeout time.Duration
	// MaxConnsPerSandbox bounds a sandbox's connections in the relay at
	// once (each holds two of the agent's descriptors); beyond it new
	// ones are closed and counted. Default 1024.
	MaxConnsPerSandbox int
	// UpstreamRoots verify destinations where the relay terminates TLS
	// (credential brokering); nil means the host's roots.
	UpstreamRoots *x509.CertPool
}

// Stats are the relay's counters.
type Stats struct {
	Accepted, Passed, Refused, Recorded, Unknown, DialFailed uint64
	// Substituted counts requests whose placeholders were swapped.
	Substituted uint64
	// OverLimit counts connections closed because their sandbox had
	// MaxConnsPerSandbox open.
	OverLimit uint64
}

// Relay is the transparent relay.
type Relay struct {
	cfg   Config
	lns   []net.Listener
	wg    sync.WaitGroup
	stats struct {
		accepted, passed, refused, recorded, unknown, dialFailed, substituted, overLimit atomic.Uint64
	}
	ns     netnsServing // listeners in other network namespaces (netns.go)
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	open   map[uint32]int // connections per sandbox
	closed bool
}

// New returns a relay that is not yet listening.
func New(cfg Config) (*Relay, error) {
	if cfg.Lookup == nil || cfg.Policy == nil || cfg.Answers == nil {
		return nil, errors.New("namerelay: Lookup, Policy and Answers are required")
	}
	if len(cfg.Listen) == 0 {
		return nil, errors.New("namerelay: no listen address")
	}
	if cfg.HelloTimeout <= 0 {
		cfg.HelloTimeout = 10 * time.Second
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 10 * time.Second
	}
	if cfg.MaxConnsPerSandbox <= 0 {
		cfg.MaxConnsPerSandbox = 1024
	}
	return &Relay{cfg: cfg, conns: map[net.Conn]struct{}{}, open: map[uint32]int{}}, nil
}

// Start listens on every configured address; one that cannot be bound
// (no IPv6 loopback) is skipped unless none can.
func (r *Relay) Start() error {
	var errs []error
	for _, a := range r.cfg.Listen {
		ln, err := net.Listen("tcp", a)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		r.lns = append(r.lns, ln)
	}
	if len(r.lns) == 0 {
		return fmt.Errorf("namerelay: listen: %w", errors.Join(errs...))
	}
	for _, ln := range r.lns {
		r.wg.Add(1)
		go r.serve(ln, nil)
	}
	return nil
}

// Addrs are the addresses the relay listens on.
func (r *Relay) Addrs() []netip.AddrPort {
	var out []netip.AddrPort
	for _, ln := range r.lns {
		out = append(out, ln.Addr().(*net.TCPAddr).AddrPort())
	}
	return out
}

// Close stops listening and closes every relayed connection.
func (r *Relay) Close() error {
	r.mu.Lock()
	r.closed = true
	for c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
	for _, ln := range r.lns {
		ln.Close()
	}
	r.closeAllNetns()
	r.wg.Wait()
	return nil
}

// Stats returns the counters.
func (r *Relay) Stats() Stats {
	s := &r.stats
	return Stats{Accepted: s.accepted.Load(), Passed: s.passed.Load(), Refused: s.refused.Load(),
		Recorded: s.recorded.Load(), Unknown: s.unknown.Load(), DialFailed: s.dialFailed.Load(), Substituted: s.substituted.Load(), OverLimit: s.overLimit.Load()}
}

func (r *Relay) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	r.conns[c] = struct{}{}
	return true
}

// admit counts a connection of sandbox id, unless it has the maximum open.
func (r *Relay) admit(id uint32) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.open[id] >= r.cfg.MaxConnsPerSandbox {
		return false
	}
	r.open[id]++
	return true
}

func (r *Relay) release(id uint32) {
	r.mu.Lock()
	if r.open[id]--; r.open[id] <= 0 {
		delete(r.open, id)
	}
	r.mu.Unlock()
}

func (r *Relay) untrack(c net.Conn) {
	r.mu.Lock()
	delete(r.conns, c)
	r.mu.Unlock()
}

// serve accepts on ln; ns is the network namespace of a listener opened
// in another one (nil for the relay's own), whose connections are looked
// up and dialled there.
func (r *Relay) serve(ln net.Listener, ns *netnsOf) {
	defer r.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return
		}
		r.stats.accepted.Add(1)
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			if !r.track(c) {
				c.Close()
				return
			}
			defer r.untrack(c)
			if ns != nil {
				r.noteNetns(c, ns)
				defer r.forgetNetns(c)
			}
			defer c.Close()
			r.handle(c)
		}()
	}
}

// session is one relayed connection being judged.
type session struct {
	r      *Relay
	client net.Conn
	info   Conn
	pol    *Policy
	// name is the name the connection carried (the SNI, the first
	// request's Host), once read.
	name string
}

func (r *Relay) handle(c net.Conn) {
	src := c.RemoteAddr().(*net.TCPAddr).AddrPort()
	info, ok := r.lookup(c, src)
	if !ok {
		// Not redirected by the kernel: a process that dialled the relay
		// itself. Nothing to relay to.
		r.stats.unknown.Add(1)
		return
	}
	if !r.admit(info.SandboxID) {
		if n := r.stats.overLimit.Add(1); n&(n-1) == 0 {
			// The 1st, 2nd, 4th, 8th... closed connection: a flood is
			// recorded without flooding the record.
			pol, _ := r.cfg.Policy(info.SandboxID)
			if pol == nil {
				pol = &Policy{}
			}
			r.event(info, pol, audit.VerdictDenied, "", fmt.Sprintf("the sandbox has %d connections open in the relay (%d closed so far)",
				r.cfg.MaxConnsPerSandbox, n))
		}
		return
	}
	defer r.release(info.SandboxID)
	pol, ok := r.cfg.Policy(info.SandboxID)
	if !ok {
		r.stats.refused.Add(1)
		r.event(info, &Policy{}, audit.VerdictDenied, "", "no name-binding policy for the sandbox")
		return
	}
	s := &session{r: r, client: c, info: info, pol: pol}
	if pol.unnamed(info.Dest.Port()) {
		s.pass(nil)
		return
	}
	c.SetReadDeadline(time.Now().Add(r.cfg.HelloTimeout))
	// One read takes what the client sent first (a whole ClientHello or
	// request head, usually).
	first := make([]byte, 16<<10)
	n, err := c.Read(first)
	if n == 0 {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() &&
			s.refuse("", "no bytes from the client before the timeout (a protocol where the server speaks first carries no name)", nil) {
			s.pass(nil) // record-only
		}
		// A client that hung up before a byte (the loser of a happy
		// eyeballs race, a port check) sent nothing anywhere: no event.
		return
	}
	first = first[:n]
	switch {
	case first[0] == recordHandshake:
		s.tls(first)
	case first[0] >= 'A' && first[0] <= 'Z':
		s.http(first)
	default:
		if s.refuse("", "neither TLS nor HTTP: the connection carries no name", nil) {
			s.pass(first) // record-only
		}
	}
}

// tls reads the ClientHello, judges its SNI and relays the connection.
func (s *session) tls(buf []byte) {
	tmp := make([]byte, 16<<10)
	var h Hello
	for {
		var err error
		h, err = parseHello(buf)
		if err == nil {
			break
		}
		if !errors.Is(err, errNeedMore) {
			if s.refuse("", "malformed TLS ClientHello: "+err.Error(), tlsAlert) {
				s.pass(buf) // record-only
			}
			return
		}
		if len(buf) > maxHello+1024 {
			if s.refuse("", "TLS ClientHello larger than 64 KiB", tlsAlert) {
				s.pass(buf)
			}
			return
		}
		n, rerr := s.client.Read(tmp)
		buf = append(buf, tmp[:n]...)
		if rerr != nil && n == 0 {
			s.refuse("", "TLS ClientHello incomplete: "+rerr.Error(), nil)
			return
		}
	}
	s.name = h.SNI
	if h.SNI == "" {
		if s.refuse("", "TLS without a server name (SNI): the connection carries no name", tlsAlert) {
			s.pass(buf) // record-only
		}
		return
	}
	if h.ECH && !s.pol.ECH.Match(h.SNI) {
		if !s.refuse(h.SNI, "Encrypted Client Hello hides the real name; the outer name is not among egress.names.ech", tlsAlert) {
			return
		}
	} else if !s.judge(h.SNI, tlsAlert) {
		return
	}
	if s.pol.terminates(h.SNI) {
		s.broker(buf, h.SNI)
		return
	}
	s.pass(buf)
}

// tlsAlert is a fatal access_denied alert: the client reports a refusal
// instead of a reset.
var tlsAlert = []byte{0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 49}

// judge checks name against the answers and the policy; it reports
// whether the connection goes on (allowed, or refused in record-only
// mode).
func (s *session) judge(name string, refusal []byte) bool {
	if isAddress(name) {
		return s.refuse(name, "the connection names an address, not a name", refusal)
	}
	dest := s.info.Dest.Addr()
	if s.r.cfg.Answers.Answered(s.info.SandboxID, dest, name) {
		return true
	}
	if s.pol.NameAllowed != nil && s.pol.NameAllowed(name) {
		return true
	}
	answered := s.r.cfg.Answers.Names(s.info.SandboxID, dest)
	why := fmt.Sprintf("name %s was not answered with %s to this sandbox", quote(name), dest)
	if len(answered) > 0 {
		q := make([]string, len(answered))
		for i, a := range answered {
			q[i] = quote(a)
		}
		why += " (answered: " + strings.Join(q, ", ") + "): domain fronting"
	}
	return s.refuse(name, why, refusal)
}

// refuse records a refusal. In record-only mode it returns true (go on);
// otherwise it writes refusal (if any) to the client and returns false.
func (s *session) refuse(name, why string, refusal []byte) bool {
	verdict := audit.VerdictDenied
	if s.pol.RecordOnly {
		verdict = audit.VerdictRecorded
		s.r.stats.recorded.Add(1)
	} else {
		s.r.stats.refused.Add(1)
	}
	s.r.event(s.info, s.pol, verdict, name, why)
	if verdict == audit.VerdictRecorded {
		return true
	}
	if refusal != nil {
		s.client.SetWriteDeadline(time.Now().Add(time.Second))
		// Before any TLS of the relay's own: a terminated connection's
		// refusals are written by its handler.
		s.client.Write(refusal)
	}
	return false
}

// passed counts a connection that goes on to its destination and, where
// the policy records every connection, records it with its name.
func (s *session) passed() {
	s.r.stats.passed.Add(1)
	if !s.pol.RecordAllowed || s.r.cfg.Events == nil {
		return
	}
	info := s.info
	family := uint16(2)
	if info.Dest.Addr().Is6() && !info.Dest.Addr().Is4In6() {
		family = 10
	}
	s.r.cfg.Events(audit.Event{
		Time: time.Now(), Kind: audit.KindNet, Verdict: audit.VerdictAllowed, Severity: audit.SeverityRoutine,
		Rule: s.pol.Rule, RuleID: s.pol.RuleID, Mechanism: Mechanism,
		Sandbox: audit.Sandbox{Name: s.pol.Sandbox, ID: info.SandboxID},
		Process: audit.Process{TGID: info.PID, CgroupID: info.Cgroup},
		Net: &audit.NetDetail{Op: "connect", Family: family, Protocol: 6, Addr: info.Dest.Addr().Unmap().String(),
			Port: info.Dest.Port(), Name: textesc.String(s.name), Reason: "name bound"},
	})
}

// dial connects to the original destination.
func (s *session) dial() (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), s.r.cfg.DialTimeout)
	defer cancel()
	var up net.Conn
	var err error
	if ns := s.r.netnsOfConn(s.client); ns != nil {
		// The route to the destination exists in the client's namespace.
		up, err = ns.dial(ctx, "tcp", s.info.Dest.String())
	} else {
		var d net.Dialer
		up, err = d.DialContext(ctx, "tcp", s.info.Dest.String())
	}
	if err != nil {
		s.r.stats.dialFailed.Add(1)
		return nil, err
	}
	return up, nil
}

// pass dials the destination, sends what was read and splices the rest.
func (s *session) pass(head []byte) {
	up, err := s.dial()
	if err != nil {
		return
	}
	defer up.Close()
	s.client.SetReadDeadline(time.Time{})
	if len(head) > 0 {
		if _, err := up.Write(head); err != nil {
			return
		}
	}
	s.passed()
	splice(s.client, up, s.client)
}

// splice copies both ways until both ends are done; between two TCP
// sockets io.Copy moves the bytes with splice(2), without a copy through
// the relay. from is what the client side is read from (the socket, or a
// reader holding bytes already read in front of it).
func splice(client, up net.Conn, from io.Reader) {
	done := make(chan struct{})
	go func() {
		io.Copy(client, up)
		closeWrite(client)
		close(done)
	}()
	io.Copy(up, from)
	closeWrite(up)
	<-done
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
		return
	}
	c.Close()
}

// readMethods are the methods of a read-only name.
var readMethods = map[string]bool{http.MethodGet: true, http.MethodHead: true, http.MethodOptions: true}

// http judges every request of a plain HTTP connection: its Host, and its
// method where the name is read-only.
func (s *session) http(first []byte) {
	br := bufio.NewReader(io.MultiReader(bytes.NewReader(first), s.client))
	req, err := http.ReadRequest(br)
	if err != nil {
		s.refuse("", "not an HTTP request: the connection carries no name", nil)
		return
	}
	s.name = normName(req.Host)
	if h, _, err := net.SplitHostPort(req.Host); err == nil {
		s.name = normName(h)
	}
	if !s.checkRequest(req, "", s.answerH1(s.client)) {
		return
	}
	up, err := s.dial()
	if err != nil {
		writeStatus(s.client, http.StatusBadGateway, "watcher: the destination refused the connection\n")
		return
	}
	defer up.Close()
	s.client.SetReadDeadline(time.Time{})
	s.passed()
	s.requests(br, s.client, up, req, "")
}

// requests relays the requests read from br (the first already read and
// judged) to up, judging each, while the responses flow back to client.
// tlsHost is the terminated TLS name ("" on plain HTTP).
func (s *session) requests(br *bufio.Reader, client, up net.Conn, req *http.Request, tlsHost string) {
	done := make(chan struct{})
	go func() {
		io.Copy(client, up)
		closeWrite(client)
		close(done)
	}()
	defer func() { <-done }()
	for {
		if _, ok := req.Header["User-Agent"]; !ok {
			req.Header["User-Agent"] = []string{""} // Write adds Go's otherwise
		}
		if err := req.Write(up); err != nil {
			closeWrite(up)
			return
		}
		if req.Method == http.MethodConnect || req.Header.Get("Upgrade") != "" {
			// The bytes after an upgrade are not HTTP requests.
			io.Copy(up, br)
			closeWrite(up)
			return
		}
		var err error
		if req, err = http.ReadRequest(br); err != nil {
			closeWrite(up)
			return
		}
		if !s.checkRequest(req, tlsHost, nil) {
			// Responses to earlier requests may be in flight: the
			// connection is cut, not answered.
			up.Close()
			client.Close()
			return
		}
	}
}

// answerFunc answers a refused request with a status and a body saying
// why; nil where bytes of the connection already went upstream (the
// connection is cut instead).
type answerFunc func(code int, body string)

// answerH1 answers on an HTTP/1.1 connection (plain, or the terminated
// TLS connection w) and closes it.
func (s *session) answerH1(w io.Writer) answerFunc {
	return func(code int, body string) {
		s.client.SetWriteDeadline(time.Now().Add(time.Second))
		writeStatus(w, code, body)
	}
}

// checkRequest judges one request and swaps its placeholders; a refusal
// is recorded and, where answer is not nil, answered with a status whose
// body says why. tlsHost is the terminated TLS name, "" on plain HTTP.
func (s *session) checkRequest(req *http.Request, tlsHost string, answer answerFunc) bool {
	refused := func(name, why string, code int, body string) bool {
		if s.refuse(name, why, nil) {
			return true // record-only
		}
		if answer != nil {
			answer(code, body)
		}
		return false
	}
	host := req.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	if host == "" {
		return refused("", "HTTP request without a Host: the connection carries no name", http.StatusForbidden,
			"watcher: the request carries no name this sandbox may reach\n")
	}
	name := normName(host)
	if tlsHost != "" && name != normName(tlsHost) {
		// The name the TLS session was judged (and its certificate
		// issued) for is the only one it may carry.
		if req.ProtoMajor == 2 {
			// Connection coalescing: 421 tells an HTTP/2 client to open
			// a connection of its own for that name.
			if !refused(name, fmt.Sprintf("HTTP/2 request for %s on the connection for TLS server name %s (connection coalescing)", quote(name), quote(tlsHost)),
				http.StatusMisdirectedRequest, fmt.Sprintf("watcher: this connection was opened for %s; %s needs a connection of its own\n", quote(tlsHost), quote(name))) {
				return false
			}
		} else if !refused(name, fmt.Sprintf("Host %s differs from the TLS server name %s", quote(name), quote(tlsHost)),
			http.StatusForbidden, fmt.Sprintf("watcher: Host %s differs from the TLS server name %s\n", quote(name), quote(tlsHost))) {
			return false
		}
	} else if !s.judge(host, nil) {
		if answer != nil {
			answer(http.StatusForbidden, fmt.Sprintf("watcher: %s is not a name answered for %s to this sandbox\n", quote(name), s.info.Dest.Addr()))
		}
		return false
	}
	if s.pol.ReadOnly.Match(host) && !readMethods[req.Method] {
		if !refused(name, "read-only name: method "+quote(req.Method)+" refused", http.StatusForbidden,
			fmt.Sprintf("watcher: %s is read-only for this sandbox: %s refused (GET, HEAD, OPTIONS only)\n", quote(name), quote(req.Method))) {
			return false
		}
	}
	if leak := s.substitute(req, name, tlsHost != ""); leak != "" {
		why := fmt.Sprintf("leak attempt: the placeholder of secret %s sent to %s, where it is not bound", quote(leak), quote(name))
		if tlsHost == "" {
			why += " (or over plain HTTP)"
		}
		if !refused(name, why, http.StatusForbidden, fmt.Sprintf("watcher: the placeholder of secret %s may not be sent to %s\n", quote(leak), quote(name))) {
			return false
		}
	}
	return true
}

// quote escapes a name the sandbox chose before a human reads it.
func quote(s string) string { return `"` + textesc.String(s) + `"` }

func (r *Relay) event(info Conn, pol *Policy, verdict audit.Verdict, name, why string) {
	if r.cfg.Events == nil {
		return
	}
	family := uint16(2)
	if info.Dest.Addr().Is6() && !info.Dest.Addr().Is4In6() {
		family = 10
	}
	r.cfg.Events(audit.Event{
		Time: time.Now(), Kind: audit.KindNet, Verdict: verdict, Severity: audit.SeverityAlert,
		Rule: pol.Rule, RuleID: pol.RuleID, Mechanism: Mechanism,
		Sandbox: audit.Sandbox{Name: pol.Sandbox, ID: info.SandboxID},
		Process: audit.Process{TGID: info.PID, CgroupID: info.Cgroup},
		Net: &audit.NetDetail{Op: "connect", Family: family, Protocol: 6, Addr: info.Dest.Addr().Unmap().String(),
			Port: info.Dest.Port(), Reason: why, Name: textesc.String(name)},
		Message: fmt.Sprintf("connection to %s %s by name binding: %s", info.Dest, map[bool]string{true: "refused", false: "recorded"}[verdict == audit.VerdictDenied], why),
	})
}
