package dnsproxy

import "strings"

// NameListed reports whether the sandbox's allow list names name (and its
// deny list does not): the name binding of connections (internal/namerelay)
// lets a connection carry such a name to any address the sandbox may
// reach. A default-allow policy lists nothing: there only names the proxy
// answered for the address pass.
func (s *Server) NameListed(sandbox, name string) bool {
	p := s.policy.Load()
	if p == nil {
		return false
	}
	sb := p.sandboxes[sandbox]
	if sb == nil {
		return false
	}
	name = strings.ToLower(strings.TrimSuffix(name, "."))
	return !sb.deny.match(name) && sb.allow.match(name)
}
