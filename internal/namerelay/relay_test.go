package namerelay

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/testkit/poll"
)

// testRelay is a relay whose "kernel" sends every connection to dest for
// sandbox 1 (no BPF: the judging and relaying alone).
func testRelay(t *testing.T, dest netip.AddrPort, pol *Policy, maxConns int) (*Relay, *[]audit.Event, *sync.Mutex) {
	t.Helper()
	var mu sync.Mutex
	var evs []audit.Event
	answers := NewAnswers(time.Minute)
	answers.Record(1, "good.test", []netip.Addr{dest.Addr()}, time.Minute)
	r, err := New(Config{
		Listen:             []string{"127.0.0.1:0"},
		Lookup:             func(netip.AddrPort) (Conn, bool) { return Conn{SandboxID: 1, Dest: dest, PID: 42}, true },
		Policy:             func(id uint32) (*Policy, bool) { return pol, id == 1 },
		Answers:            answers,
		Events:             func(e audit.Event) { mu.Lock(); evs = append(evs, e); mu.Unlock() },
		HelloTimeout:       3 * time.Second,
		MaxConnsPerSandbox: maxConns,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r, &evs, &mu
}

// upstream is a plain HTTP server on loopback naming the Host it saw.
func upstream(t *testing.T) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.Method+" "+r.Host)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

func request(t *testing.T, relay netip.AddrPort, raw string) string {
	t.Helper()
	c, err := net.Dial("tcp", relay.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, raw)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return "error: " + err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.Status + ": " + string(b)
}

func TestRelayHTTP(t *testing.T) {
	up := upstream(t)
	r, evs, mu := testRelay(t, up, &Policy{Sandbox: "sb", ReadOnly: NewNames([]string{"good.test"})}, 0)
	addr := r.Addrs()[0]
	if got := request(t, addr, "GET / HTTP/1.1\r\nHost: good.test\r\n\r\n"); got != "200 OK: GET good.test" {
		t.Errorf("answered name: %s", got)
	}
	if got := request(t, addr, "GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n"); !strings.HasPrefix(got, "403 Forbidden: watcher: \"evil.test\" is not a name answered") {
		t.Errorf("fronted Host: %s", got)
	}
	if got := request(t, addr, "POST / HTTP/1.1\r\nHost: good.test\r\nContent-Length: 1\r\n\r\nx"); !strings.Contains(got, "read-only") {
		t.Errorf("POST to a read-only name: %s", got)
	}
	if got := request(t, addr, "GET / HTTP/1.0\r\n\r\n"); !strings.HasPrefix(got, "403") {
		t.Errorf("no Host: %s", got)
	}
	mu.Lock()
	defer mu.Unlock()
	var names []string
	for _, e := range *evs {
		if e.Verdict != audit.VerdictDenied || e.Process.TGID != 42 || e.Sandbox.Name != "sb" {
			t.Errorf("event %+v", e)
		}
		names = append(names, e.Net.Name)
	}
	if strings.Join(names, ",") != "evil.test,good.test," {
		t.Errorf("refusals named %q", names)
	}
}

func TestRelayConnectionCap(t *testing.T) {
	r, evs, mu := testRelay(t, upstream(t), &Policy{Sandbox: "sb"}, 2)
	addr := r.Addrs()[0]
	var held []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", addr.String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		held = append(held, c)
	}
	// Let the relay count both before the third arrives.
	poll.Within(2*time.Second, func() bool { return r.Stats().Accepted >= 2 })
	time.Sleep(50 * time.Millisecond)
	third, err := net.Dial("tcp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer third.Close()
	third.SetReadDeadline(time.Now().Add(time.Second))
	if _, err := third.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("third connection over the cap: %v, want EOF", err)
	}
	if r.Stats().OverLimit != 1 {
		t.Errorf("over limit = %d", r.Stats().OverLimit)
	}
	// The two held ones are still open (waiting for their first bytes).
	held[0].SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if _, err := held[0].Read(make([]byte, 1)); err == io.EOF {
		t.Error("a connection under the cap was closed")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(*evs) != 1 || !strings.Contains((*evs)[0].Net.Reason, "2 connections open") {
		t.Errorf("events: %+v", *evs)
	}
}

func TestRelayQuietHangUp(t *testing.T) {
	r, evs, mu := testRelay(t, upstream(t), &Policy{Sandbox: "sb"}, 0)
	c, err := net.Dial("tcp", r.Addrs()[0].String())
	if err != nil {
		t.Fatal(err)
	}
	c.Close() // the loser of a happy eyeballs race
	silent, err := net.Dial("tcp", r.Addrs()[0].String())
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	time.Sleep(3500 * time.Millisecond) // past the hello timeout of the silent one
	mu.Lock()
	defer mu.Unlock()
	if len(*evs) != 1 || !strings.Contains((*evs)[0].Net.Reason, "before the timeout") {
		t.Errorf("events: %+v", *evs)
	}
}

func TestRelayRecordOnlyPasses(t *testing.T) {
	r, evs, mu := testRelay(t, upstream(t), &Policy{Sandbox: "sb", RecordOnly: true}, 0)
	addr := r.Addrs()[0]
	// Fronted Host: recorded, and the request reaches the server.
	if got := request(t, addr, "GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n"); got != "200 OK: GET evil.test" {
		t.Errorf("fronted Host in record-only mode: %s", got)
	}
	// Neither TLS nor HTTP: recorded, and the bytes go on (the HTTP
	// server answers them with a 400).
	c, err := net.Dial("tcp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	io.WriteString(c, "\x01binary\r\n\r\n")
	b, _ := io.ReadAll(c)
	if !strings.HasPrefix(string(b), "HTTP/1.1 400") {
		t.Errorf("unnamed bytes in record-only mode: %q", b)
	}
	if st := r.Stats(); st.Recorded != 2 || st.Refused != 0 || st.Passed != 2 {
		t.Errorf("stats %+v", st)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, e := range *evs {
		if e.Verdict != audit.VerdictRecorded || !strings.Contains(e.Message, "recorded by name binding") {
			t.Errorf("event %+v", e)
		}
	}
}

func TestRelayRecordsAllowed(t *testing.T) {
	r, evs, mu := testRelay(t, upstream(t), &Policy{Sandbox: "sb", RecordAllowed: true}, 0)
	if got := request(t, r.Addrs()[0], "GET / HTTP/1.1\r\nHost: Good.Test:80\r\n\r\n"); got != "200 OK: GET Good.Test:80" {
		t.Fatalf("answered name: %s", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(*evs) != 1 || (*evs)[0].Verdict != audit.VerdictAllowed || (*evs)[0].Net.Name != "good.test" || (*evs)[0].Severity != audit.SeverityRoutine {
		t.Errorf("events: %+v", *evs)
	}
}
