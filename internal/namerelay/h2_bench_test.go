package namerelay

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"sync"
	"testing"
	"time"
)

// BenchmarkTerminated measures requests to a terminated (secret-bound)
// name on loopback, Go client and destination on the same cores as the
// relay: direct to the destination (HTTP/2, no relay, no substitution),
// and through the relay with the client on HTTP/1.1 and on HTTP/2 (the
// relay speaks HTTP/2 upstream on the latter, HTTP/1.1 on the former).
// Sequential requests on a kept connection, then 16 at once. Rounds
// alternate the three; the median round counts. Run with -benchtime=1x;
// nothing fails on a timing.
func BenchmarkTerminated(b *testing.B) {
	f := newBrokerFixture(b, true)
	const rounds, serial, parallel, workers = 5, 400, 1600, 16
	direct := &http.Client{Transport: &http.Transport{
		TLSClientConfig:     &tls.Config{RootCAs: f.upCA},
		ForceAttemptHTTP2:   true,
		MaxIdleConnsPerHost: 16,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", f.dest.String())
		},
	}}
	clients := []struct {
		name  string
		c     *http.Client
		token string
	}{{"direct", direct, tokenValue}, {"relay_h1", f.client(false), tokenPlaceholder}, {"relay_h2", f.client(true), tokenPlaceholder}}
	get := func(c *http.Client, token string) {
		req, _ := http.NewRequest("GET", "https://api.test/", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := c.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("status %d", resp.StatusCode)
		}
	}
	seq := map[string][]float64{}  // us per request
	conc := map[string][]float64{} // requests per second
	for range rounds {
		for _, cl := range clients {
			get(cl.c, cl.token) // the connection is up before the clock starts
			start := time.Now()
			for range serial {
				get(cl.c, cl.token)
			}
			seq[cl.name] = append(seq[cl.name], float64(time.Since(start).Microseconds())/serial)
			start = time.Now()
			var wg sync.WaitGroup
			for range workers {
				wg.Go(func() {
					for range parallel / workers {
						get(cl.c, cl.token)
					}
				})
			}
			wg.Wait()
			conc[cl.name] = append(conc[cl.name], parallel/time.Since(start).Seconds())
		}
	}
	med := func(v []float64) float64 { slices.Sort(v); return v[len(v)/2] }
	fmt.Fprintf(os.Stderr, "terminated name on loopback (median of %d rounds):\n", rounds)
	d := med(seq["direct"])
	for _, cl := range clients {
		m := med(seq[cl.name])
		b.ReportMetric(m, "us/req_"+cl.name)
		fmt.Fprintf(os.Stderr, "  sequential, kept connection: %-8s %6.0f us/request (%.2fx of direct)\n", cl.name, m, m/d)
	}
	d = med(conc["direct"])
	for _, cl := range clients {
		m := med(conc[cl.name])
		b.ReportMetric(m, "req/s_16_"+cl.name)
		fmt.Fprintf(os.Stderr, "  %d at once:                  %-8s %6.0f requests/s (%.2fx of direct)\n", workers, cl.name, m, m/d)
	}
	if st := f.relay.Stats(); st.Refused != 0 {
		b.Fatalf("relay stats %+v: every request should pass", st)
	}
}
