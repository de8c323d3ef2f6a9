package dnsproxy

import (
	"github.com/miekg/dns"
)

// parseStage is the chain's "parse" stage (its place, and why: chain in chain.go).
func parseStage(s *Server, r *request) bool {
	raw := r.raw
	if len(raw) < 12 || raw[2]&0x80 != 0 {
		// No room for an ID to answer, or a response (answering could loop).
		s.stats.dropped.Add(1)
		r.resp = nil
		r.rcode = -1
		return true
	}
	if len(raw) > 4096 {
		// No sane query is this large.
		return s.headerOnly(r, dns.RcodeFormatError, ReasonMalformed)
	}
	if opcode := int(raw[2]>>3) & 0xf; opcode != dns.OpcodeQuery {
		return s.headerOnly(r, dns.RcodeNotImplemented, ReasonOpcode)
	}
	if !r.parseFast() {
		if done := s.parseFull(r); done {
			return true
		}
	}
	if r.q.Qclass != dns.ClassINET {
		return s.reply(r, dns.RcodeRefused, ReasonClass)
	}
	switch r.q.Qtype {
	case dns.TypeANY, dns.TypeMAILA, dns.TypeMAILB:
		return s.reply(r, dns.RcodeNotImplemented, ReasonQType)
	case dns.TypeAXFR, dns.TypeIXFR:
		return s.reply(r, dns.RcodeRefused, ReasonQType)
	case dns.TypeOPT, dns.TypeTSIG, dns.TypeTKEY, dns.TypeNone:
		return s.reply(r, dns.RcodeFormatError, ReasonQType)
	case dns.TypeNULL:
		// Arbitrary binary answers: iodine's favourite, no client needs it.
		return s.reply(r, dns.RcodeNotImplemented, ReasonQType)
	}
	if r.q.Qtype >= 0xff00 && r.q.Qtype <= 0xfffe {
		// Private-use types: nothing public answers them.
		return s.reply(r, dns.RcodeRefused, ReasonQType)
	}
	return false
}

// clampUDPSize bounds the UDP answer size a client advertises to what the
// proxy serves (1232, the DNS flag day size): a large EDNS buffer would let
// one TXT answer carry kilobytes back into the sandbox; TCP still gets the
// whole answer, one connection per query.
func clampUDPSize(n int) int { return min(max(n, 512), ednsUDPSize) }

// parseFull decodes the query with miekg/dns and checks what the fast path
// did not: it handles every query the fast path declines.
func (s *Server) parseFull(r *request) bool {
	raw := r.raw
	if err := r.msg.Unpack(raw); err != nil {
		return s.headerOnly(r, dns.RcodeFormatError, ReasonMalformed)
	}
	m := &r.msg
	if len(m.Question) != 1 || len(m.Answer) != 0 || len(m.Ns) != 0 {
		return s.headerOnly(r, dns.RcodeFormatError, ReasonMalformed)
	}
	r.q = m.Question[0]
	r.udpSize = 512
	var opts int
	for _, rr := range m.Extra {
		switch rr.Header().Rrtype {
		case dns.TypeOPT:
			opts++
		default:
			// TSIG/SIG(0) we cannot verify, or junk: refuse rather than
			// forward something we do not understand.
			return s.reply(r, dns.RcodeRefused, ReasonMalformed)
		}
	}
	if opts > 1 {
		return s.headerOnly(r, dns.RcodeFormatError, ReasonMalformed)
	}
	if opt := m.IsEdns0(); opt != nil {
		if opt.Hdr.Name != "." {
			return s.headerOnly(r, dns.RcodeFormatError, ReasonMalformed)
		}
		r.edns = true
		if opt.Version() != 0 {
			return s.reply(r, dns.RcodeBadVers, ReasonEDNSVersion)
		}
		r.udpSize = clampUDPSize(int(opt.UDPSize()))
	}
	if end, err := skipName(raw, 12); err == nil && raw[end-1] == 0 {
		r.qnameEnd = end
	}
	return false
}

// parseFast decodes the common query shape without miekg/dns: one
// question with an uncompressed name of hostname bytes, nothing in answer
// and authority, at most one well-formed version-0 OPT record, nothing
// after it. Anything else returns false and goes the full way.
func (r *request) parseFast() bool {
	raw := r.raw
	if len(raw) < 17 || raw[4] != 0 || raw[5] != 1 || raw[6]|raw[7]|raw[8]|raw[9]|raw[10] != 0 || raw[11] > 1 {
		return false
	}
	var name [256]byte
	n := 0
	off := 12
	for {
		if off >= len(raw) {
			return false
		}
		l := int(raw[off])
		if l == 0 {
			off++
			break
		}
		if l > 63 || off+1+l > len(raw) || n+l+1 > 254 {
			return false
		}
		for _, c := range raw[off+1 : off+1+l] {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
		n += copy(name[n:], raw[off+1:off+1+l])
		name[n] = '.'
		n++
		off += 1 + l
	}
	if n == 0 || off+4 > len(raw) {
		return false
	}
	r.qnameEnd = off
	qtype := uint16(raw[off])<<8 | uint16(raw[off+1])
	qclass := uint16(raw[off+2])<<8 | uint16(raw[off+3])
	off += 4
	r.udpSize = 512
	if raw[11] == 1 {
		// OPT: root name, type 41, class = UDP size, TTL = ext-rcode,
		// version, flags; rdata a chain of (code, length, data).
		if off+11 > len(raw) || raw[off] != 0 || raw[off+1] != 0 || raw[off+2] != 41 || raw[off+6] != 0 {
			return false
		}
		r.udpSize = clampUDPSize(int(raw[off+3])<<8 | int(raw[off+4]))
		rdlen := int(raw[off+9])<<8 | int(raw[off+10])
		off += 11
		if off+rdlen != len(raw) {
			return false
		}
		for o := off; o < len(raw); {
			if o+4 > len(raw) {
				return false
			}
			o += 4 + (int(raw[o+2])<<8 | int(raw[o+3]))
			if o > len(raw) {
				return false
			}
		}
		r.edns = true
		off = len(raw)
	}
	if off != len(raw) {
		return false
	}
	r.q = dns.Question{Name: string(name[:n]), Qtype: qtype, Qclass: qclass}
	r.qs[0] = r.q
	r.msg.Id = uint16(raw[0])<<8 | uint16(raw[1])
	r.msg.RecursionDesired = raw[2]&0x01 != 0
	r.msg.CheckingDisabled = raw[3]&0x10 != 0
	r.msg.Opcode = dns.OpcodeQuery
	r.msg.Question = r.qs[:]
	return true
}
