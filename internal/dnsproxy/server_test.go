package dnsproxy

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/watcherhq/watcher/internal/audit"
)

func basicPolicy() *Policy {
	return policyOf(map[string]*SandboxPolicy{"sb": {
		Allow:           []string{"pypi.org", "*.pythonhosted.org", ".example.com", ".google.com", ".bigcorp.io"},
		Deny:            []string{"secret.example.com"},
		HighCardinality: []string{"cdn.example.com"},
	}})
}

func TestForwardCacheAndOnAnswer(t *testing.T) {
	up := startUpstream(t)
	clock := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	var mu sync.Mutex
	var answers []Answer
	events := &eventLog{}
	s, addr := startProxy(t, Config{
		Upstreams: []string{up.addr},
		Policy:    basicPolicy(),
		Events:    events,
		Now:       clock.Now,
		OnAnswer: func(a Answer) {
			mu.Lock()
			answers = append(answers, a)
			mu.Unlock()
		},
	})

	r := query(t, addr, "PyPI.org", dns.TypeA)
	if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 2 {
		t.Fatalf("allowed name: rcode %s, %d answers", dns.RcodeToString[r.Rcode], len(r.Answer))
	}
	if r.Question[0].Name != "PyPI.org." {
		t.Errorf("question case not kept: %q", r.Question[0].Name)
	}
	if r.Answer[0].Header().Ttl != 300 {
		t.Errorf("first TTL %d, want 300", r.Answer[0].Header().Ttl)
	}
	if up.queries.Load() != 1 {
		t.Fatalf("upstream saw %d queries, want 1", up.queries.Load())
	}

	clock.Advance(100 * time.Second)
	r = query(t, addr, "pypi.org", dns.TypeA)
	if up.queries.Load() != 1 {
		t.Errorf("cached answer went upstream again")
	}
	if got := r.Answer[0].Header().Ttl; got != 200 {
		t.Errorf("cached TTL %d, want 200", got)
	}
	if r.IsEdns0() == nil {
		t.Errorf("client sent EDNS, cached answer has no OPT")
	}

	clock.Advance(201 * time.Second)
	query(t, addr, "pypi.org", dns.TypeA)
	if up.queries.Load() != 2 {
		t.Errorf("expired entry not refreshed: upstream saw %d", up.queries.Load())
	}

	r = query(t, addr, "files.pythonhosted.org", dns.TypeAAAA)
	if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
		t.Fatalf("AAAA: %v", r)
	}

	mu.Lock()
	defer mu.Unlock()
	if len(answers) != 4 {
		t.Fatalf("OnAnswer called %d times, want 4", len(answers))
	}
	want := netip.MustParseAddr("192.0.2.1")
	if answers[1].Sandbox != "sb" || answers[1].Name != "pypi.org." || answers[1].TTL != 200 || answers[1].Addrs[0] != want {
		t.Errorf("OnAnswer after cache hit: %+v", answers[1])
	}
	if answers[3].Addrs[0] != netip.MustParseAddr("2001:db8::1") {
		t.Errorf("AAAA OnAnswer: %+v", answers[3])
	}
	st := s.Stats()
	if st.CacheHits != 1 || st.Allowed != 4 {
		t.Errorf("stats: %+v", st)
	}
	evs := events.all()
	if len(evs) != 4 || evs[0].Kind != audit.KindDNS || evs[0].Verdict != audit.VerdictAllowed ||
		evs[0].Sandbox.Name != "sb" || evs[0].DNS.QType != "A" || len(evs[0].DNS.Answers) != 2 {
		t.Errorf("events: %+v", evs)
	}
}

