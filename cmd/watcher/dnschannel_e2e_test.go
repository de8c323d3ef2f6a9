package main

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/miekg/dns"

	"github.com/watcherhq/watcher/internal/audit"
)

// typeChannelScript asks one allowed name again and again with a query
// type chosen from eight by a fixed pseudo-random sequence (3 bits a
// query) and prints how many were answered and how many refused. Every
// query goes to port 53 of the address given: the kernel sends it to the
// agent's proxy.
const typeChannelScript = `
import os, socket, struct, sys
server = (sys.argv[1], 53)
types = [1, 28, 5, 15, 2, 6, 33, 65]  # A AAAA CNAME MX NS SOA SRV HTTPS
qname = b"".join(bytes([len(l)]) + l.encode() for l in "api.cdn.test".split(".")) + b"\0"
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(3)
ok = refused = lost = 0
x = 7
for i in range(3000):
    x = (x * 1664525 + 1013904223) & 0xffffffff
    qid = i & 0xffff
    s.sendto(struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0) + qname + struct.pack(">HH", types[(x >> 16) % 8], 1), server)
    while True:
        try:
            resp = s.recv(4096)
        except socket.timeout:
            lost += 1
            break
        if struct.unpack(">H", resp[:2])[0] != qid:
            continue
        if resp[3] & 0xf == 0:
            ok += 1
        else:
            refused += 1
        break
print("answered=%d refused=%d lost=%d" % (ok, refused, lost))
`

// TestDNSTypeChannelUnderExec: the query-type channel of issue 27 on the
// watcher exec path (the runtime-placed path is internal/enforce/egress
// TestDNSChannelsThroughKernel): one allowed name asked with eight query
// types (3 bits a query, TTL 0 so every query reaches the authoritative
// server) is cut off within the 4,800-bit budget, with an alert that
// names the domain, while the first queries (the benign neighbour) are
// answered.
func TestDNSTypeChannelUnderExec(t *testing.T) {
	for _, bin := range []string{"python3", "ip"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s is not installed", bin)
		}
	}
	cdnAddr, dnsAddr, inNS := cdnNamespace(t)
	var reached atomic.Int64
	serveDNSIn(t, dnsAddr, inNS, func(w dns.ResponseWriter, r *dns.Msg) {
		reached.Add(1)
		m := new(dns.Msg)
		m.SetReply(r)
		if q := r.Question[0]; q.Qtype == dns.TypeA {
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 0}, A: cdnAddr.AsSlice()})
		}
		w.WriteMsg(m)
	})

	// No query rate limit: only the information budget may stop it.
	tb := newTestbed(t, "    dns: {allow: [.cdn.test], detection: {rate_limit: 0}}\n", "{enabled: false}")
	tb.resolveThrough(dnsAddr)
	tb.startAgent()
	out, code := tb.watcher("exec", "--socket", tb.ControlSocket(), "--", "python3", "-c", typeChannelScript, dnsAddr.String())
	var answered, refused, lost int
	if _, err := fmt.Sscanf(out[strings.Index(out, "answered="):], "answered=%d refused=%d lost=%d", &answered, &refused, &lost); err != nil {
		t.Fatalf("script output (exit %d): %v\n%s", code, err, out)
	}
	n := reached.Load()
	t.Logf("%d answered, %d refused, %d lost; %d reached the authoritative server", answered, refused, lost, n)
	// At least 3 bits for most queries: well under 4800/3 = 1600 reach it.
	if n > 1700 || refused == 0 {
		t.Errorf("%d answered, %d refused, %d reached the server: want the budget to stop the type channel", answered, refused, n)
	}
	if answered < 100 {
		t.Errorf("only %d queries answered before the cut-off: the benign start was refused", answered)
	}
	led, _ := tb.watcher("ledger", "cat", "--json", "--kind", "dns", tb.ledger)
	found := false
	for _, line := range strings.Split(led, "\n") {
		var ev audit.Event
		if json.Unmarshal([]byte(line), &ev) != nil {
			continue
		}
		if ev.Severity == audit.SeverityAlert && strings.HasPrefix(ev.Message, "DNS channel to cdn.test over its budget") && ev.Sandbox.Name == "agents" {
			found = true
			t.Logf("alert: %s", ev.Message)
			break
		}
	}
	if !found {
		t.Errorf("no channel alert for cdn.test in the ledger:\n%.3000s", led)
	}
}
