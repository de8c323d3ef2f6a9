package dnsproxy

import (
	"strings"
)

// cacheStage is the chain's "cache" stage (its place, and why: chain in chain.go).
func cacheStage(s *Server, r *request) bool {
	t := r.cachedT
	if !r.cacheLooked {
		t = s.cache.get(cacheKey{strings.ToLower(r.q.Name), r.q.Qtype}, r.now)
	}
	if t == nil {
		s.stats.cacheMisses.Add(1)
		return false
	}
	s.stats.cacheHits.Add(1)
	r.cached = true
	s.answerFromTemplate(r, t)
	return true
}
