package dnsproxy

import (
	"strings"

	"github.com/miekg/dns"
)

// sandboxStage is the chain's "sandbox" stage (its place, and why: chain in chain.go).
func sandboxStage(s *Server, r *request) bool {
	r.policy = s.policy.Load()
	name, ok := s.sandboxes.Sandbox(r.src)
	if ok {
		r.sandbox = r.policy.sandboxes[name]
	}
	if r.sandbox == nil {
		return s.reply(r, dns.RcodeRefused, ReasonNoSandbox)
	}
	r.state = s.sandboxState(r.sandbox.name)
	if s.cfg.OwnProbe != nil {
		r.probe = s.cfg.OwnProbe(r.src, strings.ToLower(strings.TrimSuffix(r.q.Name, ".")))
	}
	return false
}
