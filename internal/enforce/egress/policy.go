package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/parser"
)

// Policy is one sandbox's network egress policy, as written in YAML:
//
//	mode: enforce
//	grace: 30s
//	services:
//	  - {name: postgres, port: 5432, protocol: tcp}
//	allow:
//	  - {cidr: 10.20.0.0/16, ports: "443", protocol: tcp}
//	  - {cidr: "2001:db8::/32", ports: 8000-8100}
//
// Everything not listed is reachable only at addresses the DNS proxy
// answered for the sandbox, until the answer's TTL plus Grace.
type Policy struct {
	// Mode is "enforce" (refuse, the default) or "record" (allow, but
	// record every operation enforce would refuse).
	Mode string `yaml:"mode"`
	// Grace is added to each answer's TTL before its addresses are refused
	// again, as a Go duration ("30s"). Empty: the agent's default.
	Grace string `yaml:"grace"`
	// Services are local services the sandbox may reach on loopback
	// (127.0.0.0/8 and ::1) at the given ports.
	Services []Service `yaml:"services"`
	// Allow lists networks reachable without DNS.
	Allow []CIDRRule `yaml:"allow"`
}

// Service is a local service reachable on loopback.
type Service struct {
	// Name names the service in events and the ledger.
	Name string `yaml:"name"`
	// Port is a port ("5432") or an inclusive range ("8000-8010").
	Port PortSpec `yaml:"port"`
	// Protocol is tcp, udp or any (default tcp).
	Protocol string `yaml:"protocol"`
}

// CIDRRule allows a network.
type CIDRRule struct {
	// CIDR is an IPv4 or IPv6 network ("10.0.0.0/8", "2001:db8::/32"); a
	// bare address means that address alone.
	CIDR string `yaml:"cidr"`
	// Ports is a port or inclusive range; empty for every port.
	Ports PortSpec `yaml:"ports"`
	// Protocol is tcp, udp or any (the default).
	Protocol string `yaml:"protocol"`
}

// PortSpec is a port or an inclusive port range, written as a YAML number
// or string ("443", "8000-9000").
type PortSpec string

// UnmarshalYAML keeps the scalar as written; ParsePolicy checks it.
func (p *PortSpec) UnmarshalYAML(b []byte) error {
	s := strings.TrimSpace(string(b))
	if unq, err := strconv.Unquote(s); err == nil {
		s = unq
	} else if len(s) >= 2 && s[0] == '\'' && s[len(s)-1] == '\'' {
		s = s[1 : len(s)-1]
	}
	*p = PortSpec(s)
	return nil
}

// Range parses the spec; empty is every port.
func (p PortSpec) Range() (PortRange, error) {
	s := strings.TrimSpace(string(p))
	if s == "" {
		return PortRange{}, nil
	}
	lo, hi, isRange := strings.Cut(s, "-")
	l, err := parsePort(lo)
	if err != nil {
		return PortRange{}, fmt.Errorf("invalid port range %q: %w", s, err)
	}
	h := l
	if isRange {
		if h, err = parsePort(hi); err != nil {
			return PortRange{}, fmt.Errorf("invalid port range %q: %w", s, err)
		}
	}
	if h < l {
		return PortRange{}, fmt.Errorf("invalid port range %q: %d is above %d", s, l, h)
	}
	return PortRange{Lo: l, Hi: h}, nil
}

func parsePort(s string) (uint16, error) {
	n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 32)
	if err != nil {
		return 0, fmt.Errorf("%q is not a port number", strings.TrimSpace(s))
	}
	if n < 1 || n > 65535 {
		return 0, fmt.Errorf("port %d outside 1-65535", n)
	}
	return uint16(n), nil
}

func parseProtocol(s string, def Protocol) (Protocol, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "":
		return def, nil
	case "tcp":
		return ProtoTCP, nil
	case "udp":
		return ProtoUDP, nil
	case "any":
		return ProtoAny, nil
	}
	return 0, fmt.Errorf("protocol %q: want tcp, udp or any", s)
}

