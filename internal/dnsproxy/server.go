package dnsproxy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

// EventSink receives one audit event per decision (the agent's pipeline).
// Notify must not block for long: it runs on the query path.
type EventSink interface {
	Notify(audit.Event) error
}

// Answer is what the OnAnswer hook learns about an allowed answer.
type Answer struct {
	// Sandbox is the sandbox that asked.
	Sandbox string
	// Name is the query name, lower case, with the trailing dot.
	Name string
	// Addrs are the A and AAAA addresses in the answer (CNAME chains
	// followed by the upstream are included).
	Addrs []netip.Addr
	// TTL is the smallest remaining TTL of those addresses, in seconds.
	TTL uint32
}

// Listener is one address the proxy serves on.
type Listener struct {
	// Addr is host:port; port 0 picks a free port (see Server.Addrs).
	Addr string
	// Network is "udp", "tcp", or "" for both on the same port.
	Network string
	// Sandbox, when set, is the sandbox of every query received here (the
	// listener-per-sandbox mode, used by ListenerSandboxes).
	Sandbox string
}

// Config configures a Server.
type Config struct {
	// Listeners are the addresses to serve on.
	Listeners []Listener
	// Upstreams are the resolvers (host:port) allowed queries go to, tried
	// in order.
	Upstreams []string
	// Policy is the initial policy; required.
	Policy *Policy
	// Sandboxes maps a query's source to its sandbox. Nil means
	// ListenerSandboxes.
	Sandboxes SandboxResolver
	// Events receives an audit event for every decision. Nil: none.
	Events EventSink
	// OnAnswer, when set, is called after every allowed answer that carries
	// addresses (from upstream or cache), before the answer is sent, so the
	// egress allowlist can admit the addresses before the client connects.
	// It runs on the query path and must be fast.
	OnAnswer func(Answer)
	// OwnProbe, when set, reports whether a query (its source and its
	// name, lower case without the trailing dot) is the agent's own
	// canary probe. A probe is judged by the policy like any query but
	// takes no rate-limit token and feeds no detection state (information
	// budget, stream counters), so the canary never changes what it
	// measures and a sandbox's spent budget never stands in for the
	// policy's verdict. It runs on every query and must be fast.
	OwnProbe func(src QuerySource, name string) bool
	// UpstreamTimeout bounds one exchange with one upstream. Default 2s.
	UpstreamTimeout time.Duration
	// CacheEntries bounds the answer cache. Default 10000.
	CacheEntries int
	// MaxTCPConns bounds concurrent TCP clients. Default 256.
	MaxTCPConns int
	// MaxInflight bounds UDP queries waiting for an upstream; beyond it
	// queries get SERVFAIL. Default 1024.
	MaxInflight int
	// HostAddrs lists the host's own addresses, refused in answers like
	// loopback (see SandboxPolicy.LocalAllow); nil means every interface's
	// addresses, re-read every few seconds.
	HostAddrs func() ([]netip.Addr, error)
	// Now returns the current time; nil means time.Now (tests set it).
	Now func() time.Time
}

// Stats are the proxy's counters since start.
type Stats struct {
	Queries        uint64
	Allowed        uint64
	Blocked        uint64 // NXDOMAIN by policy or detection
	Refused        uint64 // REFUSED, including rate limited and unknown clients
	RateLimited    uint64
	FormErr        uint64
	NotImp         uint64
	ServFail       uint64
	Dropped        uint64 // too short to answer, or a response
	CacheHits      uint64
	CacheMisses    uint64
	UpstreamErrors uint64
	Recorded       uint64 // would have been blocked, detection in record mode
	DomainsCut     uint64 // stream limits reached
	DGALike        uint64 // names with a random-looking registrable label
	EventErrors    uint64
	// Reasons counts blocked and refused queries by reason (stream reasons
	// without their domain).
	Reasons map[string]uint64
}

type counters struct {
	queries, allowed, blocked, refused, rateLimited, formErr, notImp, servFail, dropped,
	cacheHits, cacheMisses, upstreamErrors, recorded, domainsCut, dgaLike, eventErrors atomic.Uint64
	reasons map[string]*atomic.Uint64
}

