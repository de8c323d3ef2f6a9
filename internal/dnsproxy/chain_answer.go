package dnsproxy

import (
	"strings"
	"time"

	"github.com/miekg/dns"
	"github.com/watcherhq/watcher/internal/audit"
)

func (s *Server) answerFromTemplate(r *request, t *answerTemplate) {
	addrs := t.addrs
	if len(addrs) > 0 {
		// DNS rebinding: a local address in the answer opens a host or
		// cloud service to the sandbox unless its policy allows that range.
		refused, kind, public := s.localVerdict(r.sandbox, addrs, r.now)
		if refused.IsValid() {
			r.answers = t.answers
			if r.sandbox.mode != "record" {
				s.block(r, ReasonLocalAnswer+": "+refused.String()+" ("+kind+")", audit.SeverityAlert)
				return
			}
			s.stats.recorded.Add(1)
			r.reason = ReasonLocalAnswer + ": " + refused.String() + " (" + kind + ")"
			r.verdict = audit.VerdictRecorded
			r.severity = audit.SeverityAlert
		}
		addrs = public
	}
	r.rcode = t.rcode
	if r.verdict == "" {
		r.verdict = audit.VerdictAllowed
		r.severity = audit.SeverityRoutine
	}
	r.answers = t.answers
	if t.rcode == dns.RcodeSuccess && len(addrs) > 0 && s.cfg.OnAnswer != nil {
		ttl := t.addrTTL
		if age := uint32(r.now.Sub(t.stored) / time.Second); ttl > age {
			ttl -= age
		} else {
			ttl = 0
		}
		s.cfg.OnAnswer(Answer{Sandbox: r.sandbox.name, Name: strings.ToLower(r.q.Name), Addrs: addrs, TTL: ttl})
	}
	maxSize := 65535
	if r.src.Proto != "tcp" {
		maxSize = r.udpSize
	}
	if out := t.render(r.out, r.raw, r.qnameEnd, r.edns, r.now, maxSize); out != nil {
		r.resp = out
		return
	}
	// Too big for the client's UDP size: truncate the slow way.
	var m dns.Msg
	if err := m.Unpack(t.wire); err != nil {
		s.servfail(r, ReasonUpstream)
		return
	}
	m.Id = r.msg.Id
	m.RecursionDesired = r.msg.RecursionDesired
	m.Question = r.msg.Question
	if r.edns {
		m.SetEdns0(ednsUDPSize, false)
	}
	m.Truncate(maxSize)
	out, err := m.PackBuffer(r.out)
	if err != nil {
		s.servfail(r, ReasonUpstream)
		return
	}
	r.resp = out
}

// headerOnly answers with just the query's header (no question), for
// queries too broken to echo.
func (s *Server) headerOnly(r *request, rcode int, reason string) bool {
	out := append(r.out[:0], r.raw[:12]...)
	out[2] = 0x80 | out[2]&0x79 // QR, keep opcode and RD
	out[3] = byte(rcode & 0xf)
	for i := 4; i < 12; i++ {
		out[i] = 0
	}
	r.resp = out
	s.countRcode(r, rcode, reason)
	return true
}

// reply answers with rcode, the question echoed and, when the client used
// EDNS, an OPT record (with an Extended DNS Error for refusals).
func (s *Server) reply(r *request, rcode int, reason string) bool {
	m := s.replyMsg(r, rcode)
	if r.edns {
		opt := m.IsEdns0()
		if code, ok := edeFor(rcode, reason); ok {
			opt.Option = append(opt.Option, &dns.EDNS0_EDE{InfoCode: code, ExtraText: reason})
		}
	}
	s.pack(r, m)
	s.countRcode(r, rcode, reason)
	return true
}

func edeFor(rcode int, reason string) (uint16, bool) {
	switch reason {
	case ReasonRateLimited, ReasonRareType, ReasonNoSandbox, ReasonClass, ReasonQType:
		return dns.ExtendedErrorCodeProhibited, true
	case ReasonInvalidBytes:
		return dns.ExtendedErrorCodeBlocked, true
	case ReasonUpstream:
		return dns.ExtendedErrorCodeNetworkError, true
	}
	if rcode == dns.RcodeRefused {
		return dns.ExtendedErrorCodeProhibited, true
	}
	return 0, false
}

