package dnsproxy

import (
	"strings"

	"github.com/watcherhq/watcher/internal/audit"
)

// policyStage is the chain's "policy" stage (its place, and why: chain in chain.go).
func policyStage(s *Server, r *request) bool {
	name := strings.ToLower(strings.TrimSuffix(r.q.Name, "."))
	sb := r.sandbox
	if sb.deny.match(name) {
		if sb.recordOnly {
			s.wouldRefuse(r, ReasonDenied, audit.SeverityRoutine)
			return false
		}
		return s.block(r, ReasonDenied, audit.SeverityRoutine)
	}
	r.listed = sb.allow.match(name)
	r.notAllowed = !sb.defaultAllow && !r.listed
	if r.notAllowed && sb.recordOnly {
		// Record mode: forwarded like an allowed name, recorded as the
		// refusal it would have been.
		r.notAllowed = false
		s.wouldRefuse(r, ReasonNotAllowed, audit.SeverityRoutine)
	}
	return false
}

// wouldRefuse marks r as recorded with reason: it goes on, and its event
// says what enforcement would have refused.
func (s *Server) wouldRefuse(r *request, reason string, sev audit.Severity) {
	s.stats.recorded.Add(1)
	r.reason = reason
	r.verdict = audit.VerdictRecorded
	r.severity = sev
}
