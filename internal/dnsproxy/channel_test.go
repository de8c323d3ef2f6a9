package dnsproxy

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// TestChannelCharges: what the symbol model charges a forwarded query. A
// uniform choice among 256 known names costs about 8 bits, the one name a
// stub asks again almost nothing, renewals in expiry order nothing, the
// same renewals in a chosen order about what the order carries, and a type
// outside the web clients' at least uncommonTypeBits.
func TestChannelCharges(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	var c channelState
	const n = 256
	for i := range n {
		c.charge(symbolHash(fmt.Sprint("n", i), dns.TypeA), dns.TypeA, true, 20, now)
		now = now.Add(25 * time.Millisecond)
	}
	total := 0.0
	x := uint32(1)
	for range 4000 {
		x = x*1664525 + 1013904223
		total += c.charge(symbolHash(fmt.Sprint("n", int(x>>16)%n), dns.TypeA), dns.TypeA, false, 0, now)
		now = now.Add(25 * time.Millisecond)
	}
	if avg := total / 4000; avg < 7.5 || avg > 9 {
		t.Errorf("uniform choice among %d names: %.2f bits a query, want about 8", n, avg)
	}

	var one channelState
	one.charge(symbolHash("www", dns.TypeA), dns.TypeA, true, 20, now)
	repeat := 0.0
	for i := range 1000 {
		now = now.Add(time.Second)
		b := one.charge(symbolHash("www", dns.TypeA), dns.TypeA, false, 0, now)
		if i >= 10 {
			repeat += b
		}
	}
	if repeat > 1 {
		t.Errorf("one name asked 1000 times (TTL 0): %.2f bits after the first 10, want almost nothing", repeat)
	}

	// 40 names with a 30 s TTL, asked again as each answer expires.
	renew := func(order func(round, i int) int) float64 {
		var r channelState
		t0 := now
		bits := 0.0
		for round := range 20 {
			for k := range 40 {
				i := order(round, k)
				at := t0.Add(time.Duration(round)*30*time.Second + time.Duration(k)*100*time.Millisecond)
				h := symbolHash(fmt.Sprint("e", i), dns.TypeA)
				b := r.charge(h, dns.TypeA, round == 0, 10, at)
				if round > 0 {
					bits += b
				}
				r.answered(h, 30*time.Second, at.Add(30*time.Second))
			}
		}
		return bits
	}
	inOrder := renew(func(_, k int) int { return k })
	if inOrder > 1 {
		t.Errorf("renewals in expiry order: %.1f bits over 19 rounds, want nothing", inOrder)
	}
	perm := renew(func(round, k int) int { return (k*7 + round*13) % 40 })
	t.Logf("renewals: in order %.1f bits, permuted %.0f bits", inOrder, perm)
	// A new order each round carries up to log2(40!) = 159 bits; the
	// charge is the rank of each choice among the due renewals.
	if want := 19 * 100.0; perm < want {
		t.Errorf("renewals in a chosen order: %.0f bits over 19 rounds, want at least %.0f", perm, want)
	}

	var types channelState
	qts := []uint16{dns.TypeA, dns.TypeMX, dns.TypeNS, dns.TypeSRV}
	for _, qt := range qts {
		types.charge(symbolHash("api", qt), qt, false, 0, now)
	}
	for _, qt := range qts[1:] {
		now = now.Add(time.Second)
		if b := types.charge(symbolHash("api", qt), qt, false, 0, now); b < uncommonTypeBits {
			t.Errorf("type %s: %.2f bits, want at least %d", dns.TypeToString[qt], b, uncommonTypeBits)
		}
	}
	if b := math.Log2(float64(len(qts))); b > uncommonTypeBits {
		t.Fatalf("test assumption: %d types carry %.1f bits", len(qts), b)
	}
}

