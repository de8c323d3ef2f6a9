package dnsproxy

import (
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// TestCaseNotForwarded: the letter case of an allowed name (which DNS
// ignores) could carry bits to the attacker's authoritative server; the
// proxy forwards the name it judged, in lower case, and the client still
// gets its own question back.
func TestCaseNotForwarded(t *testing.T) {
	up := startUpstream(t)
	_, addr := startProxy(t, Config{Upstreams: []string{up.addr}, Policy: policyOf(map[string]*SandboxPolicy{"sb": allowOnly(".example.com")})})
	for _, name := range []string{"WwW.eXaMpLe.CoM", "wWw.ExAmPlE.cOm", "MAIL.example.com"} {
		r := query(t, addr, name, dns.TypeA)
		if r.Rcode != dns.RcodeSuccess || len(r.Answer) == 0 || r.Question[0].Name != dns.Fqdn(name) {
			t.Errorf("%s: %s, question %v", name, dns.RcodeToString[r.Rcode], r.Question)
		}
	}
	for _, seen := range up.seen() {
		if seen != strings.ToLower(seen) {
			t.Errorf("upstream saw %q: the client's case reached it", seen)
		}
	}
}

// TestRareTypesAndPayload: NULL and private-use types are never served,
// TXT and other rare types have a small per-sandbox budget (another
// sandbox and A queries are untouched), and a client's large EDNS buffer
// does not make UDP answers larger than 1232 bytes.
func TestRareTypesAndPayload(t *testing.T) {
	up := startUpstream(t)
	clock := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	s, err := New(Config{HostAddrs: noHostAddrs, Upstreams: []string{up.addr}, Now: clock.Now,
		Listeners: []Listener{{Addr: "127.0.0.1:0", Sandbox: "sb"}, {Addr: "127.0.0.1:0", Sandbox: "other"}},
		Policy: policyOf(map[string]*SandboxPolicy{
			"sb":    {Allow: []string{".example.com"}, RareTypes: RateLimit{QPS: 0.1, Burst: 5}, Detection: Detection{Mode: "off"}},
			"other": {Allow: []string{".example.com"}, Detection: Detection{Mode: "off"}},
		})})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	addr, other := strings.TrimPrefix(s.Addrs()[0], "udp:"), strings.TrimPrefix(s.Addrs()[1], "udp:")

	for _, qt := range []uint16{dns.TypeNULL, 0xff01} {
		r := query(t, addr, "t.example.com", qt)
		if code, text, _ := ede(r); (r.Rcode != dns.RcodeNotImplemented && r.Rcode != dns.RcodeRefused) || text != ReasonQType || code != dns.ExtendedErrorCodeProhibited {
			t.Errorf("type %d: %s EDE %d %q", qt, dns.RcodeToString[r.Rcode], code, text)
		}
	}
	refused := 0
	for i := range 8 {
		r := tcpQuery(t, addr, "t"+string(rune('a'+i))+".example.com", dns.TypeTXT)
		if r.Rcode == dns.RcodeRefused {
			if _, text, _ := ede(r); text != ReasonRareType {
				t.Errorf("refused TXT: EDE %q", text)
			}
			refused++
		}
	}
	if refused != 3 {
		t.Errorf("%d of 8 TXT queries refused with a burst of 5, want 3", refused)
	}
	forwarded := map[string]bool{}
	for _, n := range up.seen() {
		if len(n) == len("ta.example.com.") && n[0] == 't' {
			forwarded[n] = true
		}
	}
	if len(forwarded) != 5 {
		t.Errorf("upstream saw %d TXT names, want 5: %v", len(forwarded), forwarded)
	}
	if r := query(t, addr, "www.example.com", dns.TypeA); r.Rcode != dns.RcodeSuccess {
		t.Errorf("A query after the TXT budget: %s", dns.RcodeToString[r.Rcode])
	}
	if r := tcpQuery(t, other, "tz.example.com", dns.TypeTXT); r.Rcode != dns.RcodeSuccess {
		t.Errorf("other sandbox's TXT: %s", dns.RcodeToString[r.Rcode])
	}
	clock.Advance(10 * time.Second) // one token back
	if r := tcpQuery(t, addr, "ty.example.com", dns.TypeTXT); r.Rcode != dns.RcodeSuccess {
		t.Errorf("TXT after the bucket refilled: %s", dns.RcodeToString[r.Rcode])
	}

	// A 4 kB TXT answer over UDP to a client advertising 65535 bytes.
	m := new(dns.Msg)
	m.SetQuestion("big.example.com.", dns.TypeTXT)
	m.SetEdns0(65535, false)
	c := &dns.Client{Net: "udp", UDPSize: 65535, Timeout: 3 * time.Second}
	clock.Advance(time.Minute)
	r, _, err := c.Exchange(m, other)
	if err != nil {
		t.Fatal(err)
	}
	r.Compress = true
	if wire, _ := r.Pack(); len(wire) > 1232 || !r.Truncated {
		t.Errorf("UDP answer of %d bytes (truncated %v), want at most 1232 and truncated", len(wire), r.Truncated)
	}
}

func tcpQuery(t *testing.T, addr, name string, qtype uint16) *dns.Msg {
	t.Helper()
	return queryNet(t, "tcp", addr, name, qtype)
}