var allReasons = []string{
	ReasonNotAllowed, ReasonDenied, ReasonEncoded, ReasonOversized, ReasonBadTLD, ReasonInvalidBytes,
	ReasonRateLimited, ReasonRareType, ReasonNoSandbox, ReasonMalformed, ReasonQType, ReasonClass, ReasonOpcode,
	ReasonEDNSVersion, ReasonUpstream, ReasonLocalAnswer, ReasonInfoBudget, ReasonEncodedStream,
	ReasonNXStream, ReasonTunnelTypes, ReasonAllCut,
}

// Server is the DNS allowlist proxy.
type Server struct {
	cfg       Config
	sandboxes SandboxResolver
	policy    atomic.Pointer[compiledPolicy]
	fwd       *forwarder
	cache     *answerCache
	names     *nameMemo
	host      hostAddrs
	now       func() time.Time
	stats     counters
	inflight  chan struct{}
	tcpSlots  chan struct{}

	stateMu sync.RWMutex
	state   map[string]*sandboxState

	mu        sync.Mutex
	udpConns  []*net.UDPConn
	tcpLns    []net.Listener
	tcpConns  map[net.Conn]struct{}
	closed    bool
	wg        sync.WaitGroup
	closeOnce sync.Once
}

// New validates cfg and returns a server that is not yet listening.
func New(cfg Config) (*Server, error) {
	if cfg.Policy == nil {
		return nil, errors.New("dnsproxy: no policy")
	}
	if err := cfg.Policy.validate(); err != nil {
		return nil, fmt.Errorf("dnsproxy: policy: %w", err)
	}
	for _, up := range cfg.Upstreams {
		if _, _, err := net.SplitHostPort(up); err != nil {
			return nil, fmt.Errorf("dnsproxy: upstream %q: %w", up, err)
		}
	}
	if cfg.UpstreamTimeout <= 0 {
		cfg.UpstreamTimeout = 2 * time.Second
	}
	if cfg.CacheEntries <= 0 {
		cfg.CacheEntries = 10000
	}
	if cfg.MaxTCPConns <= 0 {
		cfg.MaxTCPConns = 256
	}
	if cfg.MaxInflight <= 0 {
		cfg.MaxInflight = 1024
	}
	s := &Server{
		cfg:       cfg,
		sandboxes: cfg.Sandboxes,
		fwd:       newForwarder(cfg.Upstreams, cfg.UpstreamTimeout),
		cache:     newAnswerCache(cfg.CacheEntries),
		names:     newNameMemo(),
		now:       cfg.Now,
		inflight:  make(chan struct{}, cfg.MaxInflight),
		tcpSlots:  make(chan struct{}, cfg.MaxTCPConns),
		state:     map[string]*sandboxState{},
		tcpConns:  map[net.Conn]struct{}{},
	}
	if s.sandboxes == nil {
		s.sandboxes = ListenerSandboxes{}
	}
	s.host.list = cfg.HostAddrs
	if s.host.list == nil {
		s.host.list = interfaceAddrs
	}
	if s.now == nil {
		s.now = time.Now
	}
	s.stats.reasons = map[string]*atomic.Uint64{}
	for _, r := range allReasons {
		s.stats.reasons[r] = new(atomic.Uint64)
	}
	s.policy.Store(compilePolicy(cfg.Policy))
	return s, nil
}

// SetPolicy replaces the policy. An invalid policy is rejected and the
// current one stays in force. Detection state and rate-limit buckets of
// sandboxes that remain are kept.
func (s *Server) SetPolicy(p *Policy) error {
	if p == nil {
		return errors.New("dnsproxy: nil policy")
	}
	if err := p.validate(); err != nil {
		return fmt.Errorf("dnsproxy: policy: %w", err)
	}
	s.policy.Store(compilePolicy(p))
	return nil
}

