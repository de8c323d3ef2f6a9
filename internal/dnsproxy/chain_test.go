package dnsproxy

import (
	"net/netip"
	"testing"

	"github.com/miekg/dns"
)

// TestChainStageAnswers: each stage of the chain (chain.go) answers the
// queries that are its to answer, and none before it does: a query is
// run through process, without sockets, and the stage that answered is
// told by its reason.
func TestChainStageAnswers(t *testing.T) {
	pol := policyOf(map[string]*SandboxPolicy{"sb": {
		Allow: []string{".example.com"}, Deny: []string{"bad.example.com"},
		RateLimit: RateLimit{QPS: 0.001, Burst: 6}, RareTypes: RateLimit{QPS: 0.001, Burst: 1},
	}})
	s, err := New(Config{HostAddrs: noHostAddrs, Upstreams: []string{"127.0.0.1:1"}, Policy: pol,
		Sandboxes: SandboxResolverFunc(func(src QuerySource) (string, bool) {
			return "sb", src.Remote.Port() != 666
		})})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ask := func(name string, qtype uint16, port uint16) *request {
		t.Helper()
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(name), qtype)
		raw, err := m.Pack()
		if err != nil {
			t.Fatal(err)
		}
		r := &request{raw: raw, src: QuerySource{Proto: "udp", Local: netip.MustParseAddrPort("127.0.0.1:53"),
			Remote: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port)}}
		s.process(r, nil)
		return r
	}
	for _, c := range []struct {
		stage, name string
		qtype       uint16
		port        uint16
		reason      string
	}{
		{"parse", "x.example.com", dns.TypeANY, 5353, ReasonQType},
		{"sandbox", "x.example.com", dns.TypeA, 666, ReasonNoSandbox},
		{"name", "a\\001b.example.com", dns.TypeA, 5353, ReasonInvalidBytes},
		{"policy (deny)", "bad.example.com", dns.TypeA, 5353, ReasonDenied},
		{"policy (allow)", "example.org", dns.TypeA, 5353, ReasonNotAllowed},
		{"rare", "t1.example.com", dns.TypeTXT, 5353, ""}, // the budget's one query: on to forward
		{"rare", "t2.example.com", dns.TypeTXT, 5353, ReasonRareType},
	} {
		r := ask(c.name, c.qtype, c.port)
		if c.reason != "" && r.reason != c.reason {
			t.Errorf("%s: %s answered %q (%s), want %q", c.stage, c.name, r.reason, dns.RcodeToString[r.rcode], c.reason)
		}
	}
	// Forward: the upstream does not answer.
	if r := ask("up.example.com", dns.TypeA, 5353); r.reason != ReasonUpstream {
		t.Errorf("forward: reason %q, want %q", r.reason, ReasonUpstream)
	}
	// Rate limit: the sandbox's burst is spent by now.
	if r := ask("late.example.com", dns.TypeA, 5353); r.reason != ReasonRateLimited {
		t.Errorf("ratelimit: reason %q, want %q", r.reason, ReasonRateLimited)
	}
}