func TestBlockedAnswers(t *testing.T) {
	up := startUpstream(t)
	events := &eventLog{}
	s, addr := startProxy(t, Config{Upstreams: []string{up.addr}, Policy: basicPolicy(), Events: events})

	cases := []struct {
		name   string
		rcode  int
		ede    uint16
		reason string
	}{
		{"evil.test", dns.RcodeNameError, dns.ExtendedErrorCodeFiltered, ReasonNotAllowed},
		{"www.pypi.org", dns.RcodeNameError, dns.ExtendedErrorCodeFiltered, ReasonNotAllowed}, // exact entry only
		{"pythonhosted.org", dns.RcodeNameError, dns.ExtendedErrorCodeFiltered, ReasonNotAllowed},
		{"secret.example.com", dns.RcodeNameError, dns.ExtendedErrorCodeBlocked, ReasonDenied},
		// Atomic Red Team T1048: base64 with padding under an allowed parent.
		{"dGhpcyBpcyBhIHNlY3JldCBpbmZvCg==.google.com", dns.RcodeRefused, dns.ExtendedErrorCodeBlocked, ReasonInvalidBytes},
		// The same payload without padding: mixed-case base64.
		{"dGhpcyBpcyBhIHNlY3JldCBpbmZvCg.google.com", dns.RcodeNameError, dns.ExtendedErrorCodeBlocked, ReasonEncoded},
		{"6d792070617373776f72642069732068756e74657232.example.com", dns.RcodeNameError, dns.ExtendedErrorCodeBlocked, ReasonEncoded},
	}
	for _, c := range cases {
		r := query(t, addr, c.name, dns.TypeA)
		if r.Rcode != c.rcode {
			t.Errorf("%s: rcode %s, want %s", c.name, dns.RcodeToString[r.Rcode], dns.RcodeToString[c.rcode])
			continue
		}
		if len(r.Question) != 1 || !strings.EqualFold(r.Question[0].Name, dns.Fqdn(c.name)) {
			t.Errorf("%s: question not echoed: %v", c.name, r.Question)
		}
		code, text, ok := ede(r)
		if !ok || code != c.ede || text != c.reason {
			t.Errorf("%s: EDE %d %q (present %v), want %d %q", c.name, code, text, ok, c.ede, c.reason)
		}
		if c.rcode == dns.RcodeNameError {
			if len(r.Ns) != 1 {
				t.Fatalf("%s: no SOA in authority", c.name)
			}
			soa, ok := r.Ns[0].(*dns.SOA)
			if !ok || soa.Hdr.Ttl != 30 || soa.Minttl != 30 {
				t.Errorf("%s: authority %v, want SOA with TTL 30", c.name, r.Ns[0])
			}
		}
	}
	if n := up.queries.Load(); n != 0 {
		t.Errorf("blocked names reached the upstream (%d queries): %v", n, up.seen())
	}
	st := s.Stats()
	if st.Blocked != 6 || st.Refused != 1 || st.Reasons[ReasonNotAllowed] != 3 || st.Reasons[ReasonEncoded] != 2 {
		t.Errorf("stats: %+v", st)
	}
	for _, e := range events.all() {
		if e.Verdict != audit.VerdictDenied || e.DNS.Reason == "" {
			t.Errorf("event for a blocked name: %+v %+v", e, e.DNS)
		}
		if e.DNS.Reason == ReasonEncoded && !e.IsAlert() {
			t.Errorf("encoded-label event is not an alert")
		}
	}
}

func TestPatterns(t *testing.T) {
	set := newNameSet([]string{"pypi.org", "*.pythonhosted.org", ".github.com"})
	for name, want := range map[string]bool{
		"pypi.org": true, "www.pypi.org": false, "pythonhosted.org": false, "files.pythonhosted.org": true,
		"a.b.pythonhosted.org": true, "github.com": true, "api.github.com": true, "notgithub.com": false,
		"github.com.evil.net": false, "org": false,
	} {
		if got := set.match(name); got != want {
			t.Errorf("match(%q) = %v, want %v", name, got, want)
		}
	}
}

