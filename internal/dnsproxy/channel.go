package dnsproxy

import (
	"hash/maphash"
	"math"
	"time"

	"github.com/miekg/dns"
)

// The channel a sandbox has to a domain's authoritative servers is not only
// the bits in new names (info.go): which of the names it already used it
// asks, with which query type, carries as much. 256 names paid for once
// carry a byte per query by which one is asked; eight query types carry
// three bits (issue 27). So every query that reaches the upstream is
// charged what its choice could carry given the recent history of the
// domain, a per-domain model of the symbols (head, query type) asked:
//
//   - a symbol never asked costs the head's new bits (info.go) when the
//     head is new, else an escape, log2 of the recent query mass;
//   - a symbol asked before costs -log2 of its share of the recent queries
//     (an aging frequency table: weights halve every channelHalfLife, so
//     what was learnt ages out): a uniform choice among 256 names costs 8
//     bits, the one name a stub asks again and again nothing (below
//     channelFloorBits);
//   - a renewal, the first query for a symbol after its cached answer
//     expired (an answer of at least renewalMinTTL, asked again within
//     renewalStale of its expiry), costs log2(1+rank), rank being the
//     number of the domain's other due renewals that expired before it: a
//     stub that asks its names again every TTL renews them in expiry order
//     for free, a sender that chooses the order pays for the choice;
//   - a query type outside A, AAAA, HTTPS, SVCB and CNAME costs at least
//     uncommonTypeBits and is never a free renewal.
//
// Answers from the proxy's cache reach no upstream and cost nothing. What
// stays uncharged is timing: when a renewal comes, within its window.

const (
	maxChannelSymbols = 256
	channelHalfLife   = 5 * time.Minute
	renewalMinTTL     = 10 * time.Second
	renewalStale      = time.Minute
	uncommonTypeBits  = 3
	maxEscapeBits     = 16
	// channelFloorBits: a choice this predictable (a share above 93%)
	// costs nothing, so a stub asking its one name again and again is
	// not charged for the escape mass. A sender hiding bits in such
	// choices pays for the rare ones: at most a third of its charge
	// rides free.
	channelFloorBits = 0.1
	// symbols lighter than this are forgotten (about 35 minutes unused).
	minSymbolWeight = 0.01
)

var symbolSeed = maphash.MakeSeed()

// commonType reports the types every web client asks.
func commonType(qtype uint16) bool {
	switch qtype {
	case dns.TypeA, dns.TypeAAAA, dns.TypeHTTPS, dns.TypeSVCB, dns.TypeCNAME:
		return true
	}
	return false
}

// symbolHash identifies a (head, type) symbol.
func symbolHash(head string, qtype uint16) uint64 {
	var h maphash.Hash
	h.SetSeed(symbolSeed)
	h.WriteString(head)
	h.WriteByte(byte(qtype >> 8))
	h.WriteByte(byte(qtype))
	return h.Sum64()
}

type channelSymbol struct {
	h       uint64
	w       float32
	ttl     uint32 // seconds, of the last answer
	expires int64  // unix nanoseconds when the last answer expired or expires
}

// channelState is the symbol model of one domain in one sandbox.
type channelState struct {
	syms  []channelSymbol
	total float64 // sum of the weights
	at    int64   // when the weights were last aged (unix nanoseconds)
}

func (c *channelState) age(now time.Time) {
	n := now.UnixNano()
	if c.at == 0 || n <= c.at {
		c.at = max(c.at, n)
		return
	}
	f := math.Exp2(-float64(n-c.at) / float64(channelHalfLife))
	c.at = n
	c.total = 0
	kept := c.syms[:0]
	for _, s := range c.syms {
		s.w *= float32(f)
		if s.w < minSymbolWeight {
			continue
		}
		c.total += float64(s.w)
		kept = append(kept, s)
	}
	c.syms = kept
}

func (c *channelState) find(h uint64) int {
	for i := range c.syms {
		if c.syms[i].h == h {
			return i
		}
	}
	return -1
}

// renewal reports whether asking s now renews an expired answer.
func (s *channelSymbol) renewal(now int64) bool {
	return s.ttl >= uint32(renewalMinTTL/time.Second) && s.expires != 0 && now >= s.expires &&
		now-s.expires <= int64(renewalStale)
}

// rank counts the due renewals that expired before symbol i (ties broken
// by hash, so answers that expire together are no free choice).
func (c *channelState) rank(i int, now int64) int {
	n := 0
	si := &c.syms[i]
	for j := range c.syms {
		sj := &c.syms[j]
		if j != i && sj.renewal(now) && (sj.expires < si.expires || sj.expires == si.expires && sj.h < si.h) {
			n++
		}
	}
	return n
}

// charge returns the bits of one forwarded query for symbol h, whose head
// costs headBits when it is new to the domain (headNew), and records it.
func (c *channelState) charge(h uint64, qtype uint16, headNew bool, headBits float64, now time.Time) float64 {
	c.age(now)
	n := now.UnixNano()
	var bits float64
	i := c.find(h)
	switch {
	case i < 0 && headNew:
		bits = headBits
	case i < 0:
		bits = min(math.Log2(c.total+2), maxEscapeBits)
	case commonType(qtype) && c.syms[i].renewal(n):
		bits = math.Log2(1 + float64(c.rank(i, n)))
	default:
		bits = min(-math.Log2(float64(c.syms[i].w)/(c.total+1)), maxEscapeBits)
		if bits < channelFloorBits {
			bits = 0
		}
	}
	if !commonType(qtype) {
		bits = max(bits, uncommonTypeBits)
	}
	if i < 0 {
		if len(c.syms) >= maxChannelSymbols {
			// Forget the lightest: asked again, it pays an escape.
			light := 0
			for j := range c.syms {
				if c.syms[j].w < c.syms[light].w {
					light = j
				}
			}
			c.total -= float64(c.syms[light].w)
			c.syms[light] = c.syms[len(c.syms)-1]
			c.syms = c.syms[:len(c.syms)-1]
		}
		c.syms = append(c.syms, channelSymbol{h: h})
		i = len(c.syms) - 1
	}
	s := &c.syms[i]
	s.w++
	c.total++
	s.ttl, s.expires = 0, n // until the answer says how long it lives
	return bits
}

// answered records how long the answer to symbol h lives.
func (c *channelState) answered(h uint64, ttl time.Duration, expires time.Time) {
	if i := c.find(h); i >= 0 {
		c.syms[i].ttl = uint32(ttl / time.Second)
		c.syms[i].expires = expires.UnixNano()
	}
}
