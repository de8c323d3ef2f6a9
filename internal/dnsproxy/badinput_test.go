package dnsproxy

import (
	"context"
	"encoding/binary"
	"net"
	"testing"
	"time"

	"github.com/miekg/dns"
)

func packQ(t testing.TB, f func(m *dns.Msg)) []byte {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion("www.example.com.", dns.TypeA)
	f(m)
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// badInputs are raw queries that must get an error answer (or none) and
// never reach the upstream.
func badInputs(t testing.TB) map[string]struct {
	raw   []byte
	rcode int // -1: no answer
} {
	valid := packQ(t, func(*dns.Msg) {})
	loop := append([]byte(nil), valid[:12]...)
	// Question name is a compression pointer to itself.
	loop = append(loop, 0xC0, 12, 0, 1, 0, 1)
	loop2 := append([]byte(nil), valid[:12]...)
	loop2 = append(loop2, 3, 'w', 'w', 'w', 0xC0, 12, 0, 1, 0, 1)
	trunc := valid[:len(valid)-3]
	twoQ := packQ(t, func(m *dns.Msg) {
		m.Question = append(m.Question, dns.Question{Name: "b.example.com.", Qtype: dns.TypeA, Qclass: dns.ClassINET})
	})
	noQ := packQ(t, func(m *dns.Msg) { m.Question = nil })
	chaos := packQ(t, func(m *dns.Msg) { m.Question[0].Qclass = dns.ClassCHAOS; m.Question[0].Name = "version.bind." })
	anyQ := packQ(t, func(m *dns.Msg) { m.Question[0].Qtype = dns.TypeANY })
	axfr := packQ(t, func(m *dns.Msg) { m.Question[0].Qtype = dns.TypeAXFR })
	optQ := packQ(t, func(m *dns.Msg) { m.Question[0].Qtype = dns.TypeOPT })
	update := packQ(t, func(m *dns.Msg) { m.Opcode = dns.OpcodeUpdate })
	notify := packQ(t, func(m *dns.Msg) { m.Opcode = dns.OpcodeNotify })
	resp := packQ(t, func(m *dns.Msg) { m.Response = true })
	ednsV1 := packQ(t, func(m *dns.Msg) { m.SetEdns0(1232, false); m.IsEdns0().SetVersion(1) })
	twoOPT := packQ(t, func(m *dns.Msg) {
		m.SetEdns0(1232, false)
		o := new(dns.OPT)
		o.Hdr = dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT}
		m.Extra = append(m.Extra, o)
	})
	optName := packQ(t, func(m *dns.Msg) { m.SetEdns0(1232, false); m.IsEdns0().Hdr.Name = "example.com." })
	withAnswer := packQ(t, func(m *dns.Msg) {
		rr, _ := dns.NewRR("www.example.com. 60 IN A 192.0.2.1")
		m.Answer = []dns.RR{rr}
	})
	tsig := packQ(t, func(m *dns.Msg) {
		m.Extra = append(m.Extra, &dns.TSIG{Hdr: dns.RR_Header{Name: "key.", Rrtype: dns.TypeTSIG, Class: dns.ClassANY},
			Algorithm: dns.HmacSHA256, TimeSigned: 1, Fudge: 300, MACSize: 0})
	})
	nonASCII := packQ(t, func(m *dns.Msg) { m.Question[0].Name = "j\\228germeister.example.com." })
	escapedDot := packQ(t, func(m *dns.Msg) { m.Question[0].Name = "evil\\.www.example.com." })
	nul := packQ(t, func(m *dns.Msg) { m.Question[0].Name = "a\\000b.example.com." })
	space := packQ(t, func(m *dns.Msg) { m.Question[0].Name = "a\\032b.example.com." })
	root := packQ(t, func(m *dns.Msg) { m.Question[0].Name = "."; m.Question[0].Qtype = dns.TypeNS })
	huge := make([]byte, 5000)
	copy(huge, valid)
	badLabel := append([]byte(nil), valid[:12]...)
	badLabel = append(badLabel, 0x80, 'x', 0, 0, 1, 0, 1) // label type 10 (reserved)

	return map[string]struct {
		raw   []byte
		rcode int
	}{
		"empty":           {nil, -1},
		"short header":    {valid[:11], -1},
		"header only":     {valid[:12], dns.RcodeFormatError},
		"truncated":       {trunc, dns.RcodeFormatError},
		"pointer loop":    {loop, dns.RcodeFormatError},
		"pointer loop 2":  {loop2, dns.RcodeFormatError},
		"reserved label":  {badLabel, dns.RcodeFormatError},
		"two questions":   {twoQ, dns.RcodeFormatError},
		"no question":     {noQ, dns.RcodeFormatError},
		"answer in query": {withAnswer, dns.RcodeFormatError},
		"oversized":       {huge, dns.RcodeFormatError},
		"class CH":        {chaos, dns.RcodeRefused},
		"ANY":             {anyQ, dns.RcodeNotImplemented},
		"AXFR":            {axfr, dns.RcodeRefused},
		"qtype OPT":       {optQ, dns.RcodeFormatError},
		"UPDATE":          {update, dns.RcodeNotImplemented},
		"NOTIFY":          {notify, dns.RcodeNotImplemented},
		"response":        {resp, -1},
		"EDNS version 1":  {ednsV1, dns.RcodeBadVers},
		"two OPT":         {twoOPT, dns.RcodeFormatError},
		"OPT not at root": {optName, dns.RcodeFormatError},
		"TSIG":            {tsig, dns.RcodeRefused},
		"non-ASCII label": {nonASCII, dns.RcodeRefused},
		"escaped dot":     {escapedDot, dns.RcodeRefused},
		"NUL in label":    {nul, dns.RcodeRefused},
		"space in label":  {space, dns.RcodeRefused},
		"root":            {root, dns.RcodeRefused},
	}
}