func (s *Server) replyMsg(r *request, rcode int) *dns.Msg {
	m := new(dns.Msg)
	m.Id = r.msg.Id
	m.Response = true
	m.Opcode = dns.OpcodeQuery
	m.RecursionDesired = r.msg.RecursionDesired
	m.RecursionAvailable = true
	m.CheckingDisabled = r.msg.CheckingDisabled
	m.Rcode = rcode
	m.Question = r.msg.Question
	if r.edns {
		m.SetEdns0(ednsUDPSize, false)
		if rcode > 0xf {
			// Extended RCODE: miekg/dns splits it between header and OPT.
			m.Rcode = rcode
		}
	}
	return m
}

// block answers NXDOMAIN as if the name did not exist: question echoed, an
// SOA in the authority section with a short negative TTL, and an RFC 8914
// Extended DNS Error saying why.
func (s *Server) block(r *request, reason string, sev audit.Severity) bool {
	if out := r.blockWire(reason); out != nil {
		r.resp = out
		r.verdict = audit.VerdictDenied
		r.severity = sev
		s.countRcode(r, dns.RcodeNameError, reason)
		return true
	}
	m := s.replyMsg(r, dns.RcodeNameError)
	ttl := r.policy.negativeTTL
	zone := r.info.domain
	if zone == "" {
		zone, _ = trackingDomain(strings.ToLower(strings.TrimSuffix(r.q.Name, ".")))
	}
	m.Ns = []dns.RR{&dns.SOA{
		Hdr:     dns.RR_Header{Name: dns.Fqdn(zone), Rrtype: dns.TypeSOA, Class: dns.ClassINET, Ttl: ttl},
		Ns:      "blocked.watcher.invalid.",
		Mbox:    "hostmaster.watcher.invalid.",
		Serial:  1,
		Refresh: 3600,
		Retry:   600,
		Expire:  86400,
		Minttl:  ttl,
	}}
	if r.edns {
		code := uint16(dns.ExtendedErrorCodeBlocked)
		if reason == ReasonNotAllowed {
			// Filtered: the sandbox's own allowlist, not a threat verdict.
			code = dns.ExtendedErrorCodeFiltered
		}
		opt := m.IsEdns0()
		opt.Option = append(opt.Option, &dns.EDNS0_EDE{InfoCode: code, ExtraText: reason})
	}
	s.pack(r, m)
	r.verdict = audit.VerdictDenied
	r.severity = sev
	s.countRcode(r, dns.RcodeNameError, reason)
	return true
}

func (s *Server) servfail(r *request, reason string) bool {
	return s.reply(r, dns.RcodeServerFailure, reason)
}

func (s *Server) pack(r *request, m *dns.Msg) {
	out, err := m.PackBuffer(r.out)
	if err != nil {
		// Cannot happen for messages built from a parsed query; answer
		// SERVFAIL with the bare header rather than nothing.
		out = append(r.out[:0], r.raw[:12]...)
		out[2] |= 0x80
		out[3] = dns.RcodeServerFailure
		for i := 4; i < 12; i++ {
			out[i] = 0
		}
	}
	r.resp = out
}

func (s *Server) countRcode(r *request, rcode int, reason string) {
	r.rcode = rcode
	r.reason = reason
	if r.verdict == "" || r.verdict == audit.VerdictRecorded {
		r.verdict = audit.VerdictDenied
		r.severity = audit.SeverityRoutine
	}
	switch rcode {
	case dns.RcodeNameError:
		s.stats.blocked.Add(1)
	case dns.RcodeRefused:
		s.stats.refused.Add(1)
	case dns.RcodeFormatError:
		s.stats.formErr.Add(1)
	case dns.RcodeNotImplemented:
		s.stats.notImp.Add(1)
	case dns.RcodeServerFailure:
		s.stats.servFail.Add(1)
	default:
		s.stats.refused.Add(1)
	}
	base := reason
	if i := strings.Index(reason, " under "); i >= 0 {
		base = reason[:i]
	} else if i := strings.Index(reason, ": "); i >= 0 {
		base = reason[:i]
	}
	if c := s.stats.reasons[base]; c != nil {
		c.Add(1)
	}
}

