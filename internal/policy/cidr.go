package policy

import (
	"fmt"
	"net/netip"
	"strings"
)

// ParseCIDR parses an egress network, the one parser of networks in
// watcher (egress.allow here, then the egress maps and the DNS proxy's
// local allowance through internal/plan):
//   - a prefix, "10.0.0.0/8" or "2001:db8::/32": its host bits must be
//     zero ("10.1.2.3/8" is refused, naming 10.0.0.0/8), since a rule
//     that silently means a wider network than written is a surprise;
//   - a bare address, "192.0.2.7" or "::1": that host alone (/32, /128).
//
// Zones ("fe80::1%eth0") are refused: the kernel judges destinations
// without one, so a zone would be dropped and the rule would cover the
// address on every interface. Nothing else is trimmed or guessed.
func ParseCIDR(s string) (netip.Prefix, error) {
	if !strings.Contains(s, "/") {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("%q is not an IP address or CIDR", s)
		}
		if a.Zone() != "" {
			return netip.Prefix{}, fmt.Errorf("%q has a zone (%%%s): egress rules cannot name an interface", s, a.Zone())
		}
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		msg := err.Error()
		if i := strings.LastIndex(msg, ": "); i >= 0 {
			msg = msg[i+2:]
		}
		return netip.Prefix{}, fmt.Errorf("%q is not a valid CIDR (%s)", s, msg)
	}
	if p.Masked() != p {
		return netip.Prefix{}, fmt.Errorf("%q has host bits set (did you mean %s?)", s, p.Masked())
	}
	return p, nil
}
