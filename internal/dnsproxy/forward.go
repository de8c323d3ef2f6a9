package dnsproxy

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// forwarder sends allowed queries to the upstream resolvers in order: UDP
// first, TCP when the UDP answer is truncated. Identical queries in flight
// at once share one upstream exchange.
type forwarder struct {
	upstreams []string
	udp, tcp  *dns.Client
	timeout   time.Duration

	mu       sync.Mutex
	inflight map[cacheKey]*flight
}

type flight struct {
	done chan struct{}
	msg  *dns.Msg
	err  error
}

func newForwarder(upstreams []string, timeout time.Duration) *forwarder {
	return &forwarder{
		upstreams: upstreams,
		udp:       &dns.Client{Net: "udp", Timeout: timeout, UDPSize: ednsUDPSize},
		tcp:       &dns.Client{Net: "tcp", Timeout: timeout},
		timeout:   timeout,
		inflight:  map[cacheKey]*flight{},
	}
}

// resolve returns the upstream answer for (name, qtype).
func (f *forwarder) resolve(ctx context.Context, name string, qtype uint16) (*dns.Msg, error) {
	k := cacheKey{strings.ToLower(name), qtype}
	f.mu.Lock()
	if fl, ok := f.inflight[k]; ok {
		f.mu.Unlock()
		select {
		case <-fl.done:
			return fl.msg, fl.err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	fl := &flight{done: make(chan struct{})}
	f.inflight[k] = fl
	f.mu.Unlock()

	fl.msg, fl.err = f.exchange(ctx, name, qtype)
	f.mu.Lock()
	delete(f.inflight, k)
	f.mu.Unlock()
	close(fl.done)
	return fl.msg, fl.err
}

func (f *forwarder) exchange(ctx context.Context, name string, qtype uint16) (*dns.Msg, error) {
	if len(f.upstreams) == 0 {
		return nil, errors.New("no upstream resolvers configured")
	}
	q := new(dns.Msg)
	q.SetQuestion(name, qtype)
	q.RecursionDesired = true
	q.SetEdns0(ednsUDPSize, false)
	var errs []error
	var last *dns.Msg
	for _, up := range f.upstreams {
		r, err := f.exchangeOne(ctx, q, up)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", up, err))
			continue
		}
		if r.Rcode == dns.RcodeServerFailure || r.Rcode == dns.RcodeRefused {
			// Another upstream may do better; keep this answer as a fallback.
			last = r
			errs = append(errs, fmt.Errorf("%s: %s", up, dns.RcodeToString[r.Rcode]))
			continue
		}
		return r, nil
	}
	if last != nil {
		return last, nil
	}
	return nil, fmt.Errorf("forward %s: %w", name, errors.Join(errs...))
}

func (f *forwarder) exchangeOne(ctx context.Context, q *dns.Msg, upstream string) (*dns.Msg, error) {
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	r, _, err := f.udp.ExchangeContext(ctx, q, upstream)
	if err == nil && r.Truncated {
		r, _, err = f.tcp.ExchangeContext(ctx, q, upstream)
	}
	if err != nil {
		return nil, err
	}
	if r.Id != q.Id || !r.Response || len(r.Question) != 1 ||
		!strings.EqualFold(r.Question[0].Name, q.Question[0].Name) || r.Question[0].Qtype != q.Question[0].Qtype {
		return nil, errors.New("reply does not match the query")
	}
	return r, nil
}
