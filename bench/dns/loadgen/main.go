// Command loadgen sends DNS queries at a fixed rate (open loop) and reports
// latency percentiles, which dnsperf 2.10 (Debian 12) does not.
//
//	go run ./bench/dns/loadgen -server 127.0.0.1:5391 -queries q.txt -qps 10000 -duration 10s
package main

import (
	"bufio"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
)

func main() {
	server := flag.String("server", "127.0.0.1:53", "server to query")
	queries := flag.String("queries", "", "dnsperf-format query file: NAME TYPE per line")
	qps := flag.Int("qps", 10000, "queries per second")
	duration := flag.Duration("duration", 10*time.Second, "how long to send")
	sockets := flag.Int("sockets", 4, "UDP sockets to spread queries over")
	unique := flag.Bool("unique", false, "prefix every name with a unique label")
	flag.Parse()
	if err := run(*server, *queries, *qps, *duration, *sockets, *unique); err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(1)
	}
}

type query struct {
	name  string
	qtype uint16
}

func load(path string) ([]query, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var qs []query
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) != 2 {
			continue
		}
		t, ok := dns.StringToType[strings.ToUpper(fields[1])]
		if !ok {
			return nil, fmt.Errorf("unknown type %q", fields[1])
		}
		qs = append(qs, query{dns.Fqdn(fields[0]), t})
	}
	if len(qs) == 0 {
		return nil, fmt.Errorf("%s: no queries", path)
	}
	return qs, sc.Err()
}

func run(server, path string, qps int, duration time.Duration, nsock int, unique bool) error {
	qs, err := load(path)
	if err != nil {
		return err
	}
	type sock struct {
		conn *net.UDPConn
		sent [65536]atomic.Int64 // send time (ns) by ID, 0 when answered
	}
	socks := make([]*sock, nsock)
	var mu sync.Mutex
	var lat []time.Duration
	var received atomic.Int64
	var wg sync.WaitGroup
	for i := range socks {
		raddr, err := net.ResolveUDPAddr("udp", server)
		if err != nil {
			return err
		}
		c, err := net.DialUDP("udp", nil, raddr)
		if err != nil {
			return err
		}
		c.SetReadBuffer(4 << 20)
		s := &sock{conn: c}
		socks[i] = s
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 4096)
			var local []time.Duration
			for {
				n, err := c.Read(buf)
				if err != nil {
					break
				}
				now := time.Now().UnixNano()
				if n < 2 {
					continue
				}
				id := uint16(buf[0])<<8 | uint16(buf[1])
				if t := s.sent[id].Swap(0); t != 0 {
					local = append(local, time.Duration(now-t))
					received.Add(1)
				}
			}
			mu.Lock()
			lat = append(lat, local...)
			mu.Unlock()
		}()
	}
	// Send in batches once per millisecond: Go timers cannot pace single
	// queries at 100 us, and a busy loop would starve the receivers.
	start := time.Now()
	var sent, skipped int64
	buf := make([]byte, 0, 512)
	var id uint16
	i := 0
	for {
		elapsed := time.Since(start)
		if elapsed >= duration {
			break
		}
		// Send whatever the schedule says is due by now, then sleep ~1 ms:
		// Go timers cannot pace single queries at 100 us, and a busy loop
		// would starve the receivers.
		due := int(elapsed.Seconds() * float64(qps))
		for ; i < due; i++ {
			q := qs[i%len(qs)]
			name := q.name
			if unique {
				name = fmt.Sprintf("u%x%x.%s", rand.Uint64(), i, name)
			}
			msg := new(dns.Msg)
			msg.SetQuestion(name, q.qtype)
			msg.SetEdns0(1232, false)
			id++
			msg.Id = id
			out, err := msg.PackBuffer(buf)
			if err != nil {
				return err
			}
			s := socks[i%nsock]
			if s.sent[id].Load() != 0 {
				skipped++ // previous query with this ID still unanswered
			}
			s.sent[id].Store(time.Now().UnixNano())
			s.conn.Write(out)
			sent++
		}
		time.Sleep(time.Millisecond)
	}
	elapsed := time.Since(start)
	time.Sleep(time.Second) // late answers
	for _, s := range socks {
		s.conn.Close()
	}
	wg.Wait()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	p := func(q float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		return lat[min(len(lat)-1, int(q*float64(len(lat))))]
	}
	var sum time.Duration
	for _, l := range lat {
		sum += l
	}
	avg := time.Duration(0)
	if len(lat) > 0 {
		avg = sum / time.Duration(len(lat))
	}
	fmt.Printf("sent=%d received=%d lost=%d rate=%.0f/s avg_us=%.1f p50_us=%.1f p99_us=%.1f p999_us=%.1f max_us=%.1f\n",
		sent, received.Load(), sent-received.Load(), float64(sent)/elapsed.Seconds(),
		us(avg), us(p(0.50)), us(p(0.99)), us(p(0.999)), us(p(1)))
	return nil
}

func us(d time.Duration) float64 { return float64(d) / 1e3 }