// finish counts allowed answers and emits the audit event.
func (s *Server) finish(r *request) {
	if r.rcode < 0 {
		return // dropped
	}
	if r.verdict == audit.VerdictAllowed || r.verdict == audit.VerdictRecorded {
		s.stats.allowed.Add(1)
	}
	if s.cfg.Events == nil {
		return
	}
	ev := audit.Event{
		Time:      r.now,
		Kind:      audit.KindDNS,
		Verdict:   r.verdict,
		Severity:  r.severity,
		Mechanism: "dnsproxy",
		DNS: &audit.DNSDetail{
			Name:    r.q.Name,
			QType:   dns.TypeToString[r.q.Qtype],
			Rcode:   dns.RcodeToString[r.rcode],
			Reason:  r.reason,
			Answers: r.answers,
			Client:  r.src.Remote.String(),
		},
	}
	if ev.DNS.QType == "" && r.q.Qtype != 0 {
		ev.DNS.QType = dns.Type(r.q.Qtype).String()
	}
	if r.sandbox != nil {
		ev.Sandbox.Name = r.sandbox.name
		ev.Rule = "dns:" + r.sandbox.name
	}
	if err := s.cfg.Events.Notify(ev); err != nil {
		s.stats.eventErrors.Add(1)
	}
	if r.alert != "" {
		// The channel alert: one per cut-off, with its numbers.
		ev.Severity = audit.SeverityAlert
		ev.Rule = "dns-channel:" + ev.Sandbox.Name
		ev.Message = r.alert
		if err := s.cfg.Events.Notify(ev); err != nil {
			s.stats.eventErrors.Add(1)
		}
	}
}

// blockWire writes the blocked answer directly (the common case: the
// question was parsed from an uncompressed name), with the SOA owner a
// compression pointer into the question. It returns nil when it cannot,
// and block packs the answer with miekg/dns instead.
func (r *request) blockWire(reason string) []byte {
	if r.qnameEnd == 0 || len(reason) > 200 {
		return nil
	}
	zone := r.info.domain
	// Offset of the zone's first label inside the question name.
	zoneOff := -1
	nameLen := r.qnameEnd - 12 - 1 // presentation length without the root dot
	if zone == "" || len(zone) > nameLen {
		return nil
	}
	for off := 12; off < r.qnameEnd-1; off += 1 + int(r.raw[off]) {
		if r.qnameEnd-1-off == len(zone)+1 {
			zoneOff = off
			break
		}
	}
	if zoneOff < 0 || zoneOff > 0x3fff {
		return nil
	}
	ttl := r.policy.negativeTTL
	out := append(r.out[:0], r.raw[:2]...)
	out = append(out, 0x80|r.raw[2]&0x01, 0x80|r.raw[3]&0x10|dns.RcodeNameError, 0, 1, 0, 0, 0, 1, 0, 0)
	if r.edns {
		out[11] = 1
	}
	out = append(out, r.raw[12:r.qnameEnd+4]...)
	out = append(out, 0xC0|byte(zoneOff>>8), byte(zoneOff), 0, 6, 0, 1,
		byte(ttl>>24), byte(ttl>>16), byte(ttl>>8), byte(ttl), 0, 58)
	mname := len(out)
	out = append(out, "\x07blocked\x07watcher\x07invalid\x00\x0ahostmaster"...)
	out = append(out, 0xC0|byte((mname+8)>>8), byte(mname+8))
	out = append(out, 0, 0, 0, 1, 0, 0, 0x0e, 0x10, 0, 0, 0x02, 0x58, 0, 1, 0x51, 0x80,
		byte(ttl>>24), byte(ttl>>16), byte(ttl>>8), byte(ttl))
	if r.edns {
		code := dns.ExtendedErrorCodeBlocked
		if reason == ReasonNotAllowed {
			code = dns.ExtendedErrorCodeFiltered
		}
		optLen := 2 + len(reason)
		out = append(out, 0, 0, 41, byte(ednsUDPSize>>8), byte(ednsUDPSize&0xff), 0, 0, 0, 0,
			byte((4+optLen)>>8), byte(4+optLen), 0, 15, byte(optLen>>8), byte(optLen), byte(code>>8), byte(code))
		out = append(out, reason...)
	}
	return out
}
