package mcpwrap

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// BenchmarkRelayEcho times tools/call echo round trips to the test server
// straight and through the relay (uncaged: the relay's own cost), in the
// same run, and reports the ratio and the time the relay adds per call.
// ns/op counts both sessions' calls.
func BenchmarkRelayEcho(b *testing.B) {
	py, err := exec.LookPath("python3")
	if err != nil {
		b.Skip("python3 not installed")
	}
	script, _ := filepath.Abs("../../cmd/watcher/testdata/mcp/hostile_server.py")
	start := func(relay bool) (io.WriteCloser, *bufio.Reader, func()) {
		cmd := exec.Command(py, script)
		sin, _ := cmd.StdinPipe()
		sout, _ := cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		stop := func() { sin.Close(); cmd.Wait() }
		if !relay {
			return sin, bufio.NewReader(sout), stop
		}
		cin, cinW := io.Pipe()
		coutR, cout := io.Pipe()
		r := New(Config{Sandbox: "sb", Session: "bench"})
		go r.Run(context.Background(), cin, cout, sin, sout)
		return cinW, bufio.NewReader(coutR), func() { cinW.Close(); cmd.Wait() }
	}
	round := func(w io.Writer, rd *bufio.Reader, line string) {
		fmt.Fprintln(w, line)
		if _, err := rd.ReadBytes('\n'); err != nil {
			b.Fatal(err)
		}
	}
	// Both sessions open at once, calls alternating in batches: the
	// machine's load falls on both alike.
	type session struct {
		w    io.Writer
		rd   *bufio.Reader
		took time.Duration
	}
	open := func(relay bool) *session {
		w, rd, stop := start(relay)
		b.Cleanup(stop)
		round(w, rd, initLine)
		round(w, rd, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)
		return &session{w: w, rd: rd}
	}
	direct, relayed := open(false), open(true)
	b.ResetTimer()
	for i := 0; i < b.N; i += 50 {
		for _, s := range []*session{direct, relayed} {
			t0 := time.Now()
			for j := i; j < min(i+50, b.N); j++ {
				round(s.w, s.rd, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hello"}}}`, j+10))
			}
			s.took += time.Since(t0)
		}
	}
	b.ReportMetric(float64(direct.took.Nanoseconds())/float64(b.N), "direct-ns/call")
	b.ReportMetric(float64((relayed.took-direct.took).Nanoseconds())/float64(b.N), "added-ns/call")
	b.ReportMetric(float64(relayed.took)/float64(direct.took), "relayed/direct")
}
