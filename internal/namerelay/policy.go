package namerelay

import (
	"net/netip"
	"strings"
)

// Policy is one sandbox's name binding, as the relay applies it.
type Policy struct {
	// Sandbox names the sandbox in events.
	Sandbox string
	// RecordOnly lets refused connections through and records them.
	RecordOnly bool
	// NameAllowed reports whether the sandbox's name policy (the DNS
	// allow and deny lists) allows name; a name it allows may be carried
	// to any address the sandbox may reach, answered for it or not. Nil:
	// only answered names pass.
	NameAllowed func(name string) bool
	// ECH lists the outer names for which a ClientHello with Encrypted
	// Client Hello may pass (the inner, real name is hidden from the
	// relay). Empty: ECH is refused.
	ECH Names
	// ReadOnly lists the names limited to GET, HEAD and OPTIONS on plain
	// HTTP; other methods get a 403.
	ReadOnly Names
	// UnnamedPorts are ports where traffic that carries no name (SSH,
	// where the server speaks first) passes to answered addresses without
	// one.
	UnnamedPorts []PortRange
	// RecordAllowed records every connection that passes, with its name
	// (policy audit.connections).
	RecordAllowed bool
	// Secrets are the credentials the sandbox holds placeholders for; CA
	// terminates TLS for their hosts and for Inspect (nil: neither).
	Secrets []Secret
	CA      *CA
	// Inspect lists names the relay terminates TLS for without a secret,
	// so every request's Host (HTTP/2 :authority) and method is judged
	// as on plain HTTP: fronting inside TLS is refused there.
	Inspect Names
	// Rule and RuleID name the rule in events.
	Rule   string
	RuleID uint32
}

func (p *Policy) unnamed(port uint16) bool {
	for _, u := range p.UnnamedPorts {
		if port >= u.Lo && port <= u.Hi {
			return true
		}
	}
	return false
}

// PortRange is an inclusive range of ports.
type PortRange struct{ Lo, Hi uint16 }

// Names matches DNS names against entries in the policy's name syntax:
// "example.com" that name, "*.example.com" names below it, ".example.com"
// the name and below.
type Names struct {
	exact, below, andBelow map[string]bool
}

// NewNames compiles entries.
func NewNames(entries []string) Names {
	n := Names{exact: map[string]bool{}, below: map[string]bool{}, andBelow: map[string]bool{}}
	for _, e := range entries {
		e = normName(strings.TrimSpace(e))
		switch {
		case strings.HasPrefix(e, "*."):
			n.below[e[2:]] = true
		case strings.HasPrefix(e, "."):
			n.andBelow[e[1:]] = true
		case e != "":
			n.exact[e] = true
		}
	}
	return n
}

// Match reports whether name matches an entry.
func (n Names) Match(name string) bool {
	name = normName(name)
	if name == "" {
		return false
	}
	if n.exact[name] || n.andBelow[name] {
		return true
	}
	for i := 0; i < len(name); i++ {
		if name[i] == '.' {
			s := name[i+1:]
			if n.below[s] || n.andBelow[s] {
				return true
			}
		}
	}
	return false
}

// isAddress reports whether a name on the wire is an IP literal (a Host
// header "198.18.0.1" or "[2001:db8::1]"): no name at all.
func isAddress(name string) bool {
	name = strings.TrimSuffix(strings.TrimPrefix(name, "["), "]")
	_, err := netip.ParseAddr(name)
	return err == nil
}
