package dnsproxy

import (
	"context"
	"fmt"
	"testing"

	"github.com/miekg/dns"
)

func BenchmarkAnalyzeName(b *testing.B) {
	names := []string{
		"files.pythonhosted.org.",
		"d8d5e2a02eb2892bad48e521854afffa27ce0fdca3d953d4629edf006262691.us-east-1.prod.service.minerva.devices.a2z.com.",
		"eee5rEnPZzwbWUx2yGCgbKygbI3eHdyGzorGygg6RmWGkcaOjI3IkIuTisKNlY.mRjkYGQkAUOQQLRAgPP59JQ5rSygHMBMjQzaWbrKaNt.tun.example.org.",
	}
	for _, n := range names {
		b.Run(fmt.Sprintf("len%d", len(n)), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				analyzeName(n)
			}
		})
	}
}

// BenchmarkChain measures the whole handler chain on raw packets, no
// sockets: an allowed name from cache, a name off the allowlist, and a
// name carrying encoded data.
func BenchmarkChain(b *testing.B) {
	up := startUpstream(&testing.T{})
	pol := &Policy{Sandboxes: map[string]*SandboxPolicy{"sb": {Allow: []string{".example.com"}}}}
	s, err := New(Config{HostAddrs: noHostAddrs, Upstreams: []string{up.addr}, Policy: pol})
	if err != nil {
		b.Fatal(err)
	}
	src := QuerySource{Proto: "udp", ListenerSandbox: "sb"}
	for _, c := range []struct{ label, name string }{
		{"cached", "www.example.com."},
		{"not-allowed", "www.example.net."},
		{"encoded", "6d792070617373776f72642069732068756e74657232.example.com."},
	} {
		m := new(dns.Msg)
		m.SetQuestion(c.name, dns.TypeA)
		m.SetEdns0(1232, false)
		raw, _ := m.Pack()
		s.HandlePacket(context.Background(), raw, src) // warm the cache
		b.Run(c.label, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if s.HandlePacket(context.Background(), raw, src) == nil {
					b.Fatal("no answer")
				}
			}
		})
	}
}
