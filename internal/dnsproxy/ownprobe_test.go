package dnsproxy

import (
	"fmt"
	"strings"
	"testing"

	"github.com/miekg/dns"
)

// TestOwnProbeChargesNothing: the agent's canary probes (Config.OwnProbe)
// are judged by the policy alone. Fifty of them leave the sandbox's rate
// bucket and detection state as they were; and a sandbox whose rate limit
// and information budget under the probes' domain are spent still gets the
// policy's verdict for a probe ("not on allowlist"), while its own query
// beside it is refused for the spent budget.
func TestOwnProbeChargesNothing(t *testing.T) {
	up := startUpstream(t)
	pol := policyOf(map[string]*SandboxPolicy{"sb": {
		Allow:     []string{".example.com"},
		RateLimit: RateLimit{QPS: 0.001, Burst: 60},
		Detection: Detection{MaxInfoBits: 300},
	}})
	isProbe := func(_ QuerySource, name string) bool { return strings.HasSuffix(name, ".canary.watcher.invalid") }
	s, addr := startProxy(t, Config{Upstreams: []string{up.addr}, Policy: pol, OwnProbe: isProbe})
	st := s.sandboxState("sb")

	probe := func(i int) {
		t.Helper()
		name := fmt.Sprintf("c%012x.canary.watcher.invalid", uint64(i)*0x9e3779b97f4a7c15>>16)
		r := query(t, addr, name, dns.TypeA)
		code, text, _ := ede(r)
		if r.Rcode != dns.RcodeNameError || code != dns.ExtendedErrorCodeFiltered || text != ReasonNotAllowed {
			t.Fatalf("probe %s: %s, EDE %d %q; want NXDOMAIN, not on allowlist", name, dns.RcodeToString[r.Rcode], code, text)
		}
	}
	for i := range 50 {
		probe(i)
	}
	st.mu.Lock()
	tokens, domains := st.all.tokens, st.listed.lru.Len()+st.other.lru.Len()
	st.mu.Unlock()
	// A bucket no query took from is empty and unstarted (it is filled
	// by the first take); no domain is tracked.
	if tokens != 0 || domains != 0 {
		t.Fatalf("after 50 probes: %v tokens in the rate bucket, %d domains tracked; want both untouched", tokens, domains)
	}

	// The sandbox itself spends its information budget under
	// watcher.invalid, then its rate limit.
	cut := false
	for i := 0; i < 59 && !cut; i++ {
		r := query(t, addr, fmt.Sprintf("q%016x.watcher.invalid", uint64(i+1)*0xbf58476d1ce4e5b9), dns.TypeA)
		_, text, _ := ede(r)
		cut = strings.HasPrefix(text, ReasonInfoBudget)
	}
	if !cut {
		t.Fatal("the sandbox's random names under watcher.invalid never spent its information budget")
	}
	probe(100)
	r := query(t, addr, "again.watcher.invalid", dns.TypeA)
	if _, text, _ := ede(r); text != ReasonInfoBudget+" under watcher.invalid" {
		t.Errorf("the sandbox's own query beside the probe: %q, want the spent budget", text)
	}
	for i := 0; i < 100; i++ {
		if r := query(t, addr, "www.example.com", dns.TypeA); r.Rcode == dns.RcodeRefused {
			break
		}
	}
	if _, text, _ := ede(query(t, addr, "www.example.com", dns.TypeA)); text != ReasonRateLimited {
		t.Fatalf("allowed name after the burst: %q, want rate limited", text)
	}
	probe(101)
}
