package dnsproxy

import (
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/miekg/dns"
)

func TestLocalKind(t *testing.T) {
	for addr, want := range map[string]string{
		"169.254.169.254":        "cloud metadata",
		"::ffff:169.254.169.254": "cloud metadata",
		"fd00:ec2::254":          "cloud metadata",
		"100.100.100.200":        "cloud metadata",
		"64:ff9b::a9fe:a9fe":     "cloud metadata", // NAT64 of 169.254.169.254
		"2002:a9fe:a9fe::1":      "cloud metadata", // 6to4 of it
		"127.0.0.1":              "loopback",
		"127.53.0.9":             "loopback",
		"::1":                    "loopback",
		"::ffff:127.0.0.1":       "loopback",
		"::127.0.0.1":            "loopback", // IPv4-compatible
		"0.0.0.0":                "unspecified",
		"::":                     "unspecified",
		"169.254.1.1":            "link-local",
		"fe80::1%eth0":           "link-local",
		"10.1.2.3":               "private",
		"172.16.0.1":             "private",
		"172.31.255.255":         "private",
		"192.168.1.1":            "private",
		"::ffff:10.0.0.1":        "private",
		"fc00::1":                "unique-local",
		"fd12:3456::1":           "unique-local",
		"100.64.0.1":             "shared address space",
		"224.0.0.251":            "multicast",
		"ff02::fb":               "multicast",
		"255.255.255.255":        "reserved",
		// The public internet.
		"93.184.216.34":    "",
		"172.32.0.1":       "",
		"192.0.2.1":        "",
		"2606:4700::1":     "",
		"::ffff:8.8.8.8":   "",
		"64:ff9b::808:808": "",
		"2001:db8::1":      "",
	} {
		if got := LocalKind(netip.MustParseAddr(addr)); got != want {
			t.Errorf("LocalKind(%s) = %q, want %q", addr, got, want)
		}
	}
}

// rebindUpstream is a real DNS server on loopback answering from a table.
type rebindUpstream struct {
	mu      sync.Mutex
	answers map[string][]string // lower-case FQDN -> addresses
	asked   []string
}

func startRebindUpstream(t *testing.T, answers map[string][]string) (*rebindUpstream, string) {
	t.Helper()
	u := &rebindUpstream{answers: answers}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		q := r.Question[0]
		u.mu.Lock()
		u.asked = append(u.asked, q.Name)
		addrs := u.answers[strings.ToLower(q.Name)]
		u.mu.Unlock()
		m := new(dns.Msg)
		m.SetReply(r)
		if addrs == nil {
			m.Rcode = dns.RcodeNameError
		}
		for _, s := range addrs {
			a := netip.MustParseAddr(s)
			hdr := dns.RR_Header{Name: q.Name, Class: dns.ClassINET, Ttl: 60}
			switch {
			case q.Qtype == dns.TypeA && a.Is4():
				hdr.Rrtype = dns.TypeA
				m.Answer = append(m.Answer, &dns.A{Hdr: hdr, A: a.AsSlice()})
			case q.Qtype == dns.TypeAAAA && a.Is6():
				hdr.Rrtype = dns.TypeAAAA
				m.Answer = append(m.Answer, &dns.AAAA{Hdr: hdr, AAAA: a.AsSlice()})
			}
		}
		w.WriteMsg(m)
	})}
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	go srv.ActivateAndServe()
	<-started
	t.Cleanup(func() { srv.Shutdown() })
	return u, pc.LocalAddr().String()
}