// TestCutSurvivesFlood: a sandbox cuts an allowlisted domain off, then
// floods names under thousands of unlisted domains, more than either
// domain table holds: the cut-off holds, the allowlisted domain's budget
// state is still there, and memory stays bounded.
func TestCutSurvivesFlood(t *testing.T) {
	up := startUpstream(t)
	clock := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	s, err := New(Config{HostAddrs: noHostAddrs, Upstreams: []string{up.addr}, Now: clock.Now,
		Policy: policyOf(map[string]*SandboxPolicy{"sb": allowOnly(".exfil.test", ".ok.test")})})
	if err != nil {
		t.Fatal(err)
	}
	p := &channelRig{t: t, s: s, src: evalSrc}
	p.src.ListenerSandbox = "sb"
	// Part of ok.test's budget, and a cut-off of exfil.test.
	for _, n := range []string{"alpha", "beta", "gamma"} {
		if rc, why := p.ask(n+".ok.test", dns.TypeA); rc != dns.RcodeSuccess {
			t.Fatalf("%s.ok.test: %s %s", n, dns.RcodeToString[rc], why)
		}
	}
	st := s.sandboxState("sb")
	st.mu.Lock()
	spent := st.lookup("ok.test").info.estimate(clock.Now(), 10*time.Minute)
	st.mu.Unlock()
	p.ask("68656c6c6f2c20776f726c64.exfil.test", dns.TypeA)
	p.ask("736563726574206b6579.exfil.test", dns.TypeA)
	if rc, why := p.ask("www.exfil.test", dns.TypeA); rc != dns.RcodeNameError || !strings.HasPrefix(why, ReasonEncodedStream) {
		t.Fatalf("exfil.test not cut off: %s %q", dns.RcodeToString[rc], why)
	}
	for i := range 2*maxDomainsPerSandbox + 100 {
		clock.Advance(10 * time.Millisecond)
		if rc, why := p.ask(fmt.Sprintf("www.site%d.test", i), dns.TypeA); rc != dns.RcodeNameError || why != ReasonNotAllowed {
			t.Fatalf("unlisted name %d: %s %q", i, dns.RcodeToString[rc], why)
		}
	}
	if rc, why := p.ask("www.exfil.test", dns.TypeA); rc != dns.RcodeNameError || !strings.HasPrefix(why, ReasonEncodedStream) {
		t.Errorf("after %d unlisted names exfil.test answers again: %s %q", 2*maxDomainsPerSandbox+100, dns.RcodeToString[rc], why)
	}
	st.mu.Lock()
	d := st.lookup("ok.test")
	var after float64
	if d != nil {
		after = d.info.estimate(clock.Now(), 10*time.Minute)
	}
	n, cuts := st.listed.lru.Len()+st.other.lru.Len(), len(st.cuts)
	st.mu.Unlock()
	if d == nil || after < spent*0.5 {
		t.Errorf("ok.test's budget state lost to the flood (spent %.0f bits, now %.0f)", spent, after)
	}
	if n > 2*maxDomainsPerSandbox || cuts > maxCutsPerSandbox {
		t.Errorf("%d domains and %d cut-offs held, bounds %d and %d", n, cuts, 2*maxDomainsPerSandbox, maxCutsPerSandbox)
	}
	// The cut-off ends when it expires, not before.
	clock.Advance(31 * time.Minute)
	if rc, why := p.ask("www.exfil.test", dns.TypeA); rc != dns.RcodeSuccess {
		t.Errorf("exfil.test after its cut-off expired: %s %q", dns.RcodeToString[rc], why)
	}
}

