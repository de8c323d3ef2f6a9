package dnsproxy

import (
	"context"
	"fmt"
	"math"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// Channels of a name choice and a query type (issue 27), measured from the
// attacker's side: bytes that reach a logging authoritative server on
// loopback per simulated hour, through the whole proxy chain, with the
// restricted preset's limits (50 queries/s, a 4,800-bit budget per 10
// minutes). Beside them, the benign pattern the budget must never cut: 40
// CDN names under one parent, A + AAAA + HTTPS each asked again every TTL
// (20-300 s).
//
// Rerun: bench/dns/info.sh (go test -v -run TestChannelBench).

// authServer is a logging authoritative server for every name: A, AAAA,
// HTTPS/SVCB and the other ordinary types, with a TTL chosen per name.
type authServer struct {
	addr string
	ttl  func(name string) uint32
	mu   sync.Mutex
	seen map[string]int // "name type" -> queries seen
	n    int
}

func startAuth(t *testing.T, ttl func(string) uint32) *authServer {
	t.Helper()
	a := &authServer{ttl: ttl, seen: map[string]int{}}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a.addr = pc.LocalAddr().String()
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(a.serve)}
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	go srv.ActivateAndServe()
	<-started
	t.Cleanup(func() { srv.Shutdown() })
	return a
}

func (a *authServer) serve(w dns.ResponseWriter, r *dns.Msg) {
	q := r.Question[0]
	name := strings.ToLower(q.Name)
	a.mu.Lock()
	a.seen[name+" "+dns.TypeToString[q.Qtype]]++
	a.n++
	a.mu.Unlock()
	ttl := a.ttl(name)
	m := new(dns.Msg)
	m.SetReply(r)
	m.Authoritative = true
	hdr := dns.RR_Header{Name: q.Name, Class: dns.ClassINET, Ttl: ttl, Rrtype: q.Qtype}
	switch q.Qtype {
	case dns.TypeA:
		m.Answer = []dns.RR{&dns.A{Hdr: hdr, A: net.IPv4(198, 18, 7, 7)}}
	case dns.TypeAAAA:
		m.Answer = []dns.RR{&dns.AAAA{Hdr: hdr, AAAA: net.ParseIP("2001:2::7")}}
	case dns.TypeMX:
		m.Answer = []dns.RR{&dns.MX{Hdr: hdr, Preference: 10, Mx: "mx." + q.Name}}
	default:
		// NODATA with the SOA: cached for the same TTL (RFC 2308).
		m.Ns = []dns.RR{&dns.SOA{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeSOA, Class: dns.ClassINET, Ttl: ttl},
			Ns: "ns.test.", Mbox: "h.test.", Serial: 1, Minttl: ttl}}
	}
	w.WriteMsg(m)
}

func (a *authServer) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.n
}

// channelRig is a proxy on a simulated clock in front of an authServer.
type channelRig struct {
	t     *testing.T
	s     *Server
	auth  *authServer
	clock *replayClock
	src   QuerySource
}

func channelPolicy() *Policy {
	return policyOf(map[string]*SandboxPolicy{"sb": {
		Allow:     []string{".exfil.test", ".cdn-edge.test"},
		RateLimit: RateLimit{QPS: 50, Burst: 100},
	}})
}

