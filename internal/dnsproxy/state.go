package dnsproxy

import (
	"container/list"
	"fmt"
	"hash/maphash"
	"sync"
	"time"

	"github.com/miekg/dns"
	"github.com/watcherhq/watcher/internal/textesc"
)

// Bounds of the stream state, so that memory stays flat under a stream of
// unique names: per sandbox, at most maxDomainsPerSandbox domains of names
// an allowlist entry matches and as many of all other names (least
// recently used dropped first, each table on its own, so a flood of
// unlisted names never pushes out an allowed domain's budget), and at most
// maxCutsPerSandbox cut-offs, kept apart from both tables until they
// expire. Per domain, at most limit+1 name hashes (the count stops
// mattering once the limit is passed).
const (
	maxDomainsPerSandbox = 4096
	// maxCutsPerSandbox bounds the cut-offs of one sandbox. A cut-off is
	// never dropped before it expires: when the table is full of
	// allowlisted domains' cut-offs, the whole sandbox is cut off instead
	// (fail closed).
	maxCutsPerSandbox = 4096
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
	mu sync.Mutex
	// listed holds domains of names an allowlist entry matched; other
	// the rest (unlisted, default-allowed, denied names).
	listed, other domainTable
	cuts          map[string]cutOff
	// allCutUntil cuts every domain off: set when the cut-off table is
	// full of allowlisted domains (fail closed).
	allCutUntil time.Time

	// token buckets: all queries, and rare types
	all, rare bucket
}

// cutOff is a domain cut off until a time.
type cutOff struct {
	until  time.Time
	reason string
	listed bool
}

// domainTable is a bounded LRU of domain states.
type domainTable struct {
	m   map[string]*list.Element // of *domainState
	lru list.List                // front = most recent
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
	// sliding window. channel is the model of the symbols asked
	// (channel.go), charged to the same window.
	info    infoState
	channel channelState
	// charged counts the forwarded queries charged since the window
	// began, for the alert.
	charged int
}

