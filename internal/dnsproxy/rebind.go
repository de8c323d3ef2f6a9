package dnsproxy

import (
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// DNS rebinding and metadata protection.
//
// An allowed (or default-allowed) name whose answer is a local address
// would open the cloud metadata service, the agent's metrics port or any
// host service to the sandbox through the egress allowlist: the attacker
// only needs a name it controls that resolves to 169.254.169.254 or
// 127.0.0.1. Like unbound's private-address and dnsmasq's stop-dns-rebind,
// the proxy refuses such answers (NXDOMAIN with an RFC 8914 Blocked reason
// "local address in answer: ...") unless the sandbox's LocalAllow covers
// every local address in them, and it never reports local addresses to
// OnAnswer: an explicit egress rule governs those connections, not an
// answer.

// localPrefixes are the address ranges that are not the public internet,
// with what they are (IPv4 forms also cover their IPv4-mapped, -compatible
// and NAT64 embeddings: see LocalKind).
var localPrefixes = []struct {
	p    netip.Prefix
	kind string
}{
	{netip.MustParsePrefix("169.254.169.254/32"), "cloud metadata"},
	{netip.MustParsePrefix("169.254.170.2/32"), "cloud metadata"},    // ECS task credentials
	{netip.MustParsePrefix("100.100.100.200/32"), "cloud metadata"},  // Alibaba
	{netip.MustParsePrefix("168.63.129.16/32"), "cloud metadata"},    // Azure wireserver
	{netip.MustParsePrefix("fd00:ec2::254/128"), "cloud metadata"},   // AWS IPv6
	{netip.MustParsePrefix("0.0.0.0/8"), "unspecified"},              // "this network": 0.0.0.0 reaches the host
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback"},               //
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local"},          //
	{netip.MustParsePrefix("10.0.0.0/8"), "private"},                 // RFC 1918
	{netip.MustParsePrefix("172.16.0.0/12"), "private"},              //
	{netip.MustParsePrefix("192.168.0.0/16"), "private"},             //
	{netip.MustParsePrefix("100.64.0.0/10"), "shared address space"}, // RFC 6598, carrier NAT and some metadata
	{netip.MustParsePrefix("192.0.0.0/24"), "reserved"},              // IETF protocol assignments
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast"},              //
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved"},               // and 255.255.255.255
	{netip.MustParsePrefix("::/128"), "unspecified"},                 //
	{netip.MustParsePrefix("::1/128"), "loopback"},                   //
	{netip.MustParsePrefix("fe80::/10"), "link-local"},               //
	{netip.MustParsePrefix("fec0::/10"), "site-local"},               // deprecated, still routed by some
	{netip.MustParsePrefix("fc00::/7"), "unique-local"},              //
	{netip.MustParsePrefix("ff00::/8"), "multicast"},                 //
}

// embedded returns the IPv4 address an IPv6 address carries where hosts or
// gateways would reach it: IPv4-mapped (::ffff:a.b.c.d), IPv4-compatible
// (::a.b.c.d), NAT64 (64:ff9b::/96 and the local-use 64:ff9b:1::/48, last
// 32 bits) and 6to4 (2002:AABB:CCDD::/48).
func embedded(a netip.Addr) (netip.Addr, bool) {
	if !a.Is6() {
		return netip.Addr{}, false
	}
	b := a.As16()
	v4 := func(off int) netip.Addr { return netip.AddrFrom4([4]byte{b[off], b[off+1], b[off+2], b[off+3]}) }
	zero := func(from, to int) bool {
		for i := from; i < to; i++ {
			if b[i] != 0 {
				return false
			}
		}
		return true
	}
	switch {
	case a.Is4In6():
		return v4(12), true
	case zero(0, 12) && !zero(12, 16) && !(zero(12, 15) && b[15] == 1): // ::a.b.c.d, not :: or ::1
		return v4(12), true
	case b[0] == 0 && b[1] == 0x64 && b[2] == 0xff && b[3] == 0x9b && (zero(4, 12) || b[4] == 0 && b[5] == 1):
		return v4(12), true
	case b[0] == 0x20 && b[1] == 0x02:
		return v4(2), true
	}
	return netip.Addr{}, false
}

// LocalKind says what kind of local address a is ("loopback", "cloud
// metadata", "private", ...), or "" for a public address. IPv6 addresses
// embedding an IPv4 address (mapped, compatible, NAT64, 6to4) are judged by
// both forms.
func LocalKind(a netip.Addr) string {
	a = a.WithZone("")
	if !a.IsValid() {
		return "invalid"
	}
	if v4, ok := embedded(a); ok {
		if k := LocalKind(v4); k != "" {
			return k
		}
		if a.Is4In6() {
			return ""
		}
	}
	for _, lp := range localPrefixes {
		if lp.p.Contains(a) {
			return lp.kind
		}
	}
	return ""
}

// hostAddrs is the set of the host's own addresses (every interface of the
// agent's network namespace), refreshed at most once per hostAddrsMaxAge.
type hostAddrs struct {
	list  func() ([]netip.Addr, error)
	mu    sync.Mutex
	set   atomic.Pointer[map[netip.Addr]bool]
	stamp atomic.Int64 // unix nanoseconds of the last refresh
}

const hostAddrsMaxAge = 5 * time.Second

// interfaceAddrs lists the addresses of every interface.
func interfaceAddrs() ([]netip.Addr, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	out := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out, nil
}

// has reports whether a is one of the host's addresses.
func (h *hostAddrs) has(a netip.Addr, now time.Time) bool {
	if h.list == nil {
		return false
	}
	if now.UnixNano()-h.stamp.Load() > int64(hostAddrsMaxAge) || h.set.Load() == nil {
		h.refresh(now)
	}
	m := h.set.Load()
	if m == nil {
		return false
	}
	a = a.WithZone("")
	if v4, ok := embedded(a); ok && (*m)[v4] {
		return true
	}
	return (*m)[a.Unmap()]
}

func (h *hostAddrs) refresh(now time.Time) {
	if !h.mu.TryLock() {
		return // another query refreshes; the previous set serves meanwhile
	}
	defer h.mu.Unlock()
	addrs, err := h.list()
	if err != nil && h.set.Load() != nil {
		return // keep the last good set
	}
	m := make(map[netip.Addr]bool, len(addrs))
	for _, a := range addrs {
		m[a.WithZone("").Unmap()] = true
	}
	h.set.Store(&m)
	h.stamp.Store(now.UnixNano())
}

// localVerdict judges the addresses of an answer for sandbox sb: the first
// local address its LocalAllow does not cover (with its kind), and the
// addresses the egress allowlist may admit (the public ones).
func (s *Server) localVerdict(sb *compiledSandbox, addrs []netip.Addr, now time.Time) (refused netip.Addr, kind string, public []netip.Addr) {
	public = addrs
	for i, a := range addrs {
		k := LocalKind(a)
		if k == "" && s.host.has(a, now) {
			k = "host address"
		}
		if k == "" {
			if len(public) != len(addrs) {
				public = append(public, a)
			}
			continue
		}
		if len(public) == len(addrs) {
			public = append([]netip.Addr(nil), addrs[:i]...)
		}
		if !sb.localAllowed(a) && !refused.IsValid() {
			refused, kind = a, k
		}
	}
	return refused, kind, public
}

// localAllowed reports whether one of the sandbox's LocalAllow prefixes
// covers a (in its IPv4 form too, for mapped addresses).
func (sb *compiledSandbox) localAllowed(a netip.Addr) bool {
	a = a.WithZone("")
	v4, emb := embedded(a)
	for _, p := range sb.localAllow {
		if p.Contains(a) || p.Contains(a.Unmap()) || emb && p.Contains(v4) {
			return true
		}
	}
	return false
}