// TestCutTableFailsClosed: when the cut-off table is full of allowlisted
// domains, a new cut-off cuts the whole sandbox off instead of dropping
// one, until it expires.
func TestCutTableFailsClosed(t *testing.T) {
	st := newSandboxState()
	now := time.Unix(1_700_000_000, 0)
	for i := range maxCutsPerSandbox {
		st.cut(fmt.Sprintf("d%d.example", i), "x", true, now.Add(30*time.Minute), now)
	}
	st.cut("one-more.example", "x", true, now.Add(30*time.Minute), now)
	for _, d := range []string{"d0.example", "one-more.example", "unrelated.example"} {
		if why, cut := st.cutFor(d, now.Add(time.Minute)); !cut {
			t.Errorf("%s not cut off with the table full", d)
		} else if d != "d0.example" && why != ReasonAllCut {
			t.Errorf("%s: reason %q, want %q", d, why, ReasonAllCut)
		}
	}
	if len(st.cuts) > maxCutsPerSandbox {
		t.Errorf("%d cut-offs held, bound %d", len(st.cuts), maxCutsPerSandbox)
	}
	// Unlisted domains' cut-offs give way first.
	st2 := newSandboxState()
	for i := range maxCutsPerSandbox {
		st2.cut(fmt.Sprintf("u%d.example", i), "x", i != 7, now.Add(30*time.Minute), now)
	}
	st2.cut("listed.example", "x", true, now.Add(30*time.Minute), now)
	if _, cut := st2.cutFor("listed.example", now); !cut || now.Before(st2.allCutUntil) {
		t.Errorf("an unlisted cut-off should have made room (all cut until %v)", st2.allCutUntil)
	}
	if _, cut := st2.cutFor("u7.example", now); cut {
		t.Errorf("the unlisted cut-off is still held")
	}
}

// TestChannelAlertOnce: the query that spends a domain's budget leaves one
// alert event with the numbers beside its own; the refusals after it do
// not repeat it.
func TestChannelAlertOnce(t *testing.T) {
	auth := startAuth(t, func(string) uint32 { return 0 })
	clock := &replayClock{t: time.Unix(1_760_000_000, 0)}
	events := &eventLog{}
	s, err := New(Config{HostAddrs: noHostAddrs, Upstreams: []string{auth.addr}, Now: clock.Now, Events: events,
		Policy: channelPolicy()})
	if err != nil {
		t.Fatal(err)
	}
	c := &channelRig{t: t, s: s, auth: auth, clock: clock, src: evalSrc}
	c.src.ListenerSandbox = "sb"
	names := choiceNames("exfil.test")
	refused := 0
	x := uint32(3)
	for i := 0; i < 3000 && refused < 50; i++ {
		n := names[i%256]
		if i >= 256 {
			x = x*1664525 + 1013904223
			n = names[int(x>>16)%256]
		}
		if rc, _ := c.ask(n, dns.TypeA); rc != dns.RcodeSuccess {
			refused++
		}
		clock.t = clock.t.Add(25 * time.Millisecond)
	}
	var alerts []string
	for _, ev := range events.all() {
		if ev.Rule == "dns-channel:sb" {
			alerts = append(alerts, ev.Message)
		}
	}
	if len(alerts) != 1 {
		t.Fatalf("%d channel alerts after %d refusals, want 1: %q", len(alerts), refused, alerts)
	}
	if !strings.HasPrefix(alerts[0], "DNS channel to exfil.test over its budget: ") || !strings.Contains(alerts[0], "(budget 4800)") ||
		!strings.Contains(alerts[0], "256 symbols (name, type) in use") {
		t.Errorf("alert %q", alerts[0])
	}
}

// TestOneBudgetPerDomain: names under one domain share one state whether
// an allowlist entry or the default allowed them: an allowlisted name
// takes over the state the others built.
func TestOneBudgetPerDomain(t *testing.T) {
	sb := compilePolicy(&Policy{Sandboxes: map[string]*SandboxPolicy{"sb": {Default: "allow", Allow: []string{"api.example.com"}}}}).sandboxes["sb"]
	st := newSandboxState()
	now := time.Unix(1_700_000_000, 0)
	for i, n := range []struct {
		name   string
		listed bool
	}{{"www.example.com", false}, {"api.example.com", true}, {"cdn.example.com", false}} {
		info := analyzeName(n.name)
		st.observeQuery(sb, &info, queryFacts{qtype: dns.TypeA, listed: n.listed, forwarded: true}, now.Add(time.Duration(i)*time.Second))
	}
	if n := st.domainCount(); n != 1 {
		t.Fatalf("%d domain states for example.com, want 1", n)
	}
	if d := st.lookup("example.com"); d == nil || d.queries != 3 || st.listed.m["example.com"] == nil {
		t.Errorf("example.com's state: %+v, in the allowlisted table: %v", d, st.listed.m["example.com"] != nil)
	}
}
