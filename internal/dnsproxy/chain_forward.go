package dnsproxy

import (
	"strings"

	"github.com/miekg/dns"
)

// forwardStage is the chain's "forward" stage (its place, and why: chain in chain.go).
func forwardStage(s *Server, r *request) bool {
	// Forward exactly the name that was judged: in lower case, so the
	// client's letter case (which DNS ignores) cannot carry bits to the
	// name's authoritative server.
	m, err := s.fwd.resolve(r.ctx, strings.ToLower(r.q.Name), r.q.Qtype)
	if err != nil {
		s.stats.upstreamErrors.Add(1)
		return s.servfail(r, ReasonUpstream)
	}
	t, err := newTemplate(m, r.now)
	if err != nil {
		s.stats.upstreamErrors.Add(1)
		return s.servfail(r, ReasonUpstream)
	}
	s.cache.put(cacheKey{strings.ToLower(r.q.Name), r.q.Qtype}, t)
	if (m.Rcode == dns.RcodeSuccess || m.Rcode == dns.RcodeNameError) && !r.probe {
		r.state.observeAnswer(r.sandbox, r.info.domain, m.Rcode, r.now)
	}
	if r.info.domain != "" && !r.probe && r.sandbox.mode != "off" {
		r.state.answered(r.info.domain, r.info.head, r.q.Qtype, t.expires.Sub(t.stored), t.expires)
	}
	s.answerFromTemplate(r, t)
	return true
}
