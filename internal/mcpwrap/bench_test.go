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
// same run, and reports the ratio.
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
	measure := func(relay bool, n int) time.Duration {
		w, rd, stop := start(relay)
		defer stop()
		round(w, rd, initLine)
		round(w, rd, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)
		t0 := time.Now()
		for i := 0; i < n; i++ {
			round(w, rd, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hello"}}}`, i+10))
		}
		return time.Since(t0)
	}
	direct := measure(false, b.N)
	b.ResetTimer()
	relayed := measure(true, b.N)
	b.ReportMetric(float64(direct.Nanoseconds())/float64(b.N), "direct-ns/call")
	b.ReportMetric(float64(relayed)/float64(direct), "relayed/direct")
}
