package dnsproxy

import (
	"container/list"
	"encoding/binary"
	"errors"
	"hash/maphash"
	"net/netip"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// answerTemplate is an upstream answer packed once, ready to be sent to any
// client after patching the ID, flags, question case and TTLs: answering a
// cache hit costs a copy, not a pack.
type answerTemplate struct {
	wire       []byte   // ID 0, no OPT record
	ttlOffsets []uint16 // offsets of the TTL of every answer/authority RR
	ttls       []uint32 // original TTLs, same order
	rcode      int
	stored     time.Time
	expires    time.Time
	// addrs are the A/AAAA addresses in the answer and addrTTL the smallest
	// TTL among them, for the OnAnswer hook.
	addrs   []netip.Addr
	addrTTL uint32
	answers []string // presentation form of the answer RRs, for events
}

const (
	// Bounds on the TTL a cached answer is kept for.
	cacheMaxTTL = 24 * time.Hour
	// negativeCacheTTL caps how long NXDOMAIN/NODATA answers are kept
	// (RFC 2308 lets the SOA say, this caps it).
	negativeCacheMaxTTL = 5 * time.Minute
	// ednsUDPSize is the UDP payload size the proxy advertises (DNS flag
	// day 2020).
	ednsUDPSize = 1232
)

// newTemplate packs an upstream reply for reuse. The OPT record is dropped
// (the proxy adds its own per client).
func newTemplate(m *dns.Msg, now time.Time) (*answerTemplate, error) {
	c := *m
	c.Id = 0
	c.Extra = nil
	for _, rr := range m.Extra {
		if rr.Header().Rrtype != dns.TypeOPT {
			c.Extra = append(c.Extra, rr)
		}
	}
	c.Compress = true
	wire, err := c.Pack()
	if err != nil {
		return nil, err
	}
	t := &answerTemplate{wire: wire, rcode: m.Rcode, stored: now}
	if err := t.index(len(c.Answer) + len(c.Ns) + len(c.Extra)); err != nil {
		return nil, err
	}
	minTTL := uint32(cacheMaxTTL / time.Second)
	for _, rr := range c.Answer {
		minTTL = min(minTTL, rr.Header().Ttl)
		switch a := rr.(type) {
		case *dns.A:
			if ip, ok := netip.AddrFromSlice(a.A.To4()); ok {
				t.addrs = append(t.addrs, ip)
				t.addrTTL = minNonZero(t.addrTTL, a.Hdr.Ttl)
			}
		case *dns.AAAA:
			if ip, ok := netip.AddrFromSlice(a.AAAA.To16()); ok {
				t.addrs = append(t.addrs, ip)
				t.addrTTL = minNonZero(t.addrTTL, a.Hdr.Ttl)
			}
		}
		t.answers = append(t.answers, rr.String())
	}
	ttl := time.Duration(minTTL) * time.Second
	if len(c.Answer) == 0 {
		// Negative answer: the SOA's TTL, capped by its MINIMUM (RFC 2308).
		ttl = 0
		for _, rr := range c.Ns {
			if soa, ok := rr.(*dns.SOA); ok {
				ttl = time.Duration(min(soa.Hdr.Ttl, soa.Minttl)) * time.Second
			}
		}
		ttl = min(ttl, negativeCacheMaxTTL)
	}
	if m.Rcode != dns.RcodeSuccess && m.Rcode != dns.RcodeNameError {
		ttl = 0 // never cache failures
	}
	t.expires = now.Add(ttl)
	return t, nil
}

func minNonZero(a, b uint32) uint32 {
	if a == 0 {
		return b
	}
	return min(a, b)
}

var errBadWire = errors.New("malformed message")

// skipName returns the offset after the (possibly compressed) name at off.
func skipName(w []byte, off int) (int, error) {
	for {
		if off >= len(w) {
			return 0, errBadWire
		}
		l := int(w[off])
		switch {
		case l == 0:
			return off + 1, nil
		case l&0xC0 == 0xC0:
			return off + 2, nil
		case l&0xC0 != 0:
			return 0, errBadWire
		}
		off += 1 + l
	}
}

// index finds the TTL offsets of the template's resource records.
func (t *answerTemplate) index(rrs int) error {
	w := t.wire
	if len(w) < 12 {
		return errBadWire
	}
	off := 12
	for range binary.BigEndian.Uint16(w[4:]) {
		var err error
		if off, err = skipName(w, off); err != nil {
			return err
		}
		off += 4
	}
	an := int(binary.BigEndian.Uint16(w[6:]))
	ns := int(binary.BigEndian.Uint16(w[8:]))
	for i := range rrs {
		var err error
		if off, err = skipName(w, off); err != nil {
			return err
		}
		if off+10 > len(w) {
			return errBadWire
		}
		if i < an+ns {
			t.ttlOffsets = append(t.ttlOffsets, uint16(off+4))
			t.ttls = append(t.ttls, binary.BigEndian.Uint32(w[off+4:]))
		}
		off += 10 + int(binary.BigEndian.Uint16(w[off+8:]))
	}
	if off != len(w) {
		return errBadWire
	}
	return nil
}

// render writes the answer for a client query into dst: the query's ID, RD
// and CD bits and question bytes (its case), TTLs reduced by the time spent
// in cache, and an OPT record when the client sent one. It returns nil when
// the result would exceed maxSize (the caller truncates the slow way).
func (t *answerTemplate) render(dst []byte, query []byte, qnameEnd int, edns bool, now time.Time, maxSize int) []byte {
	out := append(dst[:0], t.wire...)
	binary.BigEndian.PutUint16(out, binary.BigEndian.Uint16(query))
	out[2] = out[2]&^0x01 | query[2]&0x01 // RD
	out[3] = out[3]&^0x10 | query[3]&0x10 // CD
	if qnameEnd <= len(out) && qnameEnd <= len(query) {
		copy(out[12:qnameEnd], query[12:qnameEnd])
	}
	age := uint32(now.Sub(t.stored) / time.Second)
	for i, off := range t.ttlOffsets {
		ttl := t.ttls[i]
		if ttl > age {
			ttl -= age
		} else {
			ttl = 0
		}
		binary.BigEndian.PutUint32(out[off:], ttl)
	}
	if edns {
		// Root name, type OPT, class = our UDP size, TTL 0, no options.
		out = append(out, 0, 0, 41, byte(ednsUDPSize>>8), byte(ednsUDPSize&0xff), 0, 0, 0, 0, 0, 0)
		binary.BigEndian.PutUint16(out[10:], binary.BigEndian.Uint16(out[10:])+1)
	}
	if len(out) > maxSize {
		return nil
	}
	return out
}

// cacheKey identifies a cached answer: lower-case name and type.
type cacheKey struct {
	name  string
	qtype uint16
}

// answerCache is a bounded, sharded LRU of answer templates.
type answerCache struct {
	shards [cacheShards]cacheShard
	seed   maphash.Seed
}

const cacheShards = 16

type cacheShard struct {
	mu    sync.Mutex
	items map[cacheKey]*list.Element
	lru   list.List
	max   int
}

type cacheItem struct {
	key cacheKey
	t   *answerTemplate
}

func newAnswerCache(entries int) *answerCache {
	c := &answerCache{seed: maphash.MakeSeed()}
	per := max(entries/cacheShards, 1)
	for i := range c.shards {
		c.shards[i].items = map[cacheKey]*list.Element{}
		c.shards[i].max = per
	}
	return c
}

func (c *answerCache) shard(k cacheKey) *cacheShard {
	return &c.shards[maphash.String(c.seed, k.name)%cacheShards]
}

func (c *answerCache) get(k cacheKey, now time.Time) *answerTemplate {
	s := c.shard(k)
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.items[k]
	if !ok {
		return nil
	}
	it := e.Value.(*cacheItem)
	if !now.Before(it.t.expires) {
		s.lru.Remove(e)
		delete(s.items, k)
		return nil
	}
	s.lru.MoveToFront(e)
	return it.t
}

func (c *answerCache) put(k cacheKey, t *answerTemplate) {
	if !t.expires.After(t.stored) {
		return
	}
	s := c.shard(k)
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.items[k]; ok {
		e.Value.(*cacheItem).t = t
		s.lru.MoveToFront(e)
		return
	}
	if s.lru.Len() >= s.max {
		old := s.lru.Back()
		delete(s.items, old.Value.(*cacheItem).key)
		s.lru.Remove(old)
	}
	s.items[k] = s.lru.PushFront(&cacheItem{key: k, t: t})
}

func (c *answerCache) len() int {
	n := 0
	for i := range c.shards {
		c.shards[i].mu.Lock()
		n += c.shards[i].lru.Len()
		c.shards[i].mu.Unlock()
	}
	return n
}
