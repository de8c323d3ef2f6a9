package dnsproxy

import (
	"hash/maphash"
	"math"
	"strings"
	"time"
)

// Information budget per domain (after ibHH, Ozery, Nadler and Shabtai,
// "Information-Based Heavy Hitters for Real-Time DNS Data Exfiltration
// Detection and Prevention", arXiv 2307.02614): what leaves through DNS is
// the information in the names, so the proxy estimates, per sandbox and
// tracking domain, the new bits each name head carries and cuts the domain
// off when a sliding window holds more than the budget. Counting distinct
// names instead punishes a CDN's dozens of cheap names a minute and misses
// an exfiltration that packs its data into few long ones.
//
// The estimate is a description length under a dictionary of what this
// sandbox already sent under the domain: a head is split into tokens
// (labels, and their parts between '-' and '_'); a token seen before costs
// a reference (log2 of the dictionary size), a new one costs the cheaper of
// its length under the hostname trigram model and its length as a uniform
// random string over its alphabet. A repeated name costs no new bits here;
// which known name (and type) is asked is charged by channel.go. Words
// ("static", "eu-west-1") are cheap under the model; encoded data costs
// what it carries, and cannot hide in letter case (the name is lower-cased
// first) or in the choice among known tokens (each reference is paid).

const (
	// maxInfoTokens and maxInfoNames bound the dictionary of one domain;
	// beyond them new entries are not remembered (and so cost in full when
	// repeated: the estimate errs towards more information).
	maxInfoTokens = 256
	maxInfoNames  = 256
	// recentTokens new tokens are kept as text, so a token that extends or
	// varies one of them ("onedscolprdeus06" after "onedscolprdcus73")
	// costs a reference and its new suffix only.
	recentTokens = 32
	// minSharedPrefix is the shortest shared prefix worth a reference.
	minSharedPrefix = 4
)

var infoSeed = maphash.MakeSeed()

// infoState is the information estimate of one domain in one sandbox.
type infoState struct {
	tokens []uint64 // hashes of tokens seen
	names  []uint64 // hashes of heads seen
	recent []string // the last recentTokens new tokens (a ring)
	next   int      // where the ring writes next
	// Sliding window: bits in the current and the previous window.
	cur, prev float64
	curStart  time.Time
}

func contains(hs []uint64, h uint64) bool {
	for _, x := range hs {
		if x == h {
			return true
		}
	}
	return false
}

// tokenBits is the cost of a token not seen before.
func tokenBits(tok string) float64 {
	if tok == "" {
		return 0
	}
	uniform := float64(len(tok))*math.Log2(alphabetSize(tok)) + math.Log2(float64(len(tok))+1)
	return min(hostModel.Bits(tok), uniform)
}

// newHead returns the bits of a head this domain has not seen (and
// remembers it); a head seen before is not new and costs nothing here (its
// choice is charged by the channel model, channel.go).
func (s *infoState) newHead(head string) (bits float64, isNew bool) {
	if head == "" {
		return 0, false
	}
	h := maphash.String(infoSeed, head)
	if contains(s.names, h) {
		return 0, false
	}
	if len(s.names) < maxInfoNames {
		s.names = append(s.names, h)
	}
	return s.headBits(head), true
}

// charge adds bits to the window and returns the window's estimate.
func (s *infoState) charge(bits float64, now time.Time, window time.Duration) float64 {
	s.roll(now, window)
	s.cur += bits
	return s.estimate(now, window)
}

// add charges the head of one query by its new bits alone and returns the
// window's estimate (names that reach no upstream).
func (s *infoState) add(head string, now time.Time, window time.Duration) float64 {
	bits, _ := s.newHead(head)
	return s.charge(bits, now, window)
}

// headBits is the description length of a new head given the dictionary,
// which it then extends.
func (s *infoState) headBits(head string) float64 {
	bits := 0.0
	start := 0
	for i := 0; i <= len(head); i++ {
		if i < len(head) && head[i] != '.' && head[i] != '-' && head[i] != '_' {
			continue
		}
		tok := head[start:i]
		start = i + 1
		if tok == "" {
			bits++ // an empty part ("rr3---sn") is a choice too
			continue
		}
		h := maphash.String(infoSeed, tok)
		if contains(s.tokens, h) {
			bits += math.Log2(float64(len(s.tokens)) + 1)
			continue
		}
		bits += s.newTokenBits(tok)
		if len(s.tokens) < maxInfoTokens {
			s.tokens = append(s.tokens, h)
		}
		if len(s.recent) < recentTokens {
			s.recent = append(s.recent, tok)
		} else {
			s.recent[s.next] = tok
			s.next = (s.next + 1) % recentTokens
		}
	}
	// Separators and the number of tokens: one bit per part.
	return bits + float64(strings.Count(head, ".")+strings.Count(head, "-")+strings.Count(head, "_"))
}

// newTokenBits is the cost of a token not in the dictionary: in full, or
// as a reference to a recent token it shares a prefix with plus the rest.
func (s *infoState) newTokenBits(tok string) float64 {
	best := tokenBits(tok)
	for _, r := range s.recent {
		p := 0
		for p < len(tok) && p < len(r) && tok[p] == r[p] {
			p++
		}
		if p < minSharedPrefix {
			continue
		}
		ref := math.Log2(float64(len(s.recent))+1) + math.Log2(float64(p)+1)
		best = min(best, ref+tokenBits(tok[p:]))
	}
	return best
}

// roll moves the window forward to now.
func (s *infoState) roll(now time.Time, window time.Duration) {
	if s.curStart.IsZero() {
		s.curStart = now
		return
	}
	elapsed := now.Sub(s.curStart)
	if elapsed < window {
		return
	}
	if elapsed < 2*window {
		s.prev = s.cur
	} else {
		s.prev = 0
	}
	s.cur = 0
	s.curStart = s.curStart.Add(elapsed / window * window)
}

// estimate is the bits sent in the last window: the current window's and
// the part of the previous one still inside it.
func (s *infoState) estimate(now time.Time, window time.Duration) float64 {
	frac := 1 - float64(now.Sub(s.curStart))/float64(window)
	return s.cur + s.prev*max(frac, 0)
}
