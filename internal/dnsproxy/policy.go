package dnsproxy

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"
)

// Policy is the DNS policy of every sandbox served by one proxy. It has no
// file format of its own: internal/plan builds it from the policy file's
// dns and egress sections (Plan.DNS), and the agent applies it with
// SetPolicy.
type Policy struct {
	// Sandboxes maps a sandbox name to its DNS policy.
	Sandboxes map[string]*SandboxPolicy
	// NegativeTTL is the TTL (and SOA minimum) of blocked answers, so that
	// a stub does not ask again at once nor remember the block for long.
	// Default 30s.
	NegativeTTL Duration
}

// SandboxPolicy is the DNS policy of one sandbox.
type SandboxPolicy struct {
	// Allow lists the names the sandbox may resolve. "pypi.org" matches that
	// name only, "*.pypi.org" the names strictly below it, and ".pypi.org"
	// the name and everything below it.
	Allow []string
	// Deny lists names that are refused even when Allow matches them; same
	// syntax as Allow.
	Deny []string
	// Default is what happens to names neither list matches: "deny" (the
	// default) or "allow". Encoded-name detection applies either way.
	Default string
	// HighCardinality lists domains (they and everything below) that
	// legitimately use many distinct, machine-made names, such as CDNs: the
	// per-domain distinct-name, data and randomness limits are multiplied by
	// HighCardinalityFactor for them. Per-name detection still applies.
	HighCardinality []string
	// RateLimit bounds the queries per second of this sandbox.
	RateLimit RateLimit
	// RareTypes bounds queries of rarely needed types (TXT and every type
	// but A, AAAA, CNAME, PTR, MX, SRV, NS, SOA, HTTPS, SVCB, CAA, DS,
	// DNSKEY, TLSA, NAPTR), which carry the most data per answer. Default
	// 0.2 per second with a burst of 20. NULL and private-use types are
	// never served.
	RareTypes RateLimit
	// Detection tunes the encoded-name and stream detection.
	Detection Detection
	// LocalAllow lists the networks of local addresses this sandbox's
	// answers may carry: loopback, link-local, private, unique-local, cloud
	// metadata and the host's own addresses are refused in answers
	// otherwise (DNS rebinding). The planner fills it from the sandbox's
	// explicit egress rules (egress.allow, loopback services), parsed by
	// policy.ParseCIDR.
	LocalAllow []netip.Prefix
	// RecordOnly is set for a sandbox in record mode: names the allow and
	// deny lists would refuse are forwarded, and the event is a
	// would-refuse record instead of a refusal.
	RecordOnly bool
}

// RateLimit is a token bucket.
type RateLimit struct {
	// QPS is the sustained rate; 0 means unlimited.
	QPS float64
	// Burst is the bucket size; default 2*QPS (at least 1).
	Burst float64
}

// Detection tunes detection for one sandbox. Zero values take the
// documented defaults (see the package documentation for the model).
type Detection struct {
	// Mode is "enforce" (default: block), "record" (allow, but record an
	// alert event for what enforce would have blocked) or "off".
	Mode string
	// Window is the length of the per-domain counting window. Default 5m.
	Window Duration
	// BlockFor is how long a domain stays cut off once a stream limit is
	// reached. Default 30m.
	BlockFor Duration
	// MaxDistinctNames is ignored, carried from the policy file's
	// detection.max_distinct_names: the information budget (MaxInfoBits)
	// replaced the distinct-name cut.
	MaxDistinctNames int
	// MaxInfoBits is the information budget: the new bits name heads may
	// carry under one domain per InfoWindow (info.go) before the domain is
	// cut off. Default 4800 (600 bytes: a sustained byte per second is cut
	// within 10 minutes).
	MaxInfoBits float64
	// InfoWindow is the sliding window of the information budget. Default
	// 10m.
	InfoWindow Duration
	// MaxEncodedNames is the number of names judged encoded under one domain
	// per window that cuts the domain off. Default 2.
	MaxEncodedNames int
	// HighCardinalityFactor multiplies the limits above for domains listed
	// in HighCardinality. Default 16.
	HighCardinalityFactor int
}