// TestRebindingRefused: names an allowlist (or default allow) lets through
// but whose answers are local addresses get NXDOMAIN with an RFC 8914
// Blocked reason, and OnAnswer (the egress allowlist) never sees them;
// public answers and explicitly allowed local ranges are answered.
func TestRebindingRefused(t *testing.T) {
	hostAddr := netip.MustParseAddr("203.0.113.77") // stands in for a public address of this host
	_, up := startRebindUpstream(t, map[string][]string{
		"meta.evil.test.":   {"169.254.169.254"},
		"loop.evil.test.":   {"127.0.0.1"},
		"zero.evil.test.":   {"0.0.0.0"},
		"lan.evil.test.":    {"192.168.1.10"},
		"ula.evil.test.":    {"fd00::5"},
		"mapped.evil.test.": {"::ffff:127.0.0.1"},
		"host.evil.test.":   {hostAddr.String()},
		"mixed.evil.test.":  {"93.184.216.34", "10.0.0.7"},
		"www.good.test.":    {"93.184.216.34", "2606:4700::1"},
		"db.corp.test.":     {"10.20.0.5"},
		"dev.corp.test.":    {"127.0.0.1"},
	})
	var mu sync.Mutex
	admitted := map[string][]netip.Addr{}
	s, _ := startProxy(t, Config{
		Listeners: []Listener{{Addr: "127.0.0.1:0", Sandbox: "sb"}, {Addr: "127.0.0.1:0", Sandbox: "corp"}},
		Upstreams: []string{up},
		Policy: policyOf(map[string]*SandboxPolicy{
			"sb": {Default: "allow"},
			"corp": {Default: "allow", LocalAllow: []netip.Prefix{
				netip.MustParsePrefix("10.20.0.0/16"), netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}},
		}),
		HostAddrs: func() ([]netip.Addr, error) { return []netip.Addr{hostAddr, netip.MustParseAddr("127.0.0.1")}, nil },
		OnAnswer: func(a Answer) {
			mu.Lock()
			admitted[a.Sandbox+" "+a.Name] = append(admitted[a.Sandbox+" "+a.Name], a.Addrs...)
			mu.Unlock()
		},
	})
	addrs := s.Addrs()
	sbAddr, corpAddr := strings.TrimPrefix(addrs[0], "udp:"), strings.TrimPrefix(addrs[1], "udp:")

	for name, kind := range map[string]string{
		"meta.evil.test": "cloud metadata", "loop.evil.test": "loopback", "zero.evil.test": "unspecified",
		"lan.evil.test": "private", "ula.evil.test": "unique-local", "mapped.evil.test": "loopback",
		"host.evil.test": "host address", "mixed.evil.test": "private",
	} {
		qtype := dns.TypeA
		if strings.HasPrefix(name, "ula") || strings.HasPrefix(name, "mapped") {
			qtype = dns.TypeAAAA
		}
		// Twice: the second answer comes from the cache.
		for i := range 2 {
			r := query(t, sbAddr, name, qtype)
			code, text, ok := ede(r)
			if r.Rcode != dns.RcodeNameError || len(r.Answer) != 0 || !ok || code != dns.ExtendedErrorCodeBlocked ||
				!strings.HasPrefix(text, ReasonLocalAnswer) || !strings.Contains(text, "("+kind+")") {
				t.Errorf("%s (try %d): rcode %s, %d answers, EDE %d %q, want NXDOMAIN, Blocked %q (%s)",
					name, i, dns.RcodeToString[r.Rcode], len(r.Answer), code, text, ReasonLocalAnswer, kind)
			}
		}
	}
	// The benign neighbour: a public answer is answered and admitted.
	if r := query(t, sbAddr, "www.good.test", dns.TypeA); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
		t.Errorf("www.good.test: %v", r)
	}
	// An explicit local allowance answers its ranges only, and still does
	// not hand the local addresses to the egress allowlist.
	for _, name := range []string{"db.corp.test", "dev.corp.test"} {
		if r := query(t, corpAddr, name, dns.TypeA); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
			t.Errorf("corp %s: %v", name, r)
		}
	}
	for _, name := range []string{"meta.evil.test", "lan.evil.test"} {
		if r := query(t, corpAddr, name, dns.TypeA); r.Rcode != dns.RcodeNameError {
			t.Errorf("corp %s: rcode %s, want NXDOMAIN (outside its allowance)", name, dns.RcodeToString[r.Rcode])
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for key, as := range admitted {
		for _, a := range as {
			if LocalKind(a) != "" || a == hostAddr {
				t.Errorf("OnAnswer got local address %s for %s", a, key)
			}
		}
	}
	if len(admitted["sb www.good.test."]) == 0 {
		t.Errorf("public answer not reported: %v", admitted)
	}
	if st := s.Stats(); st.Reasons[ReasonLocalAnswer] != 16+2 {
		t.Errorf("local-answer refusals counted %d, want 18 (%v)", st.Reasons[ReasonLocalAnswer], st.Reasons)
	}
}
