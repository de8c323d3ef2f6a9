// Package egressrules is the egress layer's configuration
// (internal/enforce/egress loads it): CIDR rules, the unix socket paths
// and what a DNS answer admits. No BPF here, so the planner can build it.
package egressrules

import (
	"net/netip"
	"strings"
	"time"
)

// MaxRangesPerPrefix bounds the port ranges one CIDR can carry after
// rules with overlapping prefixes are merged (mirrored from bpf/egress.c).
const MaxRangesPerPrefix = 8

// Protocol selects the transport a rule applies to.
type Protocol uint8

// Protocols.
const (
	ProtoAny Protocol = iota
	ProtoTCP
	ProtoUDP
)

// PortRange is an inclusive range of destination ports; the zero value
// means every port.
type PortRange struct {
	Lo, Hi uint16
}

// Bounds are the first and last port of the range.
func (r PortRange) Bounds() (uint16, uint16) {
	if r.Lo == 0 && r.Hi == 0 {
		return 0, 65535
	}
	return r.Lo, r.Hi
}

// Rule allows destinations in Prefix on Ports over Protocol, whatever DNS
// answered.
type Rule struct {
	// ID is reported in events (0 for none).
	ID       uint32
	Prefix   netip.Prefix
	Ports    PortRange
	Protocol Protocol
}

// SandboxConfig is one sandbox's egress configuration.
type SandboxConfig struct {
	// RecordOnly allows every refused operation but records it.
	RecordOnly bool
	// Proxy4 and Proxy6 are where DNS over IPv4 and IPv6 is redirected. An
	// unset one makes DNS over that family fail (EPERM).
	Proxy4, Proxy6 netip.AddrPort
	// DNSRuleID is reported when DNS is refused for lack of a proxy.
	DNSRuleID uint32
	// Rules allow destinations without DNS (CIDRs, loopback services).
	Rules []Rule
	// ResolverPorts refuses the ports of other name resolution (DNS over
	// TLS and QUIC 853, 784, 8853; mDNS 5353; LLMNR 5355; NetBIOS 137)
	// even at answered addresses; only Rules open them.
	ResolverPorts bool
	// RestrictUnix limits unix socket connects and datagrams to UnixPaths
	// (where the kernel has the hooks: egress.Egress.UnixErr).
	RestrictUnix bool
	// RefuseForeign refuses connects and addressed sends on sockets made
	// outside the sandbox (inherited, or passed in by another process),
	// where the kernel runs none of the sandbox's own programs.
	RefuseForeign bool
	// UnixPaths are the socket paths allowed with RestrictUnix: a path
	// ending in "/" allows everything below it, others that socket only.
	UnixPaths []string
}

// PortSpan is an inclusive range of ports over a protocol that an
// admission opens; Lo and Hi both 0 mean every port.
type PortSpan struct {
	Lo, Hi   uint16
	Protocol Protocol
}

// WebPorts is the default scope of an answered address: TCP 80 and 443.
var WebPorts = []PortSpan{{Lo: 80, Hi: 80, Protocol: ProtoTCP}, {Lo: 443, Hi: 443, Protocol: ProtoTCP}}

// AllPorts is every port over TCP and UDP.
var AllPorts = []PortSpan{{Protocol: ProtoAny}}

// DefaultAdmissionCap is how long an answer admits its addresses at most
// (before the grace) when the policy sets no cap: an attacker's server
// answers with the TTL it likes, up to 68 years.
const DefaultAdmissionCap = 5 * time.Minute

// Scope is what one sandbox's allowed answers open: for how long at most,
// and on which ports for which names.
type Scope struct {
	// Cap bounds the TTL an answer admits its addresses for; 0 means
	// DefaultAdmissionCap.
	Cap time.Duration
	// Default is what every answered address is open on; nil means
	// WebPorts (TCP 80 and 443).
	Default []PortSpan
	// Names add spans for the answers of some names.
	Names []NameSpans
}

// NameSpans opens Spans for the answers of names Pattern matches:
// "example.com" that name, "*.example.com" the names below it,
// ".example.com" both.
type NameSpans struct {
	Pattern string
	Spans   []PortSpan
}

// TTL is the admission time of an answer with ttl.
func (s *Scope) TTL(ttl time.Duration) time.Duration {
	limit := DefaultAdmissionCap
	if s != nil && s.Cap > 0 {
		limit = s.Cap
	}
	return min(ttl, limit)
}

// Spans is what an answer for name (any case, trailing dot optional)
// opens: the default spans and those of every entry that matches it.
func (s *Scope) Spans(name string) []PortSpan {
	if s == nil {
		return WebPorts
	}
	out := s.Default
	if out == nil {
		out = WebPorts
	}
	name = strings.ToLower(strings.TrimSuffix(name, "."))
	extra := false
	for _, n := range s.Names {
		if !matchName(n.Pattern, name) {
			continue
		}
		if !extra {
			out = append([]PortSpan(nil), out...)
			extra = true
		}
		out = append(out, n.Spans...)
	}
	return out
}

func matchName(pattern, name string) bool {
	p := strings.ToLower(strings.TrimSuffix(pattern, "."))
	switch {
	case strings.HasPrefix(p, "*."):
		return strings.HasSuffix(name, p[1:])
	case strings.HasPrefix(p, "."):
		return name == p[1:] || strings.HasSuffix(name, p)
	}
	return name == p
}
