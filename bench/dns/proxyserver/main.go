// Command proxyserver runs the DNS allowlist proxy alone for benchmarks
// (bench/dns/run.sh): one listener, one sandbox, a watcher policy file
// (its DNS policy compiled as the agent compiles it), upstreams.
//
//	go run ./bench/dns/proxyserver -listen 127.0.0.1:5391 -policy p.yaml -upstream 127.0.0.1:5390
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/watcherhq/watcher/internal/dnsproxy"
	"github.com/watcherhq/watcher/internal/plan"
	"github.com/watcherhq/watcher/internal/policy"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:5391", "address to serve on (UDP and TCP)")
	policyPath := flag.String("policy", "", "watcher policy file")
	sandbox := flag.String("sandbox", "bench", "sandbox of every query")
	upstreams := flag.String("upstream", "", "comma-separated upstream resolvers")
	statsEvery := flag.Duration("stats", 0, "log counters this often (0: only at exit)")
	flag.Parse()
	if err := run(*listen, *policyPath, *sandbox, *upstreams, *statsEvery); err != nil {
		fmt.Fprintln(os.Stderr, "proxyserver:", err)
		os.Exit(1)
	}
}

func run(listen, policyPath, sandbox, upstreams string, statsEvery time.Duration) error {
	p, err := policy.Load(policyPath)
	if err != nil {
		return err
	}
	pl, err := plan.Compile(p, plan.Env{}, plan.NewRuleTable())
	if err != nil {
		return err
	}
	s, err := dnsproxy.New(dnsproxy.Config{
		Listeners: []dnsproxy.Listener{{Addr: listen, Sandbox: sandbox}},
		Upstreams: strings.Split(upstreams, ","),
		Policy:    pl.DNS,
	})
	if err != nil {
		return err
	}
	if err := s.Start(); err != nil {
		return err
	}
	defer s.Close()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	log.Info("serving", "addrs", s.Addrs())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var tick <-chan time.Time
	if statsEvery > 0 {
		t := time.NewTicker(statsEvery)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			st := s.Stats()
			log.Info("stats", "queries", st.Queries, "allowed", st.Allowed, "blocked", st.Blocked,
				"refused", st.Refused, "cache_hits", st.CacheHits, "reasons", st.Reasons)
			return nil
		case <-tick:
			st := s.Stats()
			log.Info("stats", "queries", st.Queries, "allowed", st.Allowed, "blocked", st.Blocked, "cache_hits", st.CacheHits)
		}
	}
}
