package dnsproxy

import (
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/testkit/collect"
)

// upstream is a real miekg/dns server on loopback answering every A query
// with 192.0.2.x, AAAA with 2001:db8::1, TXT with a big record set (to force
// truncation), and NXDOMAIN for names starting with "nx".
type upstream struct {
	addr    string
	queries atomic.Int64
	mu      sync.Mutex
	names   []string
	udp     *dns.Server
	tcp     *dns.Server
	ttl     uint32
}

func startUpstream(t *testing.T) *upstream {
	t.Helper()
	u := &upstream{ttl: 300}
	// TCP on the port UDP picked: another process may hold it, so try
	// again on a new port (the machine runs other tests too).
	var pc net.PacketConn
	var ln net.Listener
	for try := 0; ; try++ {
		var err error
		if pc, err = net.ListenPacket("udp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		if ln, err = net.Listen("tcp", pc.LocalAddr().String()); err == nil {
			break
		}
		pc.Close()
		if try == 9 {
			t.Fatal(err)
		}
	}
	u.addr = pc.LocalAddr().String()
	h := dns.HandlerFunc(u.serve)
	u.udp = &dns.Server{PacketConn: pc, Handler: h}
	u.tcp = &dns.Server{Listener: ln, Handler: h}
	started := make(chan struct{}, 2)
	u.udp.NotifyStartedFunc = func() { started <- struct{}{} }
	u.tcp.NotifyStartedFunc = func() { started <- struct{}{} }
	go u.udp.ActivateAndServe()
	go u.tcp.ActivateAndServe()
	<-started
	<-started
	t.Cleanup(func() {
		u.udp.Shutdown()
		u.tcp.Shutdown()
	})
	return u
}

func (u *upstream) serve(w dns.ResponseWriter, r *dns.Msg) {
	u.queries.Add(1)
	q := r.Question[0]
	u.mu.Lock()
	u.names = append(u.names, q.Name)
	u.mu.Unlock()
	m := new(dns.Msg)
	m.SetReply(r)
	m.RecursionAvailable = true
	hdr := dns.RR_Header{Name: q.Name, Class: dns.ClassINET, Ttl: u.ttl}
	switch {
	case strings.HasPrefix(strings.ToLower(q.Name), "nx"):
		m.Rcode = dns.RcodeNameError
		m.Ns = []dns.RR{&dns.SOA{Hdr: dns.RR_Header{Name: "test.", Rrtype: dns.TypeSOA, Class: dns.ClassINET, Ttl: 60},
			Ns: "ns.test.", Mbox: "h.test.", Serial: 1, Minttl: 60}}
	case q.Qtype == dns.TypeA:
		hdr.Rrtype = dns.TypeA
		m.Answer = []dns.RR{&dns.A{Hdr: hdr, A: net.IPv4(192, 0, 2, 1)}, &dns.A{Hdr: hdr, A: net.IPv4(192, 0, 2, 2)}}
	case q.Qtype == dns.TypeAAAA:
		hdr.Rrtype = dns.TypeAAAA
		m.Answer = []dns.RR{&dns.AAAA{Hdr: hdr, AAAA: net.ParseIP("2001:db8::1")}}
	case q.Qtype == dns.TypeTXT:
		hdr.Rrtype = dns.TypeTXT
		for i := range 40 {
			m.Answer = append(m.Answer, &dns.TXT{Hdr: hdr, Txt: []string{strings.Repeat(string(rune('a'+i%26)), 100)}})
		}
	}
	if w.LocalAddr().Network() == "udp" {
		size := 512
		if o := r.IsEdns0(); o != nil {
			size = int(o.UDPSize())
		}
		m.Truncate(size)
	}
	w.WriteMsg(m)
}

func (u *upstream) seen() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.names...)
}

// eventLog collects audit events (its Notify is collect.Events').
type eventLog struct{ collect.Events }

func (l *eventLog) all() []audit.Event { return l.All() }

// fakeClock is a settable clock for TTL and window tests.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// policyOf is a Policy of the given sandboxes. The agent's come from
// internal/plan (Plan.DNS), which imports this package, so these tests
// build the same value directly, setting fields the policy file leaves
// at their defaults (rare types, bursts, detection limits) where they
// test them.
func policyOf(sandboxes map[string]*SandboxPolicy) *Policy {
	return &Policy{Sandboxes: sandboxes}
}

// allowOnly is a sandbox that may resolve the names allow lists, and no
// other.
func allowOnly(allow ...string) *SandboxPolicy {
	return &SandboxPolicy{Allow: allow}
}

// startProxy starts a proxy on a loopback port with one listener for the
// given sandbox and returns it with its UDP address.
func startProxy(t *testing.T, cfg Config) (*Server, string) {
	t.Helper()
	if cfg.Listeners == nil {
		cfg.Listeners = []Listener{{Addr: "127.0.0.1:0", Sandbox: "sb"}}
	}
	if cfg.HostAddrs == nil {
		// The upstream answers documentation addresses, which a test VM may
		// carry itself (192.0.2.2 on eth0): the tests of host-address
		// refusal name theirs.
		cfg.HostAddrs = noHostAddrs
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, strings.TrimPrefix(s.Addrs()[0], "udp:")
}

func query(t *testing.T, addr, name string, qtype uint16) *dns.Msg {
	t.Helper()
	return queryNet(t, "udp", addr, name, qtype)
}

// queryNet asks one EDNS query over network ("udp" or "tcp").
func queryNet(t *testing.T, network, addr, name string, qtype uint16) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	m.SetEdns0(1232, false)
	c := &dns.Client{Net: network, Timeout: 3 * time.Second}
	r, _, err := c.Exchange(m, addr)
	if err != nil {
		t.Fatalf("query %s over %s: %v", name, network, err)
	}
	return r
}

func ede(m *dns.Msg) (uint16, string, bool) {
	opt := m.IsEdns0()
	if opt == nil {
		return 0, "", false
	}
	for _, o := range opt.Option {
		if e, ok := o.(*dns.EDNS0_EDE); ok {
			return e.InfoCode, e.ExtraText, true
		}
	}
	return 0, "", false
}

// noHostAddrs is Config.HostAddrs for tests whose upstream answers
// addresses the test machine may own.
func noHostAddrs() ([]netip.Addr, error) { return nil, nil }

func (l *eventLog) reset() { l.Reset() }