func TestStreamCutoff(t *testing.T) {
	up := startUpstream(t)
	s, addr := startProxy(t, Config{Upstreams: []string{up.addr}, Policy: basicPolicy()})
	// Many cheap distinct names under one domain (host1, host2, ...) carry
	// little information: the old fixed cut refused the 17th; the budget
	// lets them through.
	for i := range 60 {
		if r := query(t, addr, fmt.Sprintf("host%d.bigcorp.io", i), dns.TypeA); r.Rcode != dns.RcodeSuccess {
			t.Fatalf("host%d.bigcorp.io: %s (cheap names cut)", i, dns.RcodeToString[r.Rcode])
		}
	}
	// Data spelled in words (no name looks encoded alone): each name
	// carries new bits until the domain's budget is spent.
	syll := []string{"ba", "ke", "mo", "ri", "tu", "la", "ne", "so", "pi", "da", "go", "fe", "zu", "hi", "wa", "co"}
	rng := uint32(1)
	word := func() string {
		w := ""
		for range 3 {
			rng = rng*1664525 + 1013904223
			w += syll[rng>>28]
		}
		return w
	}
	var cutAt int
	for i := range 400 {
		name := fmt.Sprintf("%s-%s-%s.words.example.com", word(), word(), word())
		r := query(t, addr, name, dns.TypeA)
		if r.Rcode == dns.RcodeNameError {
			_, text, _ := ede(r)
			if cutAt == 0 {
				cutAt = i + 1
				if text != ReasonInfoBudget+" under example.com" {
					t.Fatalf("first refusal at %d: reason %q", cutAt, text)
				}
			}
		} else if cutAt != 0 {
			t.Fatalf("query %d allowed after the domain was cut off", i+1)
		}
	}
	if cutAt == 0 || cutAt > 200 {
		t.Errorf("word-spelled data cut at query %d, want within 200 (4800 bits at ~36 bits a name)", cutAt)
	}
	t.Logf("word-spelled data under example.com cut at query %d", cutAt)
	// Asking again for a name seen before is still refused: the domain is cut.
	if r := query(t, addr, "www.example.com", dns.TypeA); r.Rcode != dns.RcodeNameError {
		t.Errorf("cut-off domain answered")
	}
	// Other domains are unaffected.
	if r := query(t, addr, "pypi.org", dns.TypeA); r.Rcode != dns.RcodeSuccess {
		t.Errorf("unrelated name blocked")
	}
	if s.Stats().DomainsCut == 0 {
		t.Errorf("DomainsCut not counted")
	}
}

