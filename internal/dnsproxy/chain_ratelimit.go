package dnsproxy

import (
	"github.com/miekg/dns"
)

// rateLimitStage is the chain's "ratelimit" stage (its place, and why: chain in chain.go).
func rateLimitStage(s *Server, r *request) bool {
	if !r.probe && !r.state.allow(r.sandbox.rate, r.now) {
		s.stats.rateLimited.Add(1)
		return s.reply(r, dns.RcodeRefused, ReasonRateLimited)
	}
	return false
}
