package egress

import (
	"net/netip"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Client is what the kernel recorded about a DNS client socket.
type Client struct {
	SandboxID uint32
	// SandboxCgroup is the sandbox root's cgroup id.
	SandboxCgroup uint64
	// Server is the address the client sent its query to, before the
	// redirect (the proxy itself when it asked the proxy directly).
	Server netip.AddrPort
	// PID is the process (tgid) that last sent from the socket.
	PID uint32
	// Seen is when the kernel last recorded a query from the socket.
	Seen time.Time
}

// LookupClient tells which sandbox sent a query that reached the proxy from
// src over network ("udp" or "tcp", with or without a 4/6 suffix). Queries
// from sandboxes always pass the hooks, which record the source port before
// the packet is sent; a port recorded for a sandbox and later reused outside
// any sandbox still maps to that sandbox (the stricter policy) until a
// sandbox reuses it.
func (e *Egress) LookupClient(network string, src netip.AddrPort) (Client, bool) {
	return e.LookupClientIn(e.home, network, src)
}

// LookupClientIn is LookupClient for a query received by a listener in the
// network namespace whose cookie is netns: source ports are per namespace.
func (e *Egress) LookupClientIn(netns uint64, network string, src netip.AddrPort) (Client, bool) {
	var proto uint16
	switch strings.TrimRight(network, "46") {
	case "udp":
		proto = unix.IPPROTO_UDP
	case "tcp":
		proto = unix.IPPROTO_TCP
	default:
		return Client{}, false
	}
	var c egressDnsClient
	if err := e.objs.EgressDnsClientsNs.Lookup(egressDnsClientKey{Netns: netns, Port: src.Port(), Proto: proto}, &c); err != nil {
		return Client{}, false
	}
	if local := wordsToAddr(c.LocalAddr); local.IsValid() && !local.IsUnspecified() && local.Unmap() != src.Addr().Unmap() {
		return Client{}, false
	}
	return Client{
		SandboxID:     c.SandboxId,
		SandboxCgroup: c.SandboxCg,
		Server:        netip.AddrPortFrom(wordsToAddr(c.OrigAddr), ntohs(c.OrigPort)),
		PID:           c.Pid,
		Seen:          time.Now().Add(-time.Duration(bootNanos() - c.TsNs)),
	}, true
}