func TestRateLimitPerSandbox(t *testing.T) {
	up := startUpstream(t)
	pol := policyOf(map[string]*SandboxPolicy{
		"noisy": {Allow: []string{".example.com"}, RateLimit: RateLimit{QPS: 1, Burst: 5}},
		"quiet": allowOnly(".example.com"),
	})
	s, err := New(Config{HostAddrs: noHostAddrs,
		Upstreams: []string{up.addr},
		Policy:    pol,
		Listeners: []Listener{{Addr: "127.0.0.1:0", Network: "udp", Sandbox: "noisy"}, {Addr: "127.0.0.1:0", Network: "udp", Sandbox: "quiet"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	addrs := s.Addrs()
	noisy, quiet := strings.TrimPrefix(addrs[0], "udp:"), strings.TrimPrefix(addrs[1], "udp:")
	refused := 0
	for range 20 {
		r := query(t, noisy, "www.example.com", dns.TypeA)
		if r.Rcode == dns.RcodeRefused {
			refused++
			if _, text, _ := ede(r); text != ReasonRateLimited {
				t.Errorf("rate-limit EDE text %q", text)
			}
		}
	}
	if refused < 14 {
		t.Errorf("only %d of 20 refused with burst 5 at 1 q/s", refused)
	}
	if r := query(t, quiet, "www.example.com", dns.TypeA); r.Rcode != dns.RcodeSuccess {
		t.Errorf("other sandbox starved: %s", dns.RcodeToString[r.Rcode])
	}
	if got := s.Stats().RateLimited; got != uint64(refused) {
		t.Errorf("RateLimited %d, refused %d", got, refused)
	}
}

func TestAddrTableResolver(t *testing.T) {
	up := startUpstream(t)
	table := NewAddrTable()
	pol := policyOf(map[string]*SandboxPolicy{"a": allowOnly("a.example.com"), "b": allowOnly("b.example.com")})
	s, err := New(Config{HostAddrs: noHostAddrs, Upstreams: []string{up.addr}, Policy: pol, Sandboxes: table})
	if err != nil {
		t.Fatal(err)
	}
	src := QuerySource{Proto: "udp", Remote: netip.MustParseAddrPort("127.0.0.1:4000")}
	ask := func(name string) int {
		m := new(dns.Msg)
		m.SetQuestion(name, dns.TypeA)
		raw, _ := m.Pack()
		var r dns.Msg
		if err := r.Unpack(s.HandlePacket(context.Background(), raw, src)); err != nil {
			t.Fatal(err)
		}
		return r.Rcode
	}
	if rc := ask("a.example.com."); rc != dns.RcodeRefused {
		t.Errorf("unknown client: %s, want REFUSED", dns.RcodeToString[rc])
	}
	table.SetPrefix(netip.MustParsePrefix("127.0.0.0/8"), "a")
	if rc := ask("a.example.com."); rc != dns.RcodeSuccess {
		t.Errorf("prefix entry: %s", dns.RcodeToString[rc])
	}
	table.SetAddrPort(src.Remote, "b")
	if rc := ask("a.example.com."); rc != dns.RcodeNameError {
		t.Errorf("exact entry should win: %s", dns.RcodeToString[rc])
	}
	if rc := ask("b.example.com."); rc != dns.RcodeSuccess {
		t.Errorf("sandbox b: %s", dns.RcodeToString[rc])
	}
	table.DeleteAddrPort(src.Remote)
	if rc := ask("b.example.com."); rc != dns.RcodeNameError {
		t.Errorf("after delete: %s", dns.RcodeToString[rc])
	}
}

func TestTruncationAndTCP(t *testing.T) {
	up := startUpstream(t)
	_, addr := startProxy(t, Config{Upstreams: []string{up.addr}, Policy: basicPolicy()})
	// Upstream TXT answer is ~4 kB: it truncates over UDP, the proxy retries
	// over TCP and caches the whole answer.
	r := query(t, addr, "txt.example.com", dns.TypeTXT)
	if !r.Truncated || r.Rcode != dns.RcodeSuccess {
		t.Fatalf("UDP client with 1232 bytes should get TC: tc=%v rcode=%s", r.Truncated, dns.RcodeToString[r.Rcode])
	}
	m := new(dns.Msg)
	m.SetQuestion("txt.example.com.", dns.TypeTXT)
	c := &dns.Client{Net: "tcp", Timeout: 3 * time.Second}
	r, _, err := c.Exchange(m, addr)
	if err != nil {
		t.Fatal(err)
	}
	if r.Truncated || len(r.Answer) != 40 {
		t.Fatalf("TCP answer: tc=%v, %d answers, want 40", r.Truncated, len(r.Answer))
	}
	if r.IsEdns0() != nil {
		t.Errorf("client sent no EDNS, answer has OPT")
	}
}

func TestUpstreamFailure(t *testing.T) {
	up := startUpstream(t)
	// Nothing listens on the first upstream (a port we bind and close).
	dead := deadAddr(t)
	s, addr := startProxy(t, Config{Upstreams: []string{dead, up.addr}, Policy: basicPolicy(), UpstreamTimeout: 300 * time.Millisecond})
	if r := query(t, addr, "www.example.com", dns.TypeA); r.Rcode != dns.RcodeSuccess {
		t.Fatalf("second upstream not tried: %s", dns.RcodeToString[r.Rcode])
	}
	_, addr2 := startProxy(t, Config{Upstreams: []string{dead}, Policy: basicPolicy(), UpstreamTimeout: 300 * time.Millisecond})
	r := query(t, addr2, "www.example.com", dns.TypeA)
	if r.Rcode != dns.RcodeServerFailure {
		t.Fatalf("all upstreams down: %s, want SERVFAIL", dns.RcodeToString[r.Rcode])
	}
	if code, _, ok := ede(r); !ok || code != dns.ExtendedErrorCodeNetworkError {
		t.Errorf("SERVFAIL without network-error EDE")
	}
	_ = s
}

func deadAddr(t *testing.T) string {
	t.Helper()
	s, addr := startProxy(t, Config{Policy: basicPolicy()})
	s.Close()
	return addr
}

// A policy the proxy cannot serve as given is refused whole, and the
// one in force stays.
func TestSetPolicyKeepsPolicyOnError(t *testing.T) {
	up := startUpstream(t)
	s, addr := startProxy(t, Config{Upstreams: []string{up.addr}, Policy: basicPolicy()})
	if err := s.SetPolicy(policyOf(map[string]*SandboxPolicy{"sb": allowOnly(".example.org")})); err != nil {
		t.Fatal(err)
	}
	if r := query(t, addr, "www.example.org", dns.TypeA); r.Rcode != dns.RcodeSuccess {
		t.Fatalf("new policy not in force")
	}
	bad := map[string]*SandboxPolicy{
		"bad pattern":     {Allow: []string{".example.net", "bad name!.com"}},
		"bad default":     {Allow: []string{".example.net"}, Default: "maybe"},
		"bad mode":        {Allow: []string{".example.net"}, Detection: Detection{Mode: "loud"}},
		"negative limit":  {Allow: []string{".example.net"}, RateLimit: RateLimit{QPS: -1}},
		"invalid network": {Allow: []string{".example.net"}, LocalAllow: []netip.Prefix{{}}},
	}
	for name, sp := range bad {
		if err := s.SetPolicy(policyOf(map[string]*SandboxPolicy{"sb": sp})); err == nil || !strings.Contains(err.Error(), `sandbox "sb"`) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if r := query(t, addr, "www.example.org", dns.TypeA); r.Rcode != dns.RcodeSuccess {
		t.Errorf("previous policy lost after a refused one")
	}
	if r := query(t, addr, "www.example.net", dns.TypeA); r.Rcode != dns.RcodeNameError {
		t.Errorf("refused policy partly applied")
	}
}

func TestRecordMode(t *testing.T) {
	up := startUpstream(t)
	events := &eventLog{}
	s, addr := startProxy(t, Config{Upstreams: []string{up.addr}, Events: events, Policy: policyOf(map[string]*SandboxPolicy{"sb": {Allow: []string{".example.com"}, Detection: Detection{Mode: "record"}}})})
	r := query(t, addr, "6d792070617373776f7264206973206875.example.com", dns.TypeA)
	if r.Rcode != dns.RcodeSuccess {
		t.Fatalf("record mode blocked: %s", dns.RcodeToString[r.Rcode])
	}
	evs := events.all()
	if len(evs) != 1 || evs[0].Verdict != audit.VerdictRecorded || evs[0].DNS.Reason != ReasonEncoded || !evs[0].IsAlert() {
		t.Errorf("record-mode event: %+v", evs)
	}
	if s.Stats().Recorded != 1 {
		t.Errorf("Recorded not counted")
	}
}

func TestStateIsBounded(t *testing.T) {
	up := startUpstream(t)
	s, err := New(Config{HostAddrs: noHostAddrs, Upstreams: []string{up.addr}, Policy: policyOf(map[string]*SandboxPolicy{"sb": {Default: "allow"}}), CacheEntries: 1000})
	if err != nil {
		t.Fatal(err)
	}
	src := QuerySource{Proto: "udp", ListenerSandbox: "sb", Remote: netip.MustParseAddrPort("127.0.0.1:5000")}
	for i := range 3 * maxDomainsPerSandbox {
		m := new(dns.Msg)
		m.SetQuestion(fmt.Sprintf("n%d.d%d.com.", i, i), dns.TypeA)
		raw, _ := m.Pack()
		s.HandlePacket(context.Background(), raw, src)
	}
	if n := s.sandboxState("sb").domainCount(); n > maxDomainsPerSandbox {
		t.Errorf("%d domains tracked, bound %d", n, maxDomainsPerSandbox)
	}
	if n := s.cache.len(); n > 1000 {
		t.Errorf("%d cache entries, bound 1000", n)
	}
	// Many names under one domain: the name-hash list stops growing.
	for i := range 5000 {
		m := new(dns.Msg)
		m.SetQuestion(fmt.Sprintf("x%d.one.com.", i), dns.TypeA)
		raw, _ := m.Pack()
		s.HandlePacket(context.Background(), raw, src)
	}
	st := s.sandboxState("sb")
	st.mu.Lock()
	d := st.lookup("one.com")
	n := len(d.names)
	st.mu.Unlock()
	if n > 16*16+1 {
		t.Errorf("%d name hashes kept for one domain", n)
	}
}

// TestRecordOnlySandbox: a sandbox in record mode resolves what its lists
// would refuse and records each as a would-refuse event; the same lists
// without record_only refuse.
func TestRecordOnlySandbox(t *testing.T) {
	up := startUpstream(t)
	events := &eventLog{}
	_, addr := startProxy(t, Config{Upstreams: []string{up.addr}, Events: events, Policy: policyOf(map[string]*SandboxPolicy{"sb": {Allow: []string{".example.com"}, Deny: []string{"bad.example.com"}, RecordOnly: true}})})
	for _, tc := range []struct {
		name, reason string
		verdict      audit.Verdict
	}{
		{"unlisted.org.", ReasonNotAllowed, audit.VerdictRecorded},
		{"bad.example.com.", ReasonDenied, audit.VerdictRecorded},
		{"ok.example.com.", "", audit.VerdictAllowed},
		{"nxunlisted.org.", ReasonNotAllowed, audit.VerdictRecorded}, // the upstream says NXDOMAIN
	} {
		events.reset()
		r := query(t, addr, tc.name, dns.TypeA)
		if strings.HasPrefix(tc.name, "nx") {
			if r.Rcode != dns.RcodeNameError {
				t.Errorf("%s: %s, want the upstream's NXDOMAIN", tc.name, dns.RcodeToString[r.Rcode])
			}
		} else if r.Rcode != dns.RcodeSuccess || len(r.Answer) == 0 {
			t.Errorf("%s in record mode: %s, %d answers", tc.name, dns.RcodeToString[r.Rcode], len(r.Answer))
		}
		evs := events.all()
		if len(evs) != 1 || evs[0].Verdict != tc.verdict || evs[0].DNS.Reason != tc.reason {
			t.Errorf("%s: events %+v, want one %s with reason %q", tc.name, evs, tc.verdict, tc.reason)
		}
	}

	events2 := &eventLog{}
	_, enforcing := startProxy(t, Config{Upstreams: []string{up.addr}, Events: events2, Policy: policyOf(map[string]*SandboxPolicy{"sb": {Allow: []string{".example.com"}, Deny: []string{"bad.example.com"}}})})
	for _, name := range []string{"unlisted.org.", "bad.example.com."} {
		if r := query(t, enforcing, name, dns.TypeA); r.Rcode != dns.RcodeNameError {
			t.Errorf("%s enforced: %s, want NXDOMAIN", name, dns.RcodeToString[r.Rcode])
		}
	}
	for _, ev := range events2.all() {
		if ev.Verdict != audit.VerdictDenied {
			t.Errorf("enforcing event %+v", ev)
		}
	}
}
