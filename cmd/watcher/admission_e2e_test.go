package main

import (
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
)

// TestAdmissionScopedUnderExec: the answered-address rule of issue 27 on
// the watcher exec path (the runtime-placed path is internal/enforce/
// egress TestAdmission*): an address the proxy answered for a name is
// open on TCP 443, and TCP 4444 at the same address, where a server
// listens, is refused by the connect hook before any packet leaves.
func TestAdmissionScopedUnderExec(t *testing.T) {
	for _, bin := range []string{"curl", "ip"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s is not installed", bin)
		}
	}
	cdnAddr, dnsAddr, inNS := cdnNamespace(t)
	caFile := serveCDN(t, cdnAddr, inNS)
	serveCDNDNS(t, dnsAddr, cdnAddr, inNS)
	var ln net.Listener
	if err := inNS(func() (err error) {
		ln, err = net.Listen("tcp", netip.AddrPortFrom(cdnAddr, 4444).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("HTTP/1.0 200 OK\r\n\r\nport-4444-reached"))
			c.Close()
		}
	}()
	tb := newTestbed(t, "    dns: {allow: [.cdn.test]}\n", "{enabled: false}")
	tb.resolveThrough(dnsAddr)
	tb.startAgent()
	script := "curl -sS --max-time 10 --cacert " + caFile + " https://a.cdn.test/; echo; " +
		"curl -sS --max-time 10 http://a.cdn.test:4444/; echo \" curl4444-exit=$?\""
	out, code := tb.watcher("exec", "--socket", tb.ControlSocket(), "--", "/bin/sh", "-c", script)
	if !strings.Contains(out, "host=a.cdn.test sni=a.cdn.test") {
		t.Fatalf("TCP 443 at the answered address (exit %d):\n%s\nagent log:\n%s", code, out, tb.agentLog)
	}
	if strings.Contains(out, "port-4444-reached") || strings.Contains(out, "curl4444-exit=0") {
		t.Fatalf("TCP 4444 at the answered address was reached under watcher exec:\n%s", out)
	}
	if !strings.Contains(out, ":4444") || !strings.Contains(out, `name_ports: [{name: a.cdn.test, ports: ["4444"]`) {
		t.Errorf("the refusal summary does not name the refused port and the line that would allow it:\n%s", out)
	}
}