// Stats returns a snapshot of the counters.
func (s *Server) Stats() Stats {
	c := &s.stats
	st := Stats{
		Queries: c.queries.Load(), Allowed: c.allowed.Load(), Blocked: c.blocked.Load(),
		Refused: c.refused.Load(), RateLimited: c.rateLimited.Load(), FormErr: c.formErr.Load(),
		NotImp: c.notImp.Load(), ServFail: c.servFail.Load(), Dropped: c.dropped.Load(),
		CacheHits: c.cacheHits.Load(), CacheMisses: c.cacheMisses.Load(),
		UpstreamErrors: c.upstreamErrors.Load(), Recorded: c.recorded.Load(),
		DomainsCut: c.domainsCut.Load(), DGALike: c.dgaLike.Load(), EventErrors: c.eventErrors.Load(),
		Reasons: map[string]uint64{},
	}
	for r, v := range c.reasons {
		if n := v.Load(); n > 0 {
			st.Reasons[r] = n
		}
	}
	return st
}

func (s *Server) sandboxState(name string) *sandboxState {
	s.stateMu.RLock()
	st := s.state[name]
	s.stateMu.RUnlock()
	if st != nil {
		return st
	}
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	if st = s.state[name]; st == nil {
		st = newSandboxState()
		s.state[name] = st
	}
	return st
}

// Start binds every listener and serves in the background until Close.
func (s *Server) Start() error {
	for _, l := range s.cfg.Listeners {
		if err := s.listen(l); err != nil {
			s.Close()
			return err
		}
	}
	return nil
}

func (s *Server) listen(l Listener) error {
	udp := l.Network == "" || l.Network == "udp"
	tcp := l.Network == "" || l.Network == "tcp"
	if !udp && !tcp {
		return fmt.Errorf("dnsproxy: listener %s: network must be udp, tcp or empty", l.Addr)
	}
	conn, ln, err := bindListener(l.Addr, udp, tcp)
	if err != nil {
		return err
	}
	if conn != nil {
		s.mu.Lock()
		s.udpConns = append(s.udpConns, conn)
		s.mu.Unlock()
		readers := runtime.GOMAXPROCS(0)
		for range readers {
			s.wg.Add(1)
			go s.serveUDP(conn, l.Sandbox)
		}
	}
	if ln != nil {
		s.mu.Lock()
		s.tcpLns = append(s.tcpLns, ln)
		s.mu.Unlock()
		s.wg.Add(1)
		go s.serveTCP(ln, l.Sandbox)
	}
	return nil
}

// Addrs returns the bound addresses, "udp:..." and "tcp:...".
func (s *Server) Addrs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, c := range s.udpConns {
		out = append(out, "udp:"+c.LocalAddr().String())
	}
	for _, l := range s.tcpLns {
		out = append(out, "tcp:"+l.Addr().String())
	}
	return out
}

// Close stops all listeners and waits for the serving goroutines.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		for _, c := range s.udpConns {
			c.Close()
		}
		for _, l := range s.tcpLns {
			l.Close()
		}
		for c := range s.tcpConns {
			c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return nil
}

// batchConn reads and writes many datagrams per system call
// (recvmmsg/sendmmsg on Linux).
type batchConn interface {
	ReadBatch(ms []ipv4.Message, flags int) (int, error)
	WriteBatch(ms []ipv4.Message, flags int) (int, error)
}

// udpBatch is how many datagrams one read or write system call moves.
const udpBatch = 32

func (s *Server) serveUDP(conn *net.UDPConn, sandbox string) {
	defer s.wg.Done()
	local := addrPortOf(conn.LocalAddr())
	var bc batchConn
	if local.Addr().Is4() {
		bc = ipv4.NewPacketConn(conn)
	} else {
		bc = ipv6.NewPacketConn(conn)
	}
	in := make([]ipv4.Message, udpBatch)
	outBufs := make([][]byte, udpBatch)
	for i := range in {
		// Queries over 4096 bytes are refused anyway; a longer datagram is
		// cut and then fails to parse.
		in[i].Buffers = [][]byte{make([]byte, 4096)}
		outBufs[i] = make([]byte, 0, 1500)
	}
	out := make([]ipv4.Message, 0, udpBatch)
	for {
		n, err := bc.ReadBatch(in, 0)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		out = out[:0]
		for i := range n {
			m := &in[i]
			ua, ok := m.Addr.(*net.UDPAddr)
			if !ok {
				continue
			}
			remote := ua.AddrPort()
			src := QuerySource{Proto: "udp", Local: local, Remote: remote, ListenerSandbox: sandbox}
			r := &request{raw: m.Buffers[0][:m.N], src: src, out: outBufs[i][:0]}
			resp, pending := s.process(r, func(resp []byte) {
				// Answers that waited on an upstream go out on their own.
				if resp != nil {
					conn.WriteToUDPAddrPort(resp, remote)
				}
			})
			if !pending && resp != nil {
				out = append(out, ipv4.Message{Buffers: [][]byte{resp}, Addr: m.Addr})
			}
		}
		for len(out) > 0 {
			k, err := bc.WriteBatch(out, 0)
			if err != nil || k == 0 {
				break // the client is gone or the socket full: DNS retries
			}
			out = out[k:]
		}
	}
}

