package dnsproxy

import (
	"container/list"
	"hash/maphash"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// Bounds of the stream state, so that memory stays flat under a stream of
// unique names: at most maxDomainsPerSandbox domains per sandbox (least
// recently used dropped first) and, per domain, at most limit+1 name hashes
// (the count stops mattering once the limit is passed).
const (
	maxDomainsPerSandbox = 4096
	// maxStreamNames bounds the distinct-name hashes kept per domain (the
	// NXDOMAIN-ratio and record-type rules count distinct names).
	maxStreamNames = 256
	// minStreamQueries: the NXDOMAIN-ratio and record-type rules wait for
	// this many distinct names before judging a domain.
	minStreamQueries = 8
)

var nameHashSeed = maphash.MakeSeed()

// sandboxState is the detection and rate-limit state of one sandbox.
type sandboxState struct {
	mu      sync.Mutex
	domains map[string]*list.Element // of *domainState
	lru     list.List                // front = most recent

	// token buckets: all queries, and rare types
	all, rare bucket
}

// domainState counts what one sandbox asked under one tracking domain in the
// current window.
type domainState struct {
	domain      string
	windowStart time.Time
	names       []uint64 // distinct name hashes, capped
	distinct    int
	encoded     int
	answered    int
	nxdomain    int
	tunnelTypes int
	queries     int

	// info is the information estimate (info.go); it keeps its own
	// sliding window.
	info infoState

	blockedUntil time.Time
	blockReason  string
}

func newSandboxState() *sandboxState {
	return &sandboxState{domains: map[string]*list.Element{}}
}

// allow takes a token from the sandbox's bucket.
func (st *sandboxState) allow(rl RateLimit, now time.Time) bool {
	if rl.QPS <= 0 {
		return true
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.all.take(rl, now)
}

// allowRare takes a token from the sandbox's rare-type bucket.
func (st *sandboxState) allowRare(rl RateLimit, now time.Time) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.rare.take(rl, now)
}

// bucket is a token bucket; the caller holds the sandbox's lock.
type bucket struct {
	tokens float64
	last   time.Time
}

func (b *bucket) take(rl RateLimit, now time.Time) bool {
	if b.last.IsZero() {
		b.tokens = rl.Burst
	} else {
		b.tokens = min(rl.Burst, b.tokens+now.Sub(b.last).Seconds()*rl.QPS)
	}
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// domain returns the state of a domain, creating it (and evicting the least
// recently used one beyond the bound). Caller holds st.mu.
func (st *sandboxState) domain(name string) *domainState {
	if e, ok := st.domains[name]; ok {
		st.lru.MoveToFront(e)
		return e.Value.(*domainState)
	}
	if st.lru.Len() >= maxDomainsPerSandbox {
		oldest := st.lru.Back()
		d := oldest.Value.(*domainState)
		delete(st.domains, d.domain)
		// Reuse the evicted struct: no garbage per new domain.
		*d = domainState{domain: name, names: d.names[:0]}
		oldest.Value = d
		st.lru.MoveToFront(oldest)
		st.domains[name] = oldest
		return d
	}
	d := &domainState{domain: name}
	st.domains[name] = st.lru.PushFront(d)
	return d
}

// isTunnelType reports record types that tunnels favour for their larger
// answers and that ordinary clients rarely ask for.
func isTunnelType(qtype uint16) bool {
	switch qtype {
	case dns.TypeTXT, dns.TypeNULL, dns.TypeCNAME, dns.TypeMX, dns.TypeSRV:
		return true
	}
	return qtype >= 0xff00 // private-use range
}

// observe records a query for info.name and reports whether its domain is
// (now) cut off, with the reason.
func (st *sandboxState) observe(sb *compiledSandbox, info *nameInfo, qtype uint16, now time.Time) (cut bool, reason string) {
	if info.domain == "" {
		return false, ""
	}
	lim := sb.limits
	factor := 1
	if sb.highCardinality.matchTree(info.domain) || sb.highCardinality.matchTree(info.name) {
		factor = lim.hcFactor
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	d := st.domain(info.domain)
	if now.Before(d.blockedUntil) {
		return true, d.blockReason
	}
	if now.Sub(d.windowStart) > lim.window {
		*d = domainState{domain: d.domain, windowStart: now, names: d.names[:0], info: d.info}
	}
	bits := d.info.add(info.head, now, lim.infoWindow)
	d.queries++
	if isTunnelType(qtype) {
		d.tunnelTypes++
	}
	if info.encoded != "" {
		d.encoded++
	}
	h := maphash.String(nameHashSeed, info.name)
	seen := false
	for _, x := range d.names {
		if x == h {
			seen = true
			break
		}
	}
	if !seen {
		d.distinct++
		if len(d.names) <= maxStreamNames {
			d.names = append(d.names, h)
		}
	}
	switch {
	case d.encoded >= lim.encoded:
		reason = ReasonEncodedStream
	case bits > lim.infoBits*float64(factor):
		reason = ReasonInfoBudget
	case d.distinct >= minStreamQueries && d.tunnelTypes*2 >= d.queries:
		reason = ReasonTunnelTypes
	}
	if reason == "" {
		return false, ""
	}
	d.blockReason = reason + " under " + d.domain
	d.blockedUntil = now.Add(lim.blockFor)
	return true, d.blockReason
}

// observeAnswer records the upstream's answer code for a name's domain; a
// domain whose distinct names mostly do not exist is cut off.
func (st *sandboxState) observeAnswer(sb *compiledSandbox, domain string, rcode int, now time.Time) {
	st.mu.Lock()
	defer st.mu.Unlock()
	e, ok := st.domains[domain]
	if !ok {
		return
	}
	d := e.Value.(*domainState)
	d.answered++
	if rcode == dns.RcodeNameError {
		d.nxdomain++
	}
	if d.distinct >= minStreamQueries && d.nxdomain*4 >= d.answered*3 && d.blockReason == "" {
		d.blockReason = ReasonNXStream + " under " + d.domain
		d.blockedUntil = now.Add(sb.limits.blockFor)
	}
}

// domainCount returns how many domains the sandbox tracks (for tests of
// the memory bound).
func (st *sandboxState) domainCount() int {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.lru.Len()
}
