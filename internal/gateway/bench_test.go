package gateway

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// BenchmarkReadFileCall: one read_file call over the gateway socket
// (JSON-RPC, policy, openat2 resolution, two ledger records), against
// reading the same 4 KiB text file with os.ReadFile in the same run. "x-direct"
// is the gateway call's time over the direct read's.
//
//	go test ./internal/gateway -run '^$' -bench ReadFileCall -benchtime 20000x
func BenchmarkReadFileCall(b *testing.B) {
	t := &testing.T{}
	_, _, sock, ws := testGateway(t, "      rate: 0\n")
	if t.Failed() {
		b.Fatal("gateway did not start")
	}
	data := []byte(strings.Repeat("func main() { fmt.Println(\"hello\") }\n", 4096/40))
	if err := os.WriteFile(filepath.Join(ws, "f"), data, 0o644); err != nil {
		b.Fatal(err)
	}
	c := dial(t, sock)
	ctx := context.Background()
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		if _, err := c.ReadFile(ctx, "b"+strconv.Itoa(i), "f"); err != nil {
			b.Fatal(err)
		}
	}
	call := time.Since(start) / time.Duration(b.N)
	b.StopTimer()
	start = time.Now()
	for i := 0; i < b.N; i++ {
		if _, err := os.ReadFile(filepath.Join(ws, "f")); err != nil {
			b.Fatal(err)
		}
	}
	direct := time.Since(start) / time.Duration(b.N)
	b.ReportMetric(float64(call.Microseconds()), "us/call")
	b.ReportMetric(float64(direct.Nanoseconds())/1000, "us/direct-read")
	b.ReportMetric(float64(call)/float64(direct), "x-direct")
}