// Duration is a time.Duration in a Policy.
type Duration time.Duration

// validate checks what the types do not: name patterns, the allowed
// values of the string fields, and non-negative limits.
func (p *Policy) validate() error {
	if len(p.Sandboxes) == 0 {
		return errors.New("no sandboxes defined")
	}
	for name, sp := range p.Sandboxes {
		if sp == nil {
			return fmt.Errorf("sandbox %q has no policy", name)
		}
		for _, list := range [][]string{sp.Allow, sp.Deny, sp.HighCardinality} {
			for _, e := range list {
				if err := checkPattern(e); err != nil {
					return fmt.Errorf("sandbox %q: %w", name, err)
				}
			}
		}
		for _, c := range sp.LocalAllow {
			if !c.IsValid() {
				return fmt.Errorf("sandbox %q: invalid LocalAllow network %v", name, c)
			}
		}
		switch sp.Default {
		case "", "deny", "allow":
		default:
			return fmt.Errorf("sandbox %q: default must be allow or deny, not %q", name, sp.Default)
		}
		switch sp.Detection.Mode {
		case "", "enforce", "record", "off":
		default:
			return fmt.Errorf("sandbox %q: detection mode must be enforce, record or off, not %q", name, sp.Detection.Mode)
		}
		if sp.RateLimit.QPS < 0 || sp.RateLimit.Burst < 0 || sp.RareTypes.QPS < 0 || sp.RareTypes.Burst < 0 {
			return fmt.Errorf("sandbox %q: negative rate limit", name)
		}
		if sp.Detection.MaxDistinctNames < 0 || sp.Detection.MaxEncodedNames < 0 ||
			sp.Detection.MaxInfoBits < 0 || sp.Detection.HighCardinalityFactor < 0 {
			return fmt.Errorf("sandbox %q: negative detection limit", name)
		}
	}
	return nil
}

// checkPattern validates one allow/deny/high-cardinality entry.
func checkPattern(e string) error {
	name := strings.TrimPrefix(strings.TrimPrefix(e, "*."), ".")
	name = strings.TrimSuffix(name, ".")
	if name == "" || len(name) > 253 {
		return fmt.Errorf("bad name pattern %q", e)
	}
	for label := range strings.SplitSeq(name, ".") {
		if label == "" || len(label) > 63 {
			return fmt.Errorf("bad name pattern %q: empty or over-long label", e)
		}
		for i := 0; i < len(label); i++ {
			c := label[i] | 0x20
			if !(c >= 'a' && c <= 'z' || label[i] >= '0' && label[i] <= '9' || label[i] == '-' || label[i] == '_') {
				return fmt.Errorf("bad name pattern %q: only letters, digits, '-' and '_' may appear, and '*.' or '.' only in front", e)
			}
		}
	}
	return nil
}

// compiledPolicy is a Policy prepared for lookups.
type compiledPolicy struct {
	sandboxes   map[string]*compiledSandbox
	negativeTTL uint32
}

type compiledSandbox struct {
	name            string
	allow, deny     nameSet
	highCardinality nameSet
	defaultAllow    bool
	rate            RateLimit
	rare            RateLimit
	mode            string // enforce, record, off
	recordOnly      bool   // lists record instead of refuse
	limits          streamLimits
	localAllow      []netip.Prefix
}

// streamLimits are the per-domain stream limits with defaults applied.
type streamLimits struct {
	window, blockFor time.Duration
	infoBits         float64
	infoWindow       time.Duration
	encoded          int
	hcFactor         int
}

// nameSet matches names against exact, below-only and name-and-below entries.
type nameSet struct {
	exact, below, andBelow map[string]bool
}