func TestBadInput(t *testing.T) {
	up := startUpstream(t)
	s, addr := startProxy(t, Config{Upstreams: []string{up.addr}, Policy: basicPolicy()})
	for name, c := range badInputs(t) {
		resp := s.HandlePacket(context.Background(), c.raw, QuerySource{Proto: "udp", ListenerSandbox: "sb"})
		if c.rcode < 0 {
			if resp != nil {
				t.Errorf("%s: answered, want silence", name)
			}
			continue
		}
		if len(resp) < 12 {
			t.Errorf("%s: no answer", name)
			continue
		}
		if binary.BigEndian.Uint16(resp) != binary.BigEndian.Uint16(c.raw) || resp[2]&0x80 == 0 {
			t.Errorf("%s: answer has wrong ID or no QR bit", name)
		}
		rcode := int(resp[3] & 0xf)
		var m dns.Msg
		if err := m.Unpack(resp); err == nil {
			rcode = m.Rcode
		} else {
			t.Errorf("%s: answer does not parse: %v", name, err)
		}
		if rcode != c.rcode {
			t.Errorf("%s: rcode %s, want %s", name, dns.RcodeToString[rcode], dns.RcodeToString[c.rcode])
		}
	}
	// The same over the network, UDP and TCP: every answerable packet gets
	// its answer, and the server keeps serving.
	conn, err := net.Dial("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for name, c := range badInputs(t) {
		if c.rcode < 0 || len(c.raw) > 1232 {
			continue
		}
		conn.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := conn.Write(c.raw); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 2048)
		if _, err := conn.Read(buf); err != nil {
			t.Errorf("%s over UDP: %v", name, err)
		}
	}
	tc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	for name, c := range badInputs(t) {
		if c.rcode < 0 {
			continue
		}
		tc.SetDeadline(time.Now().Add(2 * time.Second))
		frame := binary.BigEndian.AppendUint16(nil, uint16(len(c.raw)))
		if _, err := tc.Write(append(frame, c.raw...)); err != nil {
			t.Fatalf("%s over TCP: %v", name, err)
		}
		var l [2]byte
		if _, err := readFull(tc, l[:]); err != nil {
			t.Fatalf("%s over TCP: %v", name, err)
		}
		if _, err := readFull(tc, make([]byte, binary.BigEndian.Uint16(l[:]))); err != nil {
			t.Fatalf("%s over TCP: %v", name, err)
		}
	}
	// (example.com itself is cut off by now: names with bytes no hostname
	// has count as encoded data against their domain.)
	if r := query(t, addr, "pypi.org", dns.TypeA); r.Rcode != dns.RcodeSuccess {
		t.Errorf("server unwell after bad input: %s", dns.RcodeToString[r.Rcode])
	}
	if n := up.queries.Load(); n != 1 {
		t.Errorf("bad input reached the upstream: %d queries %v", n, up.seen())
	}
}

func readFull(c net.Conn, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := c.Read(b[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// FuzzHandlePacket feeds raw packets through the whole chain. The upstream
// is a closed port, so anything that slipped through to forwarding would
// show as an upstream error; it must never be a valid name that the
// policy refuses, and nothing may panic.
func FuzzHandlePacket(f *testing.F) {
	for _, c := range badInputs(f) {
		f.Add(c.raw)
	}
	f.Add(packQ(f, func(*dns.Msg) {}))
	f.Add(packQ(f, func(m *dns.Msg) { m.SetEdns0(4096, true) }))
	f.Add(packQ(f, func(m *dns.Msg) { m.Question[0].Name = "6d792070617373776f7264.example.com." }))
	f.Add(packQ(f, func(m *dns.Msg) { m.Question[0].Name = "not.allowed.test." }))
	pol := &Policy{Sandboxes: map[string]*SandboxPolicy{"sb": {Allow: []string{".example.com"}}}}
	s, err := New(Config{HostAddrs: noHostAddrs, Upstreams: []string{"127.0.0.1:1"}, Policy: pol, UpstreamTimeout: 50 * time.Millisecond})
	if err != nil {
		f.Fatal(err)
	}
	src := QuerySource{Proto: "udp", ListenerSandbox: "sb"}
	f.Fuzz(func(t *testing.T, raw []byte) {
		before := s.Stats().CacheMisses
		resp := s.HandlePacket(context.Background(), raw, src)
		if resp == nil {
			if len(raw) >= 12 && raw[2]&0x80 == 0 {
				t.Fatalf("query with a header got no answer")
			}
			return
		}
		var m dns.Msg
		if err := m.Unpack(resp); err != nil && len(resp) != 12 {
			t.Fatalf("unparseable answer %x: %v", resp, err)
		}
		if s.Stats().CacheMisses != before {
			// It went to forwarding: then it must have been a well-formed
			// IN query for a clean name under the allowed domain.
			var q dns.Msg
			if err := q.Unpack(raw); err != nil || len(q.Question) != 1 || q.Question[0].Qclass != dns.ClassINET {
				t.Fatalf("forwarded a bad query %x", raw)
			}
			allow := newNameSet(pol.Sandboxes["sb"].Allow)
			if !allow.match(lowerTrim(q.Question[0].Name)) {
				t.Fatalf("forwarded a name off the allowlist: %q", q.Question[0].Name)
			}
		}
	})
}

func lowerTrim(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c >= 'A' && c <= 'Z' {
			b[i] = c + 32
		}
	}
	if len(b) > 0 && b[len(b)-1] == '.' {
		b = b[:len(b)-1]
	}
	return string(b)
}
