package dnsproxy

import (
	"strings"

	"github.com/miekg/dns"
)

// nameStage is the chain's "name" stage (its place, and why: chain in chain.go).
func nameStage(s *Server, r *request) bool {
	name := r.q.Name
	if name == "." {
		return s.reply(r, dns.RcodeRefused, ReasonNotAllowed)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.' {
			continue
		}
		// miekg/dns writes dots inside labels, non-ASCII and other bytes as
		// escapes, so any other byte means the name is not a hostname.
		r.info = analyzeInvalidName(name)
		if r.sandbox.mode != "off" && !r.probe {
			// Refused here, never forwarded: new bits only.
			if cut, _, _ := r.state.observeQuery(r.sandbox, &r.info, queryFacts{qtype: r.q.Qtype}, r.now); cut {
				s.stats.domainsCut.Add(1)
			}
		}
		return s.reply(r, dns.RcodeRefused, ReasonInvalidBytes)
	}
	return false
}

// analyzeInvalidName finds the tracking domain of a name with escaped bytes
// from its trailing clean labels, and marks it encoded.
func analyzeInvalidName(name string) nameInfo {
	name = strings.TrimSuffix(name, ".")
	clean := name
	if i := strings.LastIndexByte(name, '\\'); i >= 0 {
		clean = name[i+1:]
		if j := strings.IndexByte(clean, '.'); j >= 0 {
			clean = clean[j+1:]
		} else {
			clean = ""
		}
	}
	info := nameInfo{name: strings.ToLower(name), encoded: ReasonInvalidBytes}
	info.domain, _ = trackingDomain(strings.ToLower(clean))
	if info.domain != "" && len(info.name) > len(info.domain) {
		info.head = info.name[:len(info.name)-len(info.domain)-1]
	}
	return info
}