func newNameSet(entries []string) nameSet {
	s := nameSet{exact: map[string]bool{}, below: map[string]bool{}, andBelow: map[string]bool{}}
	for _, e := range entries {
		e = strings.ToLower(strings.TrimSuffix(e, "."))
		switch {
		case strings.HasPrefix(e, "*."):
			s.below[e[2:]] = true
		case strings.HasPrefix(e, "."):
			s.andBelow[e[1:]] = true
		default:
			s.exact[e] = true
		}
	}
	return s
}

// match reports whether name (lower case, no trailing dot) matches.
func (s *nameSet) match(name string) bool {
	if s.exact[name] || s.andBelow[name] {
		return true
	}
	if len(s.below) == 0 && len(s.andBelow) == 0 {
		return false
	}
	for i := 0; i < len(name); i++ {
		if name[i] == '.' {
			suffix := name[i+1:]
			if s.below[suffix] || s.andBelow[suffix] {
				return true
			}
		}
	}
	return false
}

// matchTree reports whether name is one of the entries or below one, treating
// every entry as "and below" (for high-cardinality domains).
func (s *nameSet) matchTree(name string) bool {
	if s.exact[name] || s.andBelow[name] || s.below[name] {
		return true
	}
	for i := 0; i < len(name); i++ {
		if name[i] == '.' {
			suffix := name[i+1:]
			if s.exact[suffix] || s.below[suffix] || s.andBelow[suffix] {
				return true
			}
		}
	}
	return false
}

func compilePolicy(p *Policy) *compiledPolicy {
	cp := &compiledPolicy{sandboxes: map[string]*compiledSandbox{}, negativeTTL: 30}
	if p.NegativeTTL > 0 {
		cp.negativeTTL = uint32(time.Duration(p.NegativeTTL) / time.Second)
	}
	for name, sp := range p.Sandboxes {
		d := sp.Detection
		cs := &compiledSandbox{
			name:            name,
			allow:           newNameSet(sp.Allow),
			deny:            newNameSet(sp.Deny),
			highCardinality: newNameSet(sp.HighCardinality),
			defaultAllow:    sp.Default == "allow",
			rate:            sp.RateLimit,
			mode:            d.Mode,
			recordOnly:      sp.RecordOnly,
			limits: streamLimits{
				window:     orDuration(d.Window, 5*time.Minute),
				blockFor:   orDuration(d.BlockFor, 30*time.Minute),
				infoBits:   orFloat(d.MaxInfoBits, 4800),
				infoWindow: orDuration(d.InfoWindow, 10*time.Minute),
				encoded:    orInt(d.MaxEncodedNames, 2),
				hcFactor:   orInt(d.HighCardinalityFactor, 16),
			},
		}
		for _, c := range sp.LocalAllow {
			cs.localAllow = append(cs.localAllow, c.Masked())
		}
		if cs.mode == "" {
			cs.mode = "enforce"
		}
		cs.rare = sp.RareTypes
		if cs.rare.QPS <= 0 {
			cs.rare.QPS = 0.2
		}
		if cs.rare.Burst <= 0 {
			cs.rare.Burst = max(20, cs.rare.QPS)
		}
		if cs.rate.QPS > 0 && cs.rate.Burst == 0 {
			cs.rate.Burst = max(2*cs.rate.QPS, 1)
		}
		cp.sandboxes[name] = cs
	}
	return cp
}

func orDuration(d Duration, def time.Duration) time.Duration {
	if d > 0 {
		return time.Duration(d)
	}
	return def
}

func orInt(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}

func orFloat(v, def float64) float64 {
	if v > 0 {
		return v
	}
	return def
}

// Allows returns a matcher of the names this policy lets be resolved (any
// case, trailing dot optional): not denied, and allowed or by default. The
// agent drops what answers for other names admitted when a reload drops
// them.
func (sp *SandboxPolicy) Allows() func(name string) bool {
	allow, deny := newNameSet(sp.Allow), newNameSet(sp.Deny)
	def := sp.Default == "allow"
	return func(name string) bool {
		name = strings.ToLower(strings.TrimSuffix(name, "."))
		return !deny.match(name) && (def || allow.match(name))
	}
}
