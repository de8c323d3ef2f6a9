package dnsproxy

import (
	"context"
	"strings"
	"time"

	"github.com/miekg/dns"
	"github.com/watcherhq/watcher/internal/audit"
)

// request is one query travelling down the chain.
type request struct {
	ctx context.Context
	raw []byte
	src QuerySource
	out []byte // response buffer to reuse

	now      time.Time
	msg      dns.Msg
	q        dns.Question
	qs       [1]dns.Question
	edns     bool
	udpSize  int
	qnameEnd int // end of the uncompressed question name in raw, 0 if compressed

	policy  *compiledPolicy
	sandbox *compiledSandbox
	state   *sandboxState

	info       nameInfo
	notAllowed bool
	// listed: an allowlist entry matched the name.
	listed bool
	// cached is the cache's answer, looked up once by detect (when
	// cacheLooked) for the channel charge and used by the cache stage.
	cachedT     *answerTemplate
	cacheLooked bool
	// alert, when set, is a channel alert with its numbers, emitted as
	// its own event beside the query's.
	alert string
	// probe is the agent's own canary probe (Config.OwnProbe).
	probe bool

	// Outcome, set by the stage that answers.
	resp     []byte
	verdict  audit.Verdict
	severity audit.Severity
	rcode    int
	reason   string
	answers  []string
	cached   bool
}

// stage is one handler of the chain: it answers the query (returns true)
// or passes it on.
type stage struct {
	name string
	fn   func(s *Server, r *request) bool
	// mayBlock marks stages that wait on the network; on the UDP path they
	// run on their own goroutine so the read loop keeps reading.
	mayBlock bool
}

// chain is the resolver pipeline, in order.
var chain = []stage{
	// 1. Wire format first: nothing below may see a query that is malformed,
	//    not a QUERY, multi-question, non-IN, ANY/AXFR or with odd EDNS.
	{name: "parse", fn: parseStage},
	// 2. Sandbox: policy, limits and state are per sandbox, and a client
	//    that belongs to none is refused before it costs anything more.
	{name: "sandbox", fn: sandboxStage},
	// 3. Rate limit before any per-name work, so a flood from one sandbox
	//    costs little and cannot starve the others.
	{name: "ratelimit", fn: rateLimitStage},
	// 4. Name syntax: bytes no hostname contains are refused, and count
	//    against their domain as encoded data (iodine's base128).
	{name: "name", fn: nameStage},
	// 5. Allow/deny lists: deny answers at once; a name off the allowlist is
	//    only marked, so detection still sees it and keeps the stream state.
	{name: "policy", fn: policyStage},
	// 6. Encoded-name and stream detection on every name, allowed or not.
	{name: "detect", fn: detectStage},
	// 7. Rare query types (TXT and the like): a small budget per sandbox,
	//    spent only by names that would be answered.
	{name: "rare", fn: rareStage},
	// 8. Shared TTL cache: policy was applied above, so one answer serves
	//    every sandbox allowed to have it.
	{name: "cache", fn: cacheStage},
	// 9. Forward to the upstream resolvers.
	{name: "forward", fn: forwardStage, mayBlock: true},
}

// process runs r through the chain and returns the response (nil: no
// answer). When async is set, stages that wait on the network continue on
// a new goroutine that hands the response to async; process then returns
// pending. Without async everything runs here.
func (s *Server) process(r *request, async func([]byte)) (resp []byte, pending bool) {
	if r.ctx == nil {
		r.ctx = context.Background()
	}
	r.now = s.now()
	s.stats.queries.Add(1)
	return s.runFrom(r, 0, async)
}

func (s *Server) runFrom(r *request, from int, async func([]byte)) ([]byte, bool) {
	for i := from; i < len(chain); i++ {
		st := chain[i]
		if st.mayBlock && async != nil {
			select {
			case s.inflight <- struct{}{}:
			default:
				// Too many queries waiting on upstreams: fail fast.
				s.servfail(r, ReasonUpstream)
				s.finish(r)
				return r.resp, false
			}
			// The read loop reuses raw and out: take copies.
			r.raw = append([]byte(nil), r.raw...)
			r.out = nil
			go func() {
				defer func() { <-s.inflight }()
				resp, _ := s.runFrom(r, i, nil)
				async(resp)
			}()
			return nil, true
		}
		if st.fn(s, r) {
			break
		}
	}
	s.finish(r)
	return r.resp, false
}

// --- stages ---

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

func rateLimitStage(s *Server, r *request) bool {
	if !r.probe && !r.state.allow(r.sandbox.rate, r.now) {
		s.stats.rateLimited.Add(1)
		return s.reply(r, dns.RcodeRefused, ReasonRateLimited)
	}
	return false
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

func forwardStage(s *Server, r *request) bool {
	// Forward exactly the name that was judged: in lower case, so the
	// client's letter case (which DNS ignores) cannot carry bits to the
	// name's authoritative server.
	m, err := s.fwd.resolve(r.ctx, strings.ToLower(r.q.Name), r.q.Qtype)
	if err != nil {
		s.stats.upstreamErrors.Add(1)
		return s.servfail(r, ReasonUpstream)
	}
	t, err := newTemplate(m, r.now)
	if err != nil {
		s.stats.upstreamErrors.Add(1)
		return s.servfail(r, ReasonUpstream)
	}
	s.cache.put(cacheKey{strings.ToLower(r.q.Name), r.q.Qtype}, t)
	if (m.Rcode == dns.RcodeSuccess || m.Rcode == dns.RcodeNameError) && !r.probe {
		r.state.observeAnswer(r.sandbox, r.info.domain, m.Rcode, r.now)
	}
	if r.info.domain != "" && !r.probe && r.sandbox.mode != "off" {
		r.state.answered(r.info.domain, r.info.head, r.q.Qtype, t.expires.Sub(t.stored), t.expires)
	}
	s.answerFromTemplate(r, t)
	return true
}

// --- answers ---

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