func newChannelRig(t *testing.T, ttl func(string) uint32) *channelRig {
	auth := startAuth(t, ttl)
	clock := &replayClock{t: time.Unix(1_760_000_000, 0)}
	s, err := New(Config{HostAddrs: noHostAddrs, Upstreams: []string{auth.addr}, Policy: channelPolicy(), Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	return &channelRig{t: t, s: s, auth: auth, clock: clock,
		src: QuerySource{Proto: "udp", Remote: netip.MustParseAddrPort("127.0.0.1:40000"), ListenerSandbox: "sb"}}
}

func (c *channelRig) ask(name string, qtype uint16) (int, string) {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	m.SetEdns0(1232, false)
	raw, err := m.Pack()
	if err != nil {
		c.t.Fatal(err)
	}
	var r dns.Msg
	if err := r.Unpack(c.s.HandlePacket(context.Background(), raw, c.src)); err != nil {
		c.t.Fatalf("unpack answer for %q: %v", name, err)
	}
	_, text, _ := ede(&r)
	return r.Rcode, text
}

// choiceNames are 256 ordinary-looking names under parent.
func choiceNames(parent string) []string {
	words := []string{"api", "cdn", "img", "static", "edge", "assets", "media", "auth", "cache", "data", "files", "js", "css", "fonts", "video", "ws"}
	regions := []string{"eu", "us", "ap", "sa", "af", "me", "ca", "in", "jp", "kr", "au", "de", "fr", "uk", "br", "mx"}
	var out []string
	for i := range 256 {
		out = append(out, words[i>>4]+"-"+regions[i&15]+"."+parent)
	}
	return out
}

// channelResult is one channel's hour.
type channelResult struct {
	sent, delivered int // data queries sent, and seen by the authoritative server
	bitsPerQuery    float64
	firstRefusal    time.Duration
	reason          string
}

func (r channelResult) bytesPerHour() float64 { return float64(r.delivered) * r.bitsPerQuery / 8 }

// runChannel asks symbols[data[i] % len] at qps for d, after asking each
// symbol once (the setup the attacker pays for), and counts what reached
// the authoritative server during the data phase.
func (c *channelRig) runChannel(symbols []func() (string, uint16), qps float64, d time.Duration) channelResult {
	for _, sym := range symbols {
		n, qt := sym()
		c.ask(n, qt)
		c.clock.t = c.clock.t.Add(time.Duration(float64(time.Second) / qps))
	}
	var res channelResult
	res.bitsPerQuery = math.Log2(float64(len(symbols)))
	gap := time.Duration(float64(time.Second) / qps)
	start := c.clock.t
	x := uint32(12345)
	for c.clock.t.Sub(start) < d {
		x = x*1664525 + 1013904223 // the data: uniform symbols
		n, qt := symbols[int(x>>16)%len(symbols)]()
		before := c.auth.count()
		rc, reason := c.ask(n, qt)
		res.sent++
		if c.auth.count() > before {
			res.delivered++
		}
		if rc != dns.RcodeSuccess && res.firstRefusal == 0 {
			res.firstRefusal = c.clock.t.Sub(start)
			res.reason = reason
		}
		c.clock.t = c.clock.t.Add(gap)
	}
	return res
}

func TestChannelBench(t *testing.T) {
	hour := time.Hour
	if testing.Short() {
		hour = 20 * time.Minute
	}
	scale := float64(time.Hour) / float64(hour)
	t.Logf("%-34s %9s %9s %12s %14s  %s", "channel (simulated hour)", "queries", "reached", "bytes/hour", "first refusal", "reason")
	report := func(name string, r channelResult) {
		first := "never"
		if r.firstRefusal > 0 {
			first = r.firstRefusal.Round(time.Second).String()
		}
		t.Logf("%-34s %9d %9d %12.0f %14s  %s", name, r.sent, r.delivered, r.bytesPerHour()*scale, first, r.reason)
	}

	// Which name is asked: 256 names with TTL 0, then a byte a query.
	{
		c := newChannelRig(t, func(string) uint32 { return 0 })
		var syms []func() (string, uint16)
		for _, n := range choiceNames("exfil.test") {
			syms = append(syms, func() (string, uint16) { return n, dns.TypeA })
		}
		report("name choice (256 names, 40 q/s)", c.runChannel(syms, 40, hour))
	}
	// Which type is asked: one name, eight ordinary types, 3 bits a query.
	{
		c := newChannelRig(t, func(string) uint32 { return 0 })
		var syms []func() (string, uint16)
		for _, qt := range []uint16{dns.TypeA, dns.TypeAAAA, dns.TypeCNAME, dns.TypeMX, dns.TypeNS, dns.TypeSOA, dns.TypeSRV, dns.TypeHTTPS} {
			syms = append(syms, func() (string, uint16) { return "api.exfil.test", qt })
		}
		report("query type (8 types, 40 q/s)", c.runChannel(syms, 40, hour))
	}
	// Eviction: cut the domain, flood names under unlisted domains, ask
	// the cut domain again.
	{
		c := newChannelRig(t, func(string) uint32 { return 0 })
		var syms []func() (string, uint16)
		for _, n := range choiceNames("exfil.test") {
			syms = append(syms, func() (string, uint16) { return n, dns.TypeA })
		}
		_ = syms
		// Two names that spell text in hex: the domain is cut for 30
		// minutes (encoded labels).
		c.ask("68656c6c6f2c20776f726c64.exfil.test", dns.TypeA)
		c.ask("736563726574206b6579.exfil.test", dns.TypeA)
		var cutAt time.Duration
		if rc, _ := c.ask("api-eu.exfil.test", dns.TypeA); rc != dns.RcodeSuccess {
			cutAt = time.Second
		}
		flood := 0
		lifted := time.Duration(0)
		floodStart := c.clock.t
		for i := 0; i < 4160*2 && lifted == 0; i++ {
			c.ask(fmt.Sprintf("www.site%d.test", i), dns.TypeA)
			flood++
			c.clock.t = c.clock.t.Add(22 * time.Millisecond)
			if i >= 4159 && i%520 == 519 { // asking touches the domain: ask rarely
				if rc, _ := c.ask("api-eu.exfil.test", dns.TypeA); rc == dns.RcodeSuccess {
					lifted = c.clock.t.Sub(floodStart)
				}
			}
		}
		verdict := "cut held"
		if cutAt == 0 {
			verdict = "never cut"
		} else if lifted > 0 {
			verdict = fmt.Sprintf("cut lifted after %d flood queries (%s)", flood, lifted.Round(time.Second))
		}
		t.Logf("%-34s %9d %9s %12s %14s  %s", "eviction flood (unlisted names)", flood, "", "", "", verdict)
		if testing.Verbose() && lifted > 0 {
			t.Logf("  (a lifted cut reopens the name channel above for another budget's worth)")
		}
	}
	// Benign: 40 CDN names, A + AAAA + HTTPS each asked again every TTL.
	{
		ttlOf := func(name string) uint32 {
			var i int
			fmt.Sscanf(name, "e%d.", &i)
			return uint32(20 + (i*7)%281) // 20-300 s
		}
		c := newChannelRig(t, ttlOf)
		next := make([]time.Time, 40)
		for i := range next {
			next[i] = c.clock.t.Add(time.Duration(i) * 250 * time.Millisecond)
		}
		start := c.clock.t
		asked, cut := 0, 0
		reason := ""
		peak := 0.0
		x := uint32(5)
		st := c.s.sandboxState("sb")
		for c.clock.t.Sub(start) < hour {
			for i := range next {
				if c.clock.t.Before(next[i]) {
					continue
				}
				n := fmt.Sprintf("e%d.cdn-edge.test", i)
				// A stub asks the three types in no fixed order, and
				// comes back up to 3 s after the TTL ran out.
				x = x*1664525 + 1013904223
				types := []uint16{dns.TypeA, dns.TypeAAAA, dns.TypeHTTPS}
				k := int(x>>16) % 3
				types[0], types[k] = types[k], types[0]
				for _, qt := range types {
					asked++
					if rc, why := c.ask(n, qt); rc != dns.RcodeSuccess {
						cut++
						reason = why
					}
				}
				next[i] = c.clock.t.Add(time.Duration(ttlOf(n+"."))*time.Second + time.Duration(x>>8%3000)*time.Millisecond)
			}
			st.mu.Lock()
			if d := st.lookup("cdn-edge.test"); d != nil {
				peak = max(peak, d.info.estimate(c.clock.t, 10*time.Minute))
			}
			st.mu.Unlock()
			c.clock.t = c.clock.t.Add(250 * time.Millisecond)
		}
		reason = fmt.Sprintf("peak %.0f of 4800 bits %s", peak, reason)
		t.Logf("%-34s %9d %9d %12s %14s  %d refused %s", "benign CDN (40 names x3, TTL)", asked, c.auth.count(), "", "", cut, reason)
		if cut > 0 {
			t.Errorf("benign CDN pattern: %d of %d queries refused (%s)", cut, asked, reason)
		}
	}
}
