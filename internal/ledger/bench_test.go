package ledger

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"golang.org/x/sys/unix"
)

// Benchmarks print, next to events/s and MB/s, the same figures for the raw
// cost of the work underneath, measured in the same run on the same bytes:
// SHA-256 of each record line plus write(2) in 512 KiB chunks and one
// fdatasync (append), or SHA-256 of each record line in memory (verify).
// "x-raw" is ledger throughput divided by raw throughput.
//
//	go test ./internal/ledger -run '^$' -bench . -benchtime 2000000x

func benchEvents() []audit.Event {
	evs := make([]audit.Event, 1024)
	for i := range evs {
		evs[i] = testEvent(i, i%10 == 0) // one alert in ten
	}
	return evs
}

func BenchmarkAppend(b *testing.B) {
	dir := b.TempDir()
	l, err := Open(dir, Options{})
	if err != nil {
		b.Fatal(err)
	}
	evs := benchEvents()
	before := l.Stats()
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		e := evs[i%len(evs)]
		if _, _, err := l.Append(e); err != nil {
			b.Fatal(err)
		}
	}
	if err := l.Sync(); err != nil { // everything acknowledged
		b.Fatal(err)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	st := l.Stats()
	if err := l.Close(); err != nil {
		b.Fatal(err)
	}
	bytesW := float64(st.Bytes - before.Bytes)
	evps := float64(b.N) / elapsed.Seconds()
	mbps := bytesW / elapsed.Seconds() / 1e6
	b.ReportMetric(evps, "events/s")
	b.ReportMetric(mbps, "MB/s")
	b.ReportMetric(float64(st.Syncs-before.Syncs), "fsyncs")

	lines := sampleLines(b, dir, 64<<20)
	rawMBps := rawAppend(b, lines)
	b.ReportMetric(rawMBps, "raw-MB/s")
	b.ReportMetric(mbps/rawMBps, "x-raw")
}

// sampleLines loads up to max bytes of record lines from the ledger.
func sampleLines(b *testing.B, dir string, max int) [][]byte {
	var lines [][]byte
	total := 0
	for _, seg := range segFiles(b, dir) {
		r, _, closeFn, err := openSegment(seg, strings.HasSuffix(seg, zstSuffix))
		if err != nil {
			b.Fatal(err)
		}
		data, err := io.ReadAll(io.LimitReader(r, int64(max-total)))
		closeFn()
		if err != nil {
			b.Fatal(err)
		}
		ls := bytes.SplitAfter(data, []byte("\n"))
		for _, ln := range ls[1:] { // skip the header
			if len(ln) > 0 && ln[len(ln)-1] == '\n' {
				lines = append(lines, ln)
				total += len(ln)
			}
		}
		if total >= max-1024 {
			break
		}
	}
	return lines
}

// rawAppend returns the MB/s of SHA-256 per line plus write(2) in 512 KiB
// chunks and a final fdatasync.
func rawAppend(b *testing.B, lines [][]byte) float64 {
	f, err := os.Create(filepath.Join(b.TempDir(), "raw"))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 0, 512<<10)
	var sink [32]byte
	n := 0
	start := time.Now()
	for _, ln := range lines {
		s := sha256.Sum256(ln)
		sink[0] ^= s[0]
		buf = append(buf, ln...)
		n += len(ln)
		if len(buf) >= 512<<10 {
			if _, err := f.Write(buf); err != nil {
				b.Fatal(err)
			}
			buf = buf[:0]
		}
	}
	f.Write(buf)
	unix.Fdatasync(int(f.Fd()))
	return float64(n) / time.Since(start).Seconds() / 1e6
}

func rawHash(lines [][]byte) float64 {
	var sink [32]byte
	n := 0
	start := time.Now()
	for _, ln := range lines {
		s := sha256.Sum256(ln)
		sink[0] ^= s[0]
		n += len(ln)
	}
	return float64(n) / time.Since(start).Seconds() / 1e6
}

// buildBig writes n events quickly for verify benchmarks and tests.
func buildBig(tb testing.TB, dir string, n int, opts Options) {
	l, err := Open(dir, opts)
	if err != nil {
		tb.Fatal(err)
	}
	evs := benchEvents()
	for i := 0; i < n; i++ {
		if _, _, err := l.Append(evs[i%len(evs)]); err != nil {
			tb.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		tb.Fatal(err)
	}
}

func BenchmarkVerify(b *testing.B) {
	for _, n := range []int{100_000, 1_000_000} {
		b.Run(fmt.Sprintf("records=%d", n), func(b *testing.B) {
			dir := b.TempDir()
			buildBig(b, dir, n, Options{})
			pub := pubKeyOf(b, dir)
			lines := sampleLines(b, dir, 64<<20)
			rawMBps := rawHash(lines)
			var ms runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&ms)
			allocBefore := ms.TotalAlloc
			b.ResetTimer()
			var rep *Report
			start := time.Now()
			for i := 0; i < b.N; i++ {
				var err error
				if rep, err = Verify(dir, pub, nil); err != nil || !rep.OK() {
					b.Fatalf("verify: %v %v", err, rep.Problems)
				}
			}
			elapsed := time.Since(start)
			b.StopTimer()
			runtime.ReadMemStats(&ms)
			mbps := float64(rep.Bytes) * float64(b.N) / elapsed.Seconds() / 1e6
			b.ReportMetric(float64(rep.Records)*float64(b.N)/elapsed.Seconds(), "records/s")
			b.ReportMetric(mbps, "MB/s")
			b.ReportMetric(rawMBps, "raw-sha256-MB/s")
			b.ReportMetric(mbps/rawMBps, "x-raw")
			b.ReportMetric(float64(ms.TotalAlloc-allocBefore)/float64(b.N), "alloc-B/verify")
		})
	}
}

// TestVerifyMemoryFlat checks that verification allocates about the same
// whatever the ledger's size (memory, not time).
func TestVerifyMemoryFlat(t *testing.T) {
	alloc := func(n int) uint64 {
		dir := t.TempDir()
		buildBig(t, dir, n, Options{SegmentMaxBytes: 4 << 20})
		pub := pubKeyOf(t, dir)
		var ms runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms)
		before := ms.TotalAlloc
		rep, err := Verify(dir, pub, nil)
		if err != nil || !rep.OK() {
			t.Fatal(err, rep.Problems)
		}
		runtime.ReadMemStats(&ms)
		return ms.TotalAlloc - before
	}
	small, big := alloc(5_000), alloc(50_000)
	t.Logf("verify allocated %d bytes for 5k records, %d for 50k", small, big)
	// Per-segment buffers (256 KiB each) are the only growth.
	if big > small+4<<20 {
		t.Fatalf("verification memory grows with ledger size: %d -> %d bytes", small, big)
	}
}
