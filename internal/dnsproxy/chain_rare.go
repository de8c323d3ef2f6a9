package dnsproxy

import (
	"github.com/miekg/dns"
)

// rareType reports query types ordinary clients seldom ask (TXT and
// everything not on the list of address, service and DNSSEC types): they
// carry the most data per answer, so each sandbox gets a small budget.
func rareType(qtype uint16) bool {
	switch qtype {
	case dns.TypeA, dns.TypeAAAA, dns.TypeCNAME, dns.TypePTR, dns.TypeMX, dns.TypeSRV, dns.TypeNS,
		dns.TypeSOA, dns.TypeHTTPS, dns.TypeSVCB, dns.TypeCAA, dns.TypeDS, dns.TypeDNSKEY, dns.TypeTLSA,
		dns.TypeNAPTR:
		return false
	}
	return true
}

// rareStage spends the sandbox's budget of rare-type queries, for names
// that would be answered (after policy and detection, so refused names
// cost nothing and say why they were refused).
func rareStage(s *Server, r *request) bool {
	if rareType(r.q.Qtype) && !r.probe && !r.state.allowRare(r.sandbox.rare, r.now) {
		s.stats.rateLimited.Add(1)
		return s.reply(r, dns.RcodeRefused, ReasonRareType)
	}
	return false
}
