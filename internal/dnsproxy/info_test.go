package dnsproxy

import (
	"fmt"
	"testing"
	"time"
)

// TestInfoStateBounded: a sandbox streaming unique names under many
// domains keeps at most maxDomainsPerSandbox domains, and per domain at
// most the dictionary bounds, whatever it sends; the estimate keeps
// counting past the bounds (unremembered heads and tokens cost in full).
func TestInfoStateBounded(t *testing.T) {
	sb := compilePolicy(&Policy{Sandboxes: map[string]*SandboxPolicy{"sb": {Default: "allow"}}}).sandboxes["sb"]
	sb.limits.infoBits = 1e12 // never cut: measure the state alone
	st := newSandboxState()
	now := time.Unix(1_700_000_000, 0)
	for d := range maxDomainsPerSandbox + 100 {
		for i := range 3 {
			info := analyzeName(fmt.Sprintf("n%d-x%d.d%d.example%d.com", i, d, d, d))
			st.observeQuery(sb, &info, queryFacts{qtype: 1, forwarded: true}, now)
		}
	}
	if n := st.domainCount(); n != maxDomainsPerSandbox {
		t.Errorf("%d domains kept, want %d", n, maxDomainsPerSandbox)
	}
	var before float64
	for i := range 3 * maxInfoNames {
		info := analyzeName(fmt.Sprintf("a%x-b%x.c%x.big.example.org", i*7919, i*104729, i))
		st.observeQuery(sb, &info, queryFacts{qtype: 1, forwarded: true}, now.Add(time.Duration(i)*time.Millisecond))
	}
	d := st.lookup("example.org")
	if len(d.info.names) > maxInfoNames || len(d.info.tokens) > maxInfoTokens || len(d.info.recent) > recentTokens || len(d.names) > maxStreamNames+1 {
		t.Errorf("domain state beyond its bounds: %d names, %d tokens, %d recent, %d stream names",
			len(d.info.names), len(d.info.tokens), len(d.info.recent), len(d.names))
	}
	before = d.info.estimate(now.Add(time.Second), sb.limits.infoWindow)
	info := analyzeName("zz-unremembered.big.example.org")
	st.observeQuery(sb, &info, queryFacts{qtype: 1, forwarded: true}, now.Add(2*time.Second))
	if after := d.info.estimate(now.Add(2*time.Second), sb.limits.infoWindow); after <= before {
		t.Errorf("estimate stopped growing past the bounds: %.0f then %.0f", before, after)
	}
}