// ParsePolicy decodes and checks a policy. Unknown fields, invalid CIDRs,
// port ranges, protocols, modes and durations are errors naming the line.
func ParsePolicy(b []byte) (*Policy, error) {
	var p Policy
	if err := yaml.UnmarshalWithOptions(b, &p, yaml.Strict()); err != nil {
		return nil, fmt.Errorf("egress policy: %s", yaml.FormatError(err, false, false))
	}
	file, err := parser.ParseBytes(b, 0)
	if err != nil {
		return nil, fmt.Errorf("egress policy: %w", err)
	}
	fail := func(path string, format string, args ...any) error {
		return fmt.Errorf("egress policy: line %d: %s", lineOf(file, path), fmt.Sprintf(format, args...))
	}
	switch p.Mode {
	case "", "enforce", "record":
	default:
		return nil, fail("$.mode", "mode %q: want enforce or record", p.Mode)
	}
	if p.Grace != "" {
		if d, err := time.ParseDuration(p.Grace); err != nil || d < 0 {
			return nil, fail("$.grace", "grace %q is not a duration such as 30s", p.Grace)
		}
	}
	for i, s := range p.Services {
		at := fmt.Sprintf("$.services[%d]", i)
		if strings.TrimSpace(s.Name) == "" {
			return nil, fail(at, "service without a name")
		}
		if s.Port == "" {
			return nil, fail(at, "service %q without a port", s.Name)
		}
		if _, err := s.Port.Range(); err != nil {
			return nil, fail(at+".port", "service %q: %v", s.Name, err)
		}
		if _, err := parseProtocol(s.Protocol, ProtoTCP); err != nil {
			return nil, fail(at+".protocol", "service %q: %v", s.Name, err)
		}
	}
	for i, r := range p.Allow {
		at := fmt.Sprintf("$.allow[%d]", i)
		if _, err := parseCIDR(r.CIDR); err != nil {
			return nil, fail(at+".cidr", "%v", err)
		}
		if _, err := r.Ports.Range(); err != nil {
			return nil, fail(at+".ports", "%v", err)
		}
		if _, err := parseProtocol(r.Protocol, ProtoAny); err != nil {
			return nil, fail(at+".protocol", "%v", err)
		}
	}
	return &p, nil
}

func parseCIDR(s string) (netip.Prefix, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return netip.Prefix{}, errors.New("rule without a cidr")
	}
	if !strings.Contains(s, "/") {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("invalid CIDR %q: %w", s, err)
		}
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("invalid CIDR %q: %w", s, err)
	}
	if p.Addr().Zone() != "" {
		return netip.Prefix{}, fmt.Errorf("invalid CIDR %q: zones are not allowed", s)
	}
	return p, nil
}

// lineOf finds the line of the node at path, or of its nearest ancestor.
func lineOf(file *ast.File, path string) int {
	for p := path; p != "$" && p != ""; {
		if yp, err := yaml.PathString(p); err == nil {
			if n, err := yp.FilterFile(file); err == nil && n != nil && n.GetToken() != nil {
				return n.GetToken().Position.Line
			}
		}
		i := strings.LastIndexAny(p, ".[")
		if i <= 0 {
			break
		}
		p = p[:i]
	}
	return 1
}

// RuleName describes a rule id the policy produced, for events.
type RuleName struct {
	ID   uint32
	Name string
}

// Config translates the policy into the kernel configuration (proxy
// addresses are the agent's, set by the caller). Rule ids start at firstID;
// names lists them for the event reader.
func (p *Policy) Config(firstID uint32) (SandboxConfig, []RuleName, error) {
	cfg := SandboxConfig{RecordOnly: p.Mode == "record"}
	var names []RuleName
	id := firstID
	for _, s := range p.Services {
		ports, err := s.Port.Range()
		if err != nil {
			return cfg, nil, fmt.Errorf("service %q: %w", s.Name, err)
		}
		proto, err := parseProtocol(s.Protocol, ProtoTCP)
		if err != nil {
			return cfg, nil, fmt.Errorf("service %q: %w", s.Name, err)
		}
		for _, lo := range []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")} {
			cfg.Rules = append(cfg.Rules, Rule{ID: id, Prefix: lo, Ports: ports, Protocol: proto})
		}
		names = append(names, RuleName{ID: id, Name: "service:" + s.Name})
		id++
	}
	for _, r := range p.Allow {
		pfx, err := parseCIDR(r.CIDR)
		if err != nil {
			return cfg, nil, err
		}
		ports, err := r.Ports.Range()
		if err != nil {
			return cfg, nil, err
		}
		proto, err := parseProtocol(r.Protocol, ProtoAny)
		if err != nil {
			return cfg, nil, err
		}
		cfg.Rules = append(cfg.Rules, Rule{ID: id, Prefix: pfx, Ports: ports, Protocol: proto})
		names = append(names, RuleName{ID: id, Name: "allow:" + pfx.String()})
		id++
	}
	if _, err := cidrEntries(1, cfg.Rules); err != nil {
		return cfg, nil, err
	}
	return cfg, names, nil
}

// GraceDuration returns Grace parsed, or def when unset.
func (p *Policy) GraceDuration(def time.Duration) time.Duration {
	if d, err := time.ParseDuration(p.Grace); err == nil {
		return d
	}
	return def
}
