package dnsproxy

import (
	"context"
	"encoding/base32"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// Replay of the evaluation corpus at realistic rates, one sandbox stream
// per session, on a simulated clock, through the whole proxy chain with a
// real upstream on loopback. It prints benign and malicious streams side by
// side and asserts the targets of the information budget:
//
//   - benign: every session of the corpus (the names under one registrable
//     domain, in corpus order, in sessions of at most 50 distinct names,
//     each asked as A and AAAA, 24 distinct names a minute) answered
//     without a single cut;
//   - tunnels: every tool's stream (family and parent domain, corpus order,
//     a query a second) cut within its first 20 queries;
//   - slow exfiltration: 1 byte per second sustained under one domain, in
//     five encodings, cut within 10 minutes.
//
// Rerun: bench/dns/info.sh (go test -v -run TestInformationBudgetReplay).

const (
	replaySessionNames = 50
	replayBenignGap    = 2500 * time.Millisecond // 24 distinct names a minute
	replayTunnelGap    = time.Second
	replayExfilFor     = 20 * time.Minute
)

type replayClock struct{ t time.Time }

func (c *replayClock) Now() time.Time { return c.t }

type replayer struct {
	t     *testing.T
	s     *Server
	clock *replayClock
}

func newReplayer(t *testing.T) *replayer {
	up := startUpstream(t)
	clock := &replayClock{t: time.Unix(1_750_000_000, 0)}
	pol := &Policy{Sandboxes: map[string]*SandboxPolicy{"eval": {Default: "allow", RareTypes: RateLimit{QPS: 100, Burst: 1000}}}}
	s, err := New(Config{HostAddrs: noHostAddrs, Upstreams: []string{up.addr}, Policy: pol, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	return &replayer{t: t, s: s, clock: clock}
}

// ask sends one query at the current simulated time.
func (p *replayer) ask(name string, qtype uint16) (rcode int, reason string) {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	m.SetEdns0(1232, false)
	raw, err := m.Pack()
	if err != nil {
		return -1, "invalid name"
	}
	var r dns.Msg
	if err := r.Unpack(p.s.HandlePacket(context.Background(), raw, evalSrc)); err != nil {
		p.t.Fatalf("unpack answer for %q: %v", name, err)
	}
	_, text, _ := ede(&r)
	return r.Rcode, text
}

// stream is one session's outcome.
type streamResult struct {
	queries, answered int
	firstCut          int           // query number of the first refusal, 0 if none
	cutAfter          time.Duration // simulated time of the first refusal
	lastAnswered      int
	reason            string
	// oldCut is where the former fixed cut (more than 16 distinct names
	// under one domain in 5 minutes, the proxy's old default) would have
	// refused the first query, 0 if never: the baseline of the same run.
	oldCut int
}

// run replays names (one per gap) as a fresh sandbox's session.
func (p *replayer) run(names []string, gap time.Duration, both bool) streamResult {
	p.s.resetState()
	p.s.cache = newAnswerCache(10000)
	start := p.clock.t
	var res streamResult
	type window struct {
		start time.Time
		names map[string]bool
	}
	old := map[string]*window{}
	for i, n := range names {
		if d := parentOf(n); d != "" && res.oldCut == 0 {
			w := old[d]
			if w == nil || p.clock.t.Sub(w.start) > 5*time.Minute {
				w = &window{start: p.clock.t, names: map[string]bool{}}
				old[d] = w
			}
			w.names[strings.ToLower(n)] = true
			if len(w.names) > 16 {
				res.oldCut = i + 1
			}
		}
		types := []uint16{dns.TypeA}
		if both {
			types = append(types, dns.TypeAAAA)
		}
		for _, qt := range types {
			res.queries++
			rc, reason := p.ask(n, qt)
			if rc == dns.RcodeSuccess {
				res.answered++
				res.lastAnswered = i + 1
			} else if res.firstCut == 0 {
				res.firstCut = i + 1
				res.cutAfter = p.clock.t.Sub(start)
				res.reason = reason
			}
		}
		p.clock.t = p.clock.t.Add(gap)
	}
	p.clock.t = p.clock.t.Add(time.Hour) // sessions do not overlap
	return res
}

// exfilNames spells data at rate bytes/s for d: chunk bytes per query.
func exfilNames(kind string, d time.Duration) ([]string, time.Duration) {
	rng := rand.New(rand.NewPCG(7, 11))
	data := make([]byte, int(d/time.Second))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	b32 := base32.StdEncoding.WithPadding(base32.NoPadding)
	words := make([]string, 256)
	syll := []string{"ba", "ke", "mo", "ri", "tu", "la", "ne", "so", "pi", "da", "go", "fe", "zu", "hi", "wa", "co"}
	for i := range words {
		words[i] = syll[i>>4] + syll[i&15] + "n"
	}
	var names []string
	chunk := map[string]int{"b32-30B": 30, "b32-60B-2labels": 60, "hex-8B": 8, "hex-1B": 1, "words-1B": 1}[kind]
	for seq, off := 0, 0; off+chunk <= len(data); seq, off = seq+1, off+chunk {
		c := data[off : off+chunk]
		var head string
		switch kind {
		case "b32-30B":
			head = strings.ToLower(b32.EncodeToString(c)) + fmt.Sprintf(".%d", seq)
		case "b32-60B-2labels":
			e := strings.ToLower(b32.EncodeToString(c))
			head = e[:48] + "." + e[48:] + fmt.Sprintf(".%d", seq)
		case "hex-8B":
			head = hex.EncodeToString(c) + fmt.Sprintf("-%d", seq)
		case "hex-1B":
			head = fmt.Sprintf("s%d-%s", seq, hex.EncodeToString(c))
		case "words-1B":
			head = fmt.Sprintf("%s%d", words[c[0]], seq)
		}
		names = append(names, head+".cdn-assets-eu.net")
	}
	return names, time.Duration(chunk) * time.Second
}

func TestInformationBudgetReplay(t *testing.T) {
	benign, malicious := loadCorpus(t)
	p := newReplayer(t)

	// Benign sessions.
	byDomain := map[string][]string{}
	var domains []string
	for _, r := range benign {
		d := parentOf(r.name)
		if d == "" {
			continue
		}
		if byDomain[d] == nil {
			domains = append(domains, d)
		}
		byDomain[d] = append(byDomain[d], r.name)
	}
	sessions, names, cuts, oldCuts := 0, 0, 0, 0
	var cutList []string
	for _, d := range domains {
		all := byDomain[d]
		for i := 0; i < len(all); i += replaySessionNames {
			chunk := all[i:min(i+replaySessionNames, len(all))]
			res := p.run(chunk, replayBenignGap, true)
			sessions++
			names += len(chunk)
			if res.oldCut != 0 {
				oldCuts++
			}
			if res.firstCut != 0 {
				cuts++
				cutList = append(cutList, fmt.Sprintf("%s(#%d %s)", d, res.firstCut, res.reason))
			}
		}
	}
	t.Logf("%-44s %8s %8s %14s %10s  %s", "stream", "queries", "answered", "budget cut", "old cut", "reason")
	t.Logf("%-44s %8d %8s %14s %10s  %d names in %d sessions", "benign sessions (24 names/min, A+AAAA)",
		2*names, "", fmt.Sprintf("%d sessions", cuts), fmt.Sprintf("%d sess.", oldCuts), names, sessions)
	for _, c := range cutList {
		t.Errorf("benign session cut: %s", c)
	}

	// Tunnel streams.
	streams := map[string][]string{}
	var order []string
	for _, r := range malicious {
		if strings.HasPrefix(r.category, "dga-") {
			continue
		}
		k := r.category + " " + parentOf(r.name)
		if streams[k] == nil {
			order = append(order, k)
		}
		streams[k] = append(streams[k], r.name)
	}
	for _, k := range order {
		if len(streams[k]) < 2 {
			continue // a single name with a made-up TLD: refused alone, no stream
		}
		res := p.run(streams[k], replayTunnelGap, false)
		t.Logf("%-44.44s %8d %8d %14s %10s  %s", "tunnel "+k, res.queries, res.answered, fmt.Sprintf("#%d", res.firstCut), oldCut(res), res.reason)
		if res.lastAnswered > 20 || res.firstCut == 0 {
			t.Errorf("tunnel %s: query #%d answered, first refusal #%d (want cut within 20)", k, res.lastAnswered, res.firstCut)
		}
	}

	// Slow exfiltration, 1 byte/s sustained.
	for _, kind := range []string{"b32-30B", "b32-60B-2labels", "hex-8B", "hex-1B", "words-1B"} {
		names, gap := exfilNames(kind, replayExfilFor)
		res := p.run(names, gap, false)
		t.Logf("%-44s %8d %8d %14s %10s  %s", "exfil 1 B/s "+kind, res.queries, res.answered,
			fmt.Sprintf("#%d %s", res.firstCut, res.cutAfter), oldCut(res), res.reason)
		if res.firstCut == 0 || res.cutAfter > 10*time.Minute {
			t.Errorf("exfil %s: cut at query #%d after %s (want within 10m)", kind, res.firstCut, res.cutAfter)
		}
	}
}

func oldCut(r streamResult) string {
	if r.oldCut == 0 {
		return "never"
	}
	return fmt.Sprintf("#%d", r.oldCut)
}
