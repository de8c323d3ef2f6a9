package egress_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// BenchmarkNameBinding measures what the relay costs, against the same
// sandbox with name binding off, in one run: a new connection per request
// (HTTPS and plain HTTP) and a bulk download (HTTPS and plain HTTP), from a
// Go client in the sandbox to the test CDN behind a veth pair (a fast
// network: the relay's share is larger than on a real one). Rounds
// alternate direct and relayed; the median round counts. Run with
// -benchtime=1x; nothing fails on a timing.
func BenchmarkNameBinding(b *testing.B) {
	rf := setupRelay(b)
	rf.net.ttl.Store(3600)
	sb := rf.sandbox
	if out, err := rf.curl(b, sb, "-4", "https://a.cdn.test/"); err != nil {
		b.Fatalf("resolve: %v: %s", err, out)
	}
	dest := netip.AddrPortFrom(rf.net.allowed, 443).String()
	plain := netip.AddrPortFrom(rf.net.allowed, 8080).String()
	const rounds, nReq, bulk = 5, 300, 256 << 20
	env := func(addr, scheme string, n int) []string {
		return []string{"WATCHER_ADDR=" + addr, "WATCHER_SCHEME=" + scheme, "WATCHER_N=" + strconv.Itoa(n), "WATCHER_CA=" + rf.cdn.caFile}
	}
	metrics := []benchMetric{
		{"https_conn_us", "bench-requests", dest, "https", nReq},
		{"http_conn_us", "bench-requests", plain, "http", nReq},
		{"https_bulk_MBps", "bench-download", dest, "https", bulk},
		{"http_bulk_MBps", "bench-download", plain, "http", bulk},
	}
	vals := map[string][]float64{}
	runRounds(b, rf, metrics, env, rounds, "", vals)
	// The same downloads over a 1 Gbit/s link (tbf on the CDN's side of
	// the veth pair): what a sandbox sees on a real network, where the
	// link, not the relay's CPU, is the limit.
	nsIf := "wte" + strings.TrimPrefix(rf.net.ns, "wte-") + "n"
	run(b, "ip", "netns", "exec", rf.net.ns, "tc", "qdisc", "add", "dev", nsIf, "root", "tbf", "rate", "1gbit", "burst", "1mb", "latency", "20ms")
	runRounds(b, rf, metrics[2:], env, rounds, "_1gbit", vals)
	st := rf.relay.Stats()
	if st.Refused != 0 || st.Passed < uint64(rounds*nReq) {
		b.Fatalf("relay stats %+v: every relayed request should pass", st)
	}
	med := map[string]float64{}
	for k, v := range vals {
		med[k] = median(v)
		b.ReportMetric(med[k], k)
	}
	fmt.Fprintf(os.Stderr, "name binding (median of %d rounds, Go client in the sandbox, CDN behind a veth pair):\n", rounds)
	for _, p := range []string{"https", "http"} {
		d, r := med[p+"_conn_us_direct"], med[p+"_conn_us_relayed"]
		fmt.Fprintf(os.Stderr, "  %-5s new connection + request: direct %.0f us, relayed %.0f us: +%.0f us per connection (%.2fx)\n", p, d, r, r-d, r/d)
	}
	for _, link := range []string{"", "_1gbit"} {
		for _, p := range []string{"https", "http"} {
			d, r := med[p+"_bulk_MBps"+link+"_direct"], med[p+"_bulk_MBps"+link+"_relayed"]
			fmt.Fprintf(os.Stderr, "  %-5s bulk download of %d MiB%s: direct %.0f MB/s, relayed %.0f MB/s: %.3fx of direct (goal >= 0.95)\n",
				p, bulk>>20, map[string]string{"": ", unshaped veth", "_1gbit": ", 1 Gbit/s link"}[link], d, r, r/d)
		}
	}
}

type benchMetric struct {
	name, mode, addr, scheme string
	n                        int
}

// runRounds measures every metric direct and relayed, rounds times,
// appending to vals under name+suffix+"_direct"/"_relayed".
func runRounds(b *testing.B, rf *relayFixture, metrics []benchMetric, env func(string, string, int) []string, rounds int, suffix string, vals map[string][]float64) {
	for range rounds {
		for _, relayed := range []bool{false, true} {
			var err error
			if relayed {
				err = rf.eg.SetRelay(sandboxID, rf.rc)
			} else {
				err = rf.eg.ClearRelay(sandboxID)
			}
			if err != nil {
				b.Fatal(err)
			}
			for _, m := range metrics {
				r, _ := rf.op(b, rf.sandbox, m.mode, env(m.addr, m.scheme, m.n)...)
				v, err := strconv.ParseFloat(r.text, 64)
				if !r.ok || err != nil {
					b.Fatalf("%s (relayed %v): %s", m.name, relayed, r)
				}
				k := m.name + suffix + map[bool]string{false: "_direct", true: "_relayed"}[relayed]
				vals[k] = append(vals[k], v)
			}
		}
	}
}

// benchClient is an HTTP client that dials WATCHER_ADDR whatever the URL
// names (a.cdn.test, answered before), so no DNS query is measured.
func benchClient(keepAlive bool) (*http.Client, string, error) {
	pool, err := loadCA()
	if err != nil {
		return nil, "", err
	}
	addr := os.Getenv("WATCHER_ADDR")
	tr := &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: pool, ServerName: "a.cdn.test"},
		DisableKeepAlives: !keepAlive,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp4", addr)
		},
		DisableCompression: true,
	}
	_, port, _ := net.SplitHostPort(addr)
	return &http.Client{Transport: tr}, os.Getenv("WATCHER_SCHEME") + "://a.cdn.test:" + port, nil
}

// helperBenchRequests makes WATCHER_N requests, each on a new connection,
// and prints the microseconds per request.
func helperBenchRequests(ctx context.Context) (string, error) {
	c, base, err := benchClient(false)
	if err != nil {
		return "", err
	}
	n, _ := strconv.Atoi(os.Getenv("WATCHER_N"))
	start := time.Now()
	for range n {
		body, err := httpGet(context.Background(), c, base+"/")
		if err != nil {
			return "", err
		}
		if !strings.HasPrefix(body, "GET host=a.cdn.test") {
			return "", fmt.Errorf("body %q", body)
		}
	}
	return fmt.Sprintf("%.1f", float64(time.Since(start).Microseconds())/float64(n)), nil
}

// helperBenchDownload downloads WATCHER_N bytes and prints MB/s.
func helperBenchDownload(ctx context.Context) (string, error) {
	c, base, err := benchClient(true)
	if err != nil {
		return "", err
	}
	n, _ := strconv.Atoi(os.Getenv("WATCHER_N"))
	start := time.Now()
	resp, err := c.Get(base + "/big?n=" + strconv.Itoa(n))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	got, err := io.Copy(io.Discard, resp.Body)
	if err != nil {
		return "", err
	}
	if got != int64(n) {
		return "", fmt.Errorf("got %d of %d bytes", got, n)
	}
	return fmt.Sprintf("%.1f", float64(n)/1e6/time.Since(start).Seconds()), nil
}
