package dnsproxy

import (
	"strings"

	"github.com/watcherhq/watcher/internal/audit"
)

// detectStage is the chain's "detect" stage (its place, and why: chain in chain.go).
func detectStage(s *Server, r *request) bool {
	sb := r.sandbox
	if sb.mode == "off" || r.probe {
		// The canary's probe tests the policy alone (Config.OwnProbe).
		if r.notAllowed {
			return s.block(r, ReasonNotAllowed, audit.SeverityRoutine)
		}
		return false
	}
	r.info = s.names.analyze(r.q.Name)
	if r.info.dgaLike {
		s.stats.dgaLike.Add(1)
	}
	// Only a query that reaches the upstream can carry anything to a
	// domain's servers: the channel model charges those (channel.go).
	forwarded := false
	if !r.notAllowed {
		r.cachedT = s.cache.get(cacheKey{strings.ToLower(r.q.Name), r.q.Qtype}, r.now)
		r.cacheLooked = true
		forwarded = r.cachedT == nil
	}
	cut, streamReason, alert := r.state.observeQuery(sb, &r.info, queryFacts{qtype: r.q.Qtype, listed: r.listed, forwarded: forwarded}, r.now)
	r.alert = alert
	reason := r.info.encoded
	if cut {
		if streamReason != "" && r.info.encoded == "" {
			reason = streamReason
		}
		s.stats.domainsCut.Add(1)
	}
	if reason != "" {
		if sb.mode == "record" && !r.notAllowed {
			// Record mode: let it through, but leave an alert behind.
			s.wouldRefuse(r, reason, audit.SeverityAlert)
			return false
		}
		return s.block(r, reason, audit.SeverityAlert)
	}
	if r.notAllowed {
		return s.block(r, ReasonNotAllowed, audit.SeverityRoutine)
	}
	return false
}
