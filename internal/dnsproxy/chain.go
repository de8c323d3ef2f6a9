package dnsproxy

import (
	"context"
	"time"

	"github.com/miekg/dns"
	"github.com/watcherhq/watcher/internal/audit"
)

// request is one query travelling down the chain.
type request struct {
	ctx context.Context
	raw []byte
	src QuerySource
	out []byte // response buffer to reuse

	now      time.Time
	msg      dns.Msg
	q        dns.Question
	qs       [1]dns.Question
	edns     bool
	udpSize  int
	qnameEnd int // end of the uncompressed question name in raw, 0 if compressed

	policy  *compiledPolicy
	sandbox *compiledSandbox
	state   *sandboxState

	info       nameInfo
	notAllowed bool
	// listed: an allowlist entry matched the name.
	listed bool
	// cached is the cache's answer, looked up once by detect (when
	// cacheLooked) for the channel charge and used by the cache stage.
	cachedT     *answerTemplate
	cacheLooked bool
	// alert, when set, is a channel alert with its numbers, emitted as
	// its own event beside the query's.
	alert string
	// probe is the agent's own canary probe (Config.OwnProbe).
	probe bool

	// Outcome, set by the stage that answers.
	resp     []byte
	verdict  audit.Verdict
	severity audit.Severity
	rcode    int
	reason   string
	answers  []string
	cached   bool
}

// stage is one handler of the chain: it answers the query (returns true)
// or passes it on.
type stage struct {
	name string
	fn   func(s *Server, r *request) bool
	// mayBlock marks stages that wait on the network; on the UDP path they
	// run on their own goroutine so the read loop keeps reading.
	mayBlock bool
}

// chain is the resolver pipeline, in order.
var chain = []stage{
	// 1. Wire format first: nothing below may see a query that is malformed,
	//    not a QUERY, multi-question, non-IN, ANY/AXFR or with odd EDNS.
	{name: "parse", fn: parseStage},
	// 2. Sandbox: policy, limits and state are per sandbox, and a client
	//    that belongs to none is refused before it costs anything more.
	{name: "sandbox", fn: sandboxStage},
	// 3. Rate limit before any per-name work, so a flood from one sandbox
	//    costs little and cannot starve the others.
	{name: "ratelimit", fn: rateLimitStage},
	// 4. Name syntax: bytes no hostname contains are refused, and count
	//    against their domain as encoded data (iodine's base128).
	{name: "name", fn: nameStage},
	// 5. Allow/deny lists: deny answers at once; a name off the allowlist is
	//    only marked, so detection still sees it and keeps the stream state.
	{name: "policy", fn: policyStage},
	// 6. Encoded-name and stream detection on every name, allowed or not.
	{name: "detect", fn: detectStage},
	// 7. Rare query types (TXT and the like): a small budget per sandbox,
	//    spent only by names that would be answered.
	{name: "rare", fn: rareStage},
	// 8. Shared TTL cache: policy was applied above, so one answer serves
	//    every sandbox allowed to have it.
	{name: "cache", fn: cacheStage},
	// 9. Forward to the upstream resolvers.
	{name: "forward", fn: forwardStage, mayBlock: true},
}

// process runs r through the chain and returns the response (nil: no
// answer). When async is set, stages that wait on the network continue on
// a new goroutine that hands the response to async; process then returns
// pending. Without async everything runs here.
func (s *Server) process(r *request, async func([]byte)) (resp []byte, pending bool) {
	if r.ctx == nil {
		r.ctx = context.Background()
	}
	r.now = s.now()
	s.stats.queries.Add(1)
	return s.runFrom(r, 0, async)
}

func (s *Server) runFrom(r *request, from int, async func([]byte)) ([]byte, bool) {
	for i := from; i < len(chain); i++ {
		st := chain[i]
		if st.mayBlock && async != nil {
			select {
			case s.inflight <- struct{}{}:
			default:
				// Too many queries waiting on upstreams: fail fast.
				s.servfail(r, ReasonUpstream)
				s.finish(r)
				return r.resp, false
			}
			// The read loop reuses raw and out: take copies.
			r.raw = append([]byte(nil), r.raw...)
			r.out = nil
			go func() {
				defer func() { <-s.inflight }()
				resp, _ := s.runFrom(r, i, nil)
				async(resp)
			}()
			return nil, true
		}
		if st.fn(s, r) {
			break
		}
	}
	s.finish(r)
	return r.resp, false
}
