package namerelay

import (
	"net/netip"
	"slices"
	"sync"
	"time"
)

// MaxNamesPerSandbox bounds the (address, name) pairs kept per sandbox;
// beyond it the earliest-expiring pair goes first. A pair evicted while
// its answer is live makes a later connection carrying that name fail the
// "answered" test (the policy test still applies).
const MaxNamesPerSandbox = 16384

// Answers remembers which names the DNS proxy answered with which address
// to which sandbox, until the answer's TTL plus a grace period passes.
// Safe for concurrent use.
type Answers struct {
	Grace time.Duration
	now   func() time.Time

	mu sync.Mutex
	sb map[uint32]*sandboxAnswers
}

type sandboxAnswers struct {
	// byAddr maps an address to the names answered with it and their
	// expiry.
	byAddr map[netip.Addr]map[string]time.Time
	n      int
}

// NewAnswers returns an empty table; grace is added to every TTL.
func NewAnswers(grace time.Duration) *Answers {
	return &Answers{Grace: grace, now: time.Now, sb: map[uint32]*sandboxAnswers{}}
}

// Record notes that name was answered with addrs to sandbox id, for ttl.
func (a *Answers) Record(id uint32, name string, addrs []netip.Addr, ttl time.Duration) {
	name = normName(name)
	if name == "" || len(addrs) == 0 {
		return
	}
	exp := a.now().Add(ttl + a.Grace)
	a.mu.Lock()
	defer a.mu.Unlock()
	st := a.sb[id]
	if st == nil {
		st = &sandboxAnswers{byAddr: map[netip.Addr]map[string]time.Time{}}
		a.sb[id] = st
	}
	for _, ad := range addrs {
		ad = ad.Unmap()
		names := st.byAddr[ad]
		if names == nil {
			names = map[string]time.Time{}
			st.byAddr[ad] = names
		}
		if old, ok := names[name]; ok {
			if exp.After(old) {
				names[name] = exp
			}
			continue
		}
		if st.n >= MaxNamesPerSandbox {
			a.evictLocked(st)
		}
		names[name] = exp
		st.n++
	}
}

// evictLocked drops expired pairs, or else the earliest-expiring one.
func (a *Answers) evictLocked(st *sandboxAnswers) {
	now := a.now()
	var vAddr netip.Addr
	var vName string
	var vExp time.Time
	for ad, names := range st.byAddr {
		for n, exp := range names {
			if !exp.After(now) {
				st.drop(ad, n)
				continue
			}
			if vName == "" || exp.Before(vExp) {
				vAddr, vName, vExp = ad, n, exp
			}
		}
	}
	if st.n >= MaxNamesPerSandbox && vName != "" {
		st.drop(vAddr, vName)
	}
}

func (st *sandboxAnswers) drop(ad netip.Addr, name string) {
	names := st.byAddr[ad]
	if _, ok := names[name]; !ok {
		return
	}
	delete(names, name)
	st.n--
	if len(names) == 0 {
		delete(st.byAddr, ad)
	}
}

// Answered reports whether name was answered with addr to sandbox id and
// has not expired.
func (a *Answers) Answered(id uint32, addr netip.Addr, name string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	st := a.sb[id]
	if st == nil {
		return false
	}
	exp, ok := st.byAddr[addr.Unmap()][normName(name)]
	return ok && exp.After(a.now())
}

// Names lists the unexpired names answered with addr to sandbox id,
// sorted.
func (a *Answers) Names(id uint32, addr netip.Addr) []string {
	now := a.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	st := a.sb[id]
	if st == nil {
		return nil
	}
	var out []string
	for n, exp := range st.byAddr[addr.Unmap()] {
		if exp.After(now) {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// Forget drops everything known for sandbox id.
func (a *Answers) Forget(id uint32) {
	a.mu.Lock()
	delete(a.sb, id)
	a.mu.Unlock()
}

// Expire drops expired pairs of every sandbox.
func (a *Answers) Expire() {
	now := a.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, st := range a.sb {
		for ad, names := range st.byAddr {
			for n, exp := range names {
				if !exp.After(now) {
					st.drop(ad, n)
				}
			}
		}
	}
}