func newSandboxState() *sandboxState {
	return &sandboxState{listed: domainTable{m: map[string]*list.Element{}}, other: domainTable{m: map[string]*list.Element{}},
		cuts: map[string]cutOff{}}
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
// recently used one beyond the bound). Caller holds the sandbox's lock.
func (t *domainTable) domain(name string) *domainState {
	if e, ok := t.m[name]; ok {
		t.lru.MoveToFront(e)
		return e.Value.(*domainState)
	}
	if t.lru.Len() >= maxDomainsPerSandbox {
		oldest := t.lru.Back()
		d := oldest.Value.(*domainState)
		delete(t.m, d.domain)
		// Reuse the evicted struct: no garbage per new domain.
		*d = domainState{domain: name, names: d.names[:0]}
		oldest.Value = d
		t.lru.MoveToFront(oldest)
		t.m[name] = oldest
		return d
	}
	d := &domainState{domain: name}
	t.m[name] = t.lru.PushFront(d)
	return d
}

// domainFor returns a domain's state from the table its names belong to:
// the allowlisted table once any allowlisted name was asked under it (a
// state the other table held moves over), so one domain has one budget.
// Caller holds the sandbox's lock.
func (st *sandboxState) domainFor(domain string, listed bool) *domainState {
	if e, ok := st.listed.m[domain]; ok || !listed {
		if ok {
			st.listed.lru.MoveToFront(e)
			return e.Value.(*domainState)
		}
		return st.other.domain(domain)
	}
	if e, ok := st.other.m[domain]; ok {
		st.other.lru.Remove(e)
		delete(st.other.m, domain)
		d := st.listed.domain(domain)
		*d = *e.Value.(*domainState)
		return d
	}
	return st.listed.domain(domain)
}

// lookup returns a domain's state without touching the LRU order, nil when
// neither table holds it. Caller holds the sandbox's lock.
func (st *sandboxState) lookup(domain string) *domainState {
	if e, ok := st.listed.m[domain]; ok {
		return e.Value.(*domainState)
	}
	if e, ok := st.other.m[domain]; ok {
		return e.Value.(*domainState)
	}
	return nil
}

// cutFor reports whether domain is cut off now. Caller holds st.mu.
func (st *sandboxState) cutFor(domain string, now time.Time) (string, bool) {
	if now.Before(st.allCutUntil) {
		return ReasonAllCut, true
	}
	c, ok := st.cuts[domain]
	if !ok {
		return "", false
	}
	if !now.Before(c.until) {
		delete(st.cuts, domain)
		return "", false
	}
	return c.reason, true
}

// cut cuts domain off until until. Caller holds st.mu.
func (st *sandboxState) cut(domain, reason string, listed bool, until, now time.Time) {
	if _, ok := st.cuts[domain]; !ok && len(st.cuts) >= maxCutsPerSandbox {
		for d, c := range st.cuts {
			if !now.Before(c.until) {
				delete(st.cuts, d)
			}
		}
		if len(st.cuts) >= maxCutsPerSandbox {
			// An unlisted domain's names are refused anyway: its
			// cut-off goes first. An allowlisted domain's never does.
			for d, c := range st.cuts {
				if !c.listed {
					delete(st.cuts, d)
					break
				}
			}
		}
		if len(st.cuts) >= maxCutsPerSandbox {
			st.allCutUntil = maxTime(st.allCutUntil, until)
			return
		}
	}
	st.cuts[domain] = cutOff{until: until, reason: reason, listed: listed}
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
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

// queryFacts is what observe needs to know of a query besides its name.
type queryFacts struct {
	qtype uint16
	// listed: an allowlist entry matched the name (the protected table).
	listed bool
	// forwarded: the query will reach the upstream (allowed, not
	// answered from the cache), so the channel model charges it.
	forwarded bool
}

// observeQuery records a query and reports whether its domain is (now) cut
// off, with the reason; alert is set, with the numbers, when this query
// cut the domain off.
func (st *sandboxState) observeQuery(sb *compiledSandbox, info *nameInfo, q queryFacts, now time.Time) (cut bool, reason, alert string) {
	if info.domain == "" {
		return false, "", ""
	}
	lim := sb.limits
	factor := 1
	if sb.highCardinality.matchTree(info.domain) || sb.highCardinality.matchTree(info.name) {
		factor = lim.hcFactor
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if why, ok := st.cutFor(info.domain, now); ok {
		return true, why, ""
	}
	d := st.domainFor(info.domain, q.listed)
	if now.Sub(d.windowStart) > lim.window {
		*d = domainState{domain: d.domain, windowStart: now, names: d.names[:0], info: d.info, channel: d.channel}
	}
	var bits float64
	if q.forwarded {
		headBits, isNew := d.info.newHead(info.head)
		qbits := d.channel.charge(symbolHash(info.head, q.qtype), q.qtype, isNew, headBits, now)
		bits = d.info.charge(qbits, now, lim.infoWindow)
		d.charged++
	} else {
		bits = d.info.add(info.head, now, lim.infoWindow)
	}
	d.queries++
	if isTunnelType(q.qtype) {
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
	budget := lim.infoBits * float64(factor)
	switch {
	case d.encoded >= lim.encoded:
		reason = ReasonEncodedStream
	case bits > budget:
		reason = ReasonInfoBudget
		alert = fmt.Sprintf("DNS channel to %s over its budget: %.0f bits in the last %s (budget %.0f); %d forwarded queries in the last %s, %d symbols (name, type) in use; cut off for %s",
			textesc.String(d.domain), bits, lim.infoWindow, budget, d.charged, lim.window, len(d.channel.syms), lim.blockFor)
	case d.distinct >= minStreamQueries && d.tunnelTypes*2 >= d.queries:
		reason = ReasonTunnelTypes
	}
	if reason == "" {
		return false, "", ""
	}
	reason += " under " + d.domain
	st.cut(d.domain, reason, q.listed, now.Add(lim.blockFor), now)
	return true, reason, alert
}

// answered records how long the answer to a forwarded query lives, for
// the channel model's renewals.
func (st *sandboxState) answered(domain, head string, qtype uint16, ttl time.Duration, expires time.Time) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if d := st.lookup(domain); d != nil {
		d.channel.answered(symbolHash(head, qtype), ttl, expires)
	}
}

// observeAnswer records the upstream's answer code for a name's domain; a
// domain whose distinct names mostly do not exist is cut off.
func (st *sandboxState) observeAnswer(sb *compiledSandbox, domain string, rcode int, now time.Time) {
	st.mu.Lock()
	defer st.mu.Unlock()
	d := st.lookup(domain)
	if d == nil {
		return
	}
	d.answered++
	if rcode == dns.RcodeNameError {
		d.nxdomain++
	}
	if d.distinct >= minStreamQueries && d.nxdomain*4 >= d.answered*3 {
		if _, cut := st.cutFor(domain, now); !cut {
			_, listed := st.listed.m[domain]
			st.cut(domain, ReasonNXStream+" under "+d.domain, listed, now.Add(sb.limits.blockFor), now)
		}
	}
}

// domainCount returns how many domains the sandbox tracks (for tests of
// the memory bound).
func (st *sandboxState) domainCount() int {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.listed.lru.Len() + st.other.lru.Len()
}
