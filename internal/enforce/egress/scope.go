package egress

import (
	"strings"
	"time"
)

// DefaultAdmissionCap is how long an answer admits its addresses at most
// (before the grace) when the policy sets no cap: an attacker's server
// answers with the TTL it likes, up to 68 years.
const DefaultAdmissionCap = 5 * time.Minute

// Scope is what one sandbox's allowed answers open: for how long at most,
// and on which ports for which names.
type Scope struct {
	// Cap bounds the TTL an answer admits its addresses for; 0 means
	// DefaultAdmissionCap.
	Cap time.Duration
	// Default is what every answered address is open on; nil means
	// WebPorts (TCP 80 and 443).
	Default []PortSpan
	// Names add spans for the answers of some names.
	Names []NameSpans
}

// NameSpans opens Spans for the answers of names Pattern matches:
// "example.com" that name, "*.example.com" the names below it,
// ".example.com" both.
type NameSpans struct {
	Pattern string
	Spans   []PortSpan
}

// TTL is the admission time of an answer with ttl.
func (s *Scope) TTL(ttl time.Duration) time.Duration {
	limit := DefaultAdmissionCap
	if s != nil && s.Cap > 0 {
		limit = s.Cap
	}
	return min(ttl, limit)
}

// Spans is what an answer for name (any case, trailing dot optional)
// opens: the default spans and those of every entry that matches it.
func (s *Scope) Spans(name string) []PortSpan {
	if s == nil {
		return WebPorts
	}
	out := s.Default
	if out == nil {
		out = WebPorts
	}
	name = strings.ToLower(strings.TrimSuffix(name, "."))
	extra := false
	for _, n := range s.Names {
		if !matchName(n.Pattern, name) {
			continue
		}
		if !extra {
			out = append([]PortSpan(nil), out...)
			extra = true
		}
		out = append(out, n.Spans...)
	}
	return out
}

func matchName(pattern, name string) bool {
	p := strings.ToLower(strings.TrimSuffix(pattern, "."))
	switch {
	case strings.HasPrefix(p, "*."):
		return strings.HasSuffix(name, p[1:])
	case strings.HasPrefix(p, "."):
		return name == p[1:] || strings.HasSuffix(name, p)
	}
	return name == p
}