func addrPortOf(a net.Addr) netip.AddrPort {
	switch v := a.(type) {
	case *net.UDPAddr:
		return v.AddrPort()
	case *net.TCPAddr:
		return v.AddrPort()
	}
	ap, _ := netip.ParseAddrPort(a.String())
	return ap
}

const tcpIdleTimeout = 10 * time.Second

func (s *Server) serveTCP(ln net.Listener, sandbox string) {
	defer s.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		select {
		case s.tcpSlots <- struct{}{}:
		default:
			c.Close() // over the connection bound: shed
			continue
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			<-s.tcpSlots
			return
		}
		s.tcpConns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() {
				s.mu.Lock()
				delete(s.tcpConns, c)
				s.mu.Unlock()
				c.Close()
				<-s.tcpSlots
			}()
			s.serveTCPConn(c, sandbox)
		}()
	}
}

func (s *Server) serveTCPConn(c net.Conn, sandbox string) {
	src := QuerySource{Proto: "tcp", Local: addrPortOf(c.LocalAddr()), Remote: addrPortOf(c.RemoteAddr()), ListenerSandbox: sandbox}
	buf := make([]byte, 65535)
	var out []byte
	for {
		c.SetDeadline(time.Now().Add(tcpIdleTimeout))
		var l [2]byte
		if _, err := io.ReadFull(c, l[:]); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint16(l[:]))
		if _, err := io.ReadFull(c, buf[:n]); err != nil {
			return
		}
		r := &request{raw: buf[:n], src: src, out: out[:0]}
		resp, _ := s.process(r, nil)
		if resp == nil {
			if n < 12 {
				return // cannot answer: close, as the client cannot be in sync
			}
			continue
		}
		frame := make([]byte, 2, 2+len(resp))
		binary.BigEndian.PutUint16(frame, uint16(len(resp)))
		if _, err := c.Write(append(frame, resp...)); err != nil {
			return
		}
		out = resp[:0]
	}
}

// HandlePacket runs one raw query through the handler chain synchronously
// and returns the raw response, or nil when the packet gets no answer (too
// short to carry an ID, or itself a response). Exposed for tests, fuzzing
// and the debug command; the listeners use the same chain.
func (s *Server) HandlePacket(ctx context.Context, raw []byte, src QuerySource) []byte {
	r := &request{raw: raw, src: src, ctx: ctx}
	resp, _ := s.process(r, nil)
	return resp
}

// bindListener binds UDP and/or TCP on addr. When UDP picks the port
// (port 0), TCP is bound to the same port; if another process holds that
// TCP port, both are tried again on a new port instead of failing.
func bindListener(addr string, udp, tcp bool) (*net.UDPConn, net.Listener, error) {
	_, port, _ := net.SplitHostPort(addr)
	tries := 1
	if udp && tcp && port == "0" {
		tries = 10
	}
	for try := 1; ; try++ {
		var conn *net.UDPConn
		tcpAddr := addr
		if udp {
			pc, err := net.ListenPacket("udp", addr)
			if err != nil {
				return nil, nil, fmt.Errorf("dnsproxy: listen udp %s: %w", addr, err)
			}
			conn = pc.(*net.UDPConn)
			tcpAddr = conn.LocalAddr().String()
		}
		if !tcp {
			return conn, nil, nil
		}
		ln, err := net.Listen("tcp", tcpAddr)
		if err == nil {
			return conn, ln, nil
		}
		if conn != nil {
			conn.Close()
		}
		if try >= tries || !errors.Is(err, syscall.EADDRINUSE) {
			return nil, nil, fmt.Errorf("dnsproxy: listen tcp %s: %w", tcpAddr, err)
		}
	}
}
