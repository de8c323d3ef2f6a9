package otlpexport

import (
	"bufio"
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/ledger"
	"github.com/watcherhq/watcher/internal/otlpexport/otelcoltest"
	"github.com/watcherhq/watcher/internal/testkit/poll"
	collogs "go.opentelemetry.io/proto/otlp/collector/logs/v1"
	colmetrics "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	logs "go.opentelemetry.io/proto/otlp/logs/v1"
	"google.golang.org/protobuf/encoding/protojson"
)

// rig is a ledger feeding one exporter, as the agent wires them.
type rig struct {
	t   *testing.T
	led *ledger.Ledger
	exp *Exporter
}

func newRig(t *testing.T, cfg Config) *rig {
	t.Helper()
	led, err := ledger.Open(t.TempDir(), ledger.Options{SyncInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, led: led}
	exp, err := New(cfg, led, func(ev audit.Event) { led.Append(ev) })
	if err != nil {
		t.Fatal(err)
	}
	r.exp = exp
	exp.Begin(led.Tap(exp.Tap))
	t.Cleanup(func() { exp.Close(time.Second); led.Close() })
	return r
}

func event(i int, sandbox string, kind audit.Kind) audit.Event {
	return audit.Event{Time: time.Unix(1_800_000_000, int64(i)).UTC(), Kind: kind, Verdict: audit.VerdictAllowed,
		Severity: audit.SeverityRoutine, Mechanism: "tracepoint", Rule: "r1",
		Sandbox: audit.Sandbox{Name: sandbox, CgroupID: 77},
		Process: audit.Process{PID: uint32(4000 + i), TGID: uint32(4000 + i), PPID: 1, UID: 1000, Comm: "python3", Exe: "/usr/bin/python3"},
		File:    &audit.FileDetail{Path: fmt.Sprintf("/work/f%d", i)},
		Message: "token=hunter2secret " + fmt.Sprint(i)}
}

// waitFor polls cond for up to 20s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	poll.Eventually(t, 20*time.Second, cond, "timed out waiting for %s", what)
}

// exported reads the collector's file: every watcher log record.
func exported(t *testing.T, path string) []*logs.LogRecord {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("collector output: %v", err)
	}
	var out []*logs.LogRecord
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 64<<20)
	for sc.Scan() {
		var req collogs.ExportLogsServiceRequest
		if err := protojson.Unmarshal(sc.Bytes(), &req); err != nil {
			t.Fatalf("collector output line: %v", err)
		}
		for _, rl := range req.ResourceLogs {
			for _, sl := range rl.ScopeLogs {
				out = append(out, sl.LogRecords...)
			}
		}
	}
	return out
}

func verifyFile(t *testing.T, path string) *LedgerReport {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	reps, err := Verify(f, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(reps) != 1 {
		t.Fatalf("Verify found %d ledgers, want 1", len(reps))
	}
	return reps[0]
}

// TestExportToCollector sends records over gRPC and HTTP to a real
// Collector and checks what its file exporter wrote: the attributes, the
// redacted body, the filter's gap, and that Verify proves the copy
// against the exported checkpoint.
func TestExportToCollector(t *testing.T) {
	col := otelcoltest.Start(t)
	for _, proto := range []string{ProtocolGRPC, ProtocolHTTP} {
		t.Run(proto, func(t *testing.T) {
			endpoint := col.GRPC
			if proto == ProtocolHTTP {
				endpoint = "http://" + col.HTTP
			}
			r := newRig(t, Config{Name: "c-" + proto, Protocol: proto, Endpoint: endpoint, Insecure: true,
				Headers: map[string]string{"x-watcher-test": "1"}, BatchRecords: 64, BatchInterval: 50 * time.Millisecond,
				Filter: Filter{Sandboxes: []string{"keep"}}})
			for i := range 300 {
				sb := "keep"
				if i%3 == 0 {
					sb = "other"
				}
				if _, _, err := r.led.Append(event(i, sb, audit.KindFileOpen)); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := r.led.Checkpoint(); err != nil {
				t.Fatal(err)
			}
			if err := r.exp.Close(10 * time.Second); err != nil {
				t.Fatal(err)
			}
			st := r.exp.Stats()
			if st.Sent != 200 || st.Filtered != 100 || st.Queued != 0 || st.Dropped != 0 {
				t.Fatalf("stats %+v: want 200 sent, 100 filtered", st)
			}
			waitFor(t, "the collector's file", func() bool {
				n := 0
				for _, lr := range exported(t, col.Out) {
					if lr.EventName == EventCkpt {
						n++
					}
				}
				return n == map[string]int{ProtocolGRPC: 1, ProtocolHTTP: 2}[proto]
			})
			var got *logs.LogRecord
			for _, lr := range exported(t, col.Out) {
				a := attrMap(lr.Attributes)
				if lr.EventName == EventRecord && a["file.path"].GetStringValue() == "/work/f5" {
					got = lr
				}
			}
			if got == nil {
				t.Fatal("record of /work/f5 not in the collector's output")
			}
			a := attrMap(got.Attributes)
			for k, want := range map[string]string{AttrSandbox: "keep", AttrRule: "r1", AttrLayer: "tracepoint",
				AttrKind: "file_open", "process.executable.name": "python3", "process.executable.path": "/usr/bin/python3"} {
				if v := a[k].GetStringValue(); v != want {
					t.Errorf("attribute %s = %q, want %q", k, v, want)
				}
			}
			if a["process.pid"].GetIntValue() != 4005 || len(a[AttrLeaf].GetStringValue()) != 64 {
				t.Errorf("process.pid %v, leaf %q", a["process.pid"], a[AttrLeaf].GetStringValue())
			}
			if body := got.GetBody().GetStringValue(); bytes.Contains([]byte(body), []byte("hunter2secret")) {
				t.Errorf("secret not redacted in the exported body: %s", body)
			}
			if got.SeverityNumber != logs.SeverityNumber_SEVERITY_NUMBER_INFO {
				t.Errorf("severity %v", got.SeverityNumber)
			}
		})
	}
	// One file, two ledgers: each proven on its own.
	col.Stop()
	f, err := os.Open(col.Out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	reps, err := Verify(f, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(reps) != 2 {
		t.Fatalf("%d ledgers in the export, want 2", len(reps))
	}
	for _, rep := range reps {
		if !rep.OK() || rep.Proven != 200 || rep.Gaps[ReasonFiltered] != 100 || rep.Checkpoint != 301 {
			t.Errorf("ledger %s: %+v", rep.ID, rep)
		}
	}
}

// TestCollectorRestart stops the Collector while records arrive: what fits
// in the buffer arrives after the restart, what did not is counted, covered
// by a gap and recorded in the ledger as a loss of exactly that many; the
// copy still verifies.
func TestCollectorRestart(t *testing.T) {
	col := otelcoltest.Start(t)
	r := newRig(t, Config{Name: "restart", Endpoint: col.GRPC, Insecure: true,
		BatchRecords: 50, BatchInterval: 20 * time.Millisecond, BufferRecords: 100})
	for i := range 50 {
		r.led.Append(event(i, "sb", audit.KindFileOpen))
	}
	waitFor(t, "the first 50 records sent", func() bool { return r.exp.Stats().Sent >= 50 })
	col.Stop()
	for i := 50; i < 300; i++ {
		r.led.Append(event(i, "sb", audit.KindFileOpen))
	}
	waitFor(t, "the loss record", func() bool {
		st := r.exp.Stats()
		return st.Dropped == 150 && st.Failures > 0 && st.Queued > 100
	})
	col.Restart()
	waitFor(t, "the buffer drained", func() bool { return r.exp.Stats().Queued == 0 })
	if _, err := r.led.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	if err := r.exp.Close(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	st := r.exp.Stats()
	if st.Dropped != 150 || st.Rejected != 0 {
		t.Fatalf("stats %+v: want exactly 150 dropped", st)
	}
	col.Stop()
	events := map[string]bool{}
	for _, lr := range exported(t, col.Out) {
		if a := attrMap(lr.Attributes); lr.EventName == EventRecord && a[AttrKind].GetStringValue() == "file_open" {
			events[a["file.path"].GetStringValue()] = true
		}
	}
	// 50 before the stop, the 100 the buffer held after it.
	if len(events) != 150 {
		t.Errorf("%d events arrived, want 150", len(events))
	}
	for i := range 150 {
		if !events[fmt.Sprintf("/work/f%d", i)] {
			t.Errorf("event %d (sent or buffered) did not arrive", i)
		}
	}
	rep := verifyFile(t, col.Out)
	if !rep.OK() || rep.Gaps[ReasonDropped] != 150 || rep.Losses["export:restart:buffer"] != 150 || rep.Proven != rep.Records {
		t.Fatalf("verify: %+v", rep)
	}
}

// TestRateLimit holds back a noisy sandbox's records past its rate,
// records the throttle's start and stop (with the count held back) in the
// ledger, exports those records, and covers the held-back records by gaps.
func TestRateLimit(t *testing.T) {
	col := otelcoltest.Start(t)
	r := newRig(t, Config{Name: "rl", Endpoint: col.GRPC, Insecure: true, BatchInterval: 20 * time.Millisecond,
		RateLimit: 20, RateBurst: 20})
	for i := range 100 {
		r.led.Append(event(i, "noisy", audit.KindExec))
	}
	for i := 100; i < 110; i++ {
		r.led.Append(event(i, "calm", audit.KindExec))
	}
	st := r.exp.Stats()
	if st.Throttled < 70 || st.Throttled > 80 {
		t.Fatalf("%d throttled of 100 at 20/s with a burst of 20", st.Throttled)
	}
	held := st.Throttled
	waitFor(t, "the throttle stop", func() bool { return r.led.Stats().Records >= 113 }) // genesis, 110, start, stop
	if _, err := r.led.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	r.exp.Close(10 * time.Second)
	col.Stop()
	var start, stop int
	var stopCount int64
	noisy := 0
	for _, lr := range exported(t, col.Out) {
		a := attrMap(lr.Attributes)
		switch {
		case a[AttrLayer].GetStringValue() == mechanism && a[AttrKind].GetStringValue() == "agent":
			start++
		case a[AttrLossStage].GetStringValue() == "export:rl:throttle":
			stop++
			stopCount = a[AttrLossCount].GetIntValue()
		case a[AttrSandbox].GetStringValue() == "noisy":
			noisy++
		}
	}
	if start != 1 || stop != 1 || uint64(stopCount) != held || uint64(noisy) != 100-held {
		t.Fatalf("throttle start %d, stop %d (count %d), noisy records %d; held back %d", start, stop, stopCount, noisy, held)
	}
	rep := verifyFile(t, col.Out)
	if !rep.OK() || rep.Gaps[ReasonThrottled] != held {
		t.Fatalf("verify: %+v", rep)
	}
}

// TestVerifyCatches edits a Collector's copy: a changed body, a record
// removed without a gap and a forged checkpoint are each reported.
func TestVerifyCatches(t *testing.T) {
	col := otelcoltest.Start(t)
	r := newRig(t, Config{Name: "v", Endpoint: col.GRPC, Insecure: true, BatchRecords: 10, BatchInterval: 20 * time.Millisecond})
	for i := range 40 {
		r.led.Append(event(i, "sb", audit.KindFileOpen))
	}
	r.led.Checkpoint()
	r.exp.Close(10 * time.Second)
	col.Stop()
	data, err := os.ReadFile(col.Out)
	if err != nil {
		t.Fatal(err)
	}
	check := func(name string, edit func([]byte) []byte, want string) {
		t.Run(name, func(t *testing.T) {
			reps, err := Verify(bytes.NewReader(edit(bytes.Clone(data))), nil)
			if err != nil {
				t.Fatal(err)
			}
			rep := reps[0]
			if rep.OK() {
				t.Fatalf("edited copy verified: %+v", rep)
			}
			if !bytes.Contains([]byte(fmt.Sprint(rep.Problems, rep.Unaccounted)), []byte(want)) {
				t.Fatalf("report %v %v does not say %q", rep.Problems, rep.Unaccounted, want)
			}
		})
	}
	if rep := verifyFile(t, col.Out); !rep.OK() || rep.Proven != 40 {
		t.Fatalf("unedited copy: %+v", rep)
	}
	check("body", func(b []byte) []byte {
		return bytes.Replace(b, []byte(`/work/f7\"`), []byte(`/work/f8\"`), 1)
	}, "body is not its ledger record")
	check("removed", func(b []byte) []byte {
		// Drop one record from its request (the first of the second line).
		lines := bytes.Split(b, []byte("\n"))
		var req collogs.ExportLogsServiceRequest
		if err := protojson.Unmarshal(lines[1], &req); err != nil {
			t.Fatal(err)
		}
		sl := req.ResourceLogs[0].ScopeLogs[0]
		sl.LogRecords = sl.LogRecords[1:]
		lines[1], _ = protojson.Marshal(&req)
		return bytes.Join(lines, []byte("\n"))
	}, "{")
	check("checkpoint", func(b []byte) []byte {
		return bytes.Replace(b, []byte(`\n41\n`), []byte(`\n42\n`), 1)
	}, "checkpoint")
}

// TestMetricsToCollector sends a Prometheus registry as OTLP metrics: a
// labelled counter as a monotonic cumulative sum, a histogram with its
// buckets, over gRPC and HTTP.
func TestMetricsToCollector(t *testing.T) {
	col := otelcoltest.Start(t)
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "watcher_test_events_total", Help: "h"}, []string{"sandbox"})
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "watcher_test_seconds", Help: "h", Buckets: []float64{0.1, 1}})
	reg.MustRegister(c, h)
	c.WithLabelValues("agents").Add(7)
	h.Observe(0.05)
	h.Observe(0.5)
	h.Observe(5)
	for _, proto := range []string{ProtocolGRPC, ProtocolHTTP} {
		endpoint := col.GRPC
		if proto == ProtocolHTTP {
			endpoint = "http://" + col.HTTP
		}
		led, err := ledger.Open(t.TempDir(), ledger.Options{})
		if err != nil {
			t.Fatal(err)
		}
		exp, err := New(Config{Name: "m", Protocol: proto, Endpoint: endpoint, Insecure: true}, led, func(audit.Event) {})
		if err != nil {
			t.Fatal(err)
		}
		exp.SetMetrics(reg, 50*time.Millisecond)
		exp.Begin(led.Tap(exp.Tap))
		waitFor(t, proto+" metrics sent", func() bool { return exp.Stats().MetricExports >= 2 })
		exp.Close(time.Second)
		led.Close()
	}
	col.Stop()
	data, err := os.ReadFile(col.Out)
	if err != nil {
		t.Fatal(err)
	}
	var sums, hists int
	for _, line := range bytes.Split(bytes.TrimSpace(data), []byte("\n")) {
		var req colmetrics.ExportMetricsServiceRequest
		if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(line, &req); err != nil {
			t.Fatal(err)
		}
		for _, rm := range req.ResourceMetrics {
			for _, sm := range rm.ScopeMetrics {
				for _, m := range sm.Metrics {
					switch m.Name {
					case "watcher_test_events_total":
						dp := m.GetSum().GetDataPoints()[0]
						if !m.GetSum().IsMonotonic || dp.GetAsDouble() != 7 || dp.Attributes[0].Value.GetStringValue() != "agents" {
							t.Errorf("counter as %v", m)
						}
						sums++
					case "watcher_test_seconds":
						dp := m.GetHistogram().GetDataPoints()[0]
						if dp.Count != 3 || !slices.Equal(dp.BucketCounts, []uint64{1, 1, 1}) || !slices.Equal(dp.ExplicitBounds, []float64{0.1, 1}) {
							t.Errorf("histogram as %v", dp)
						}
						hists++
					}
				}
			}
		}
	}
	if sums < 4 || hists < 4 {
		t.Fatalf("%d sums, %d histograms in the collector's output, want at least 2 per protocol", sums, hists)
	}
}

// TestExportTLS: the Collector's receivers serve TLS with a certificate
// of a CA the test makes; the exporter trusts that CA (ca_file) over gRPC
// and HTTPS, and one that does not trust it fails, records lost as
// dropped once its buffer is full.
func TestExportTLS(t *testing.T) {
	dir := t.TempDir()
	caFile, certFile, keyFile := writeTestPKI(t, dir)
	col := otelcoltest.StartTLS(t, certFile, keyFile)
	for _, c := range []Config{
		{Name: "tls-grpc", Endpoint: col.GRPC, CAFile: caFile, ServerName: "127.0.0.1"},
		{Name: "tls-http", Protocol: ProtocolHTTP, Endpoint: "https://" + col.HTTP, CAFile: caFile},
	} {
		c.BatchInterval = 20 * time.Millisecond
		r := newRig(t, c)
		for i := range 20 {
			r.led.Append(event(i, "sb", audit.KindExec))
		}
		waitFor(t, c.Name+" records sent", func() bool { return r.exp.Stats().Sent >= 20 })
	}
	// Without the CA: the handshake fails, nothing is sent.
	r := newRig(t, Config{Name: "untrusted", Endpoint: col.GRPC, BatchInterval: 20 * time.Millisecond, BufferRecords: 5})
	for i := range 10 {
		r.led.Append(event(i, "sb", audit.KindExec))
	}
	waitFor(t, "failed requests", func() bool { st := r.exp.Stats(); return st.Failures >= 2 && st.Dropped >= 5 })
	if st := r.exp.Stats(); st.Sent != 0 || !strings.Contains(st.LastError, "certificate") {
		t.Fatalf("untrusted collector: %+v", st)
	}
}

// writeTestPKI writes a CA and a server certificate for 127.0.0.1 signed
// by it; it returns the CA, certificate and key file names.
func writeTestPKI(t *testing.T, dir string) (ca, cert, key string) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "watcher test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	srvKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	srvTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage: x509.KeyUsageDigitalSignature}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caCert, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(srvKey)
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	return write("ca.pem", "CERTIFICATE", caDER), write("server.pem", "CERTIFICATE", srvDER), write("server.key", "EC PRIVATE KEY", keyDER)
}

// TestAgentRestartResumes: the Collector is away when the agent stops, so
// its last 30 records are not delivered and a shutdown loss is recorded;
// the next agent on the same ledger resumes at the cursor and sends them
// (and the loss record) from the ledger's files: every event arrives and
// the copy verifies with no gap but the genesis record's.
func TestAgentRestartResumes(t *testing.T) {
	col := otelcoltest.Start(t)
	dir, cursor := t.TempDir(), filepath.Join(t.TempDir(), "export-r.cursor")
	cfg := Config{Name: "r", Endpoint: col.GRPC, Insecure: true, BatchInterval: 20 * time.Millisecond, CursorFile: cursor}
	run := func(from, to int, beforeClose func(*ledger.Ledger, *Exporter)) {
		led, err := ledger.Open(dir, ledger.Options{SyncInterval: 10 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		exp, err := New(cfg, led, func(ev audit.Event) { led.Append(ev) })
		if err != nil {
			t.Fatal(err)
		}
		exp.Begin(led.Tap(exp.Tap))
		for i := from; i < to; i++ {
			led.Append(event(i, "sb", audit.KindExec))
		}
		beforeClose(led, exp)
		exp.Close(300 * time.Millisecond)
		led.Tap(nil)
		led.Close()
	}
	run(0, 50, func(led *ledger.Ledger, exp *Exporter) {
		waitFor(t, "the first 50 sent", func() bool { return exp.Stats().Sent >= 50 })
		col.Stop()
		for i := 50; i < 80; i++ {
			led.Append(event(i, "sb", audit.KindExec))
		}
	})
	col.Restart()
	run(80, 90, func(led *ledger.Ledger, exp *Exporter) {
		waitFor(t, "the resumed records sent", func() bool { return exp.Stats().Sent >= 40 })
		led.Checkpoint()
		exp.Close(10 * time.Second)
	})
	col.Stop()
	seen := map[string]bool{}
	for _, lr := range exported(t, col.Out) {
		if a := attrMap(lr.Attributes); a[AttrKind].GetStringValue() == "exec" {
			seen[a["file.path"].GetStringValue()] = true
		}
	}
	for i := range 90 {
		if !seen[fmt.Sprintf("/work/f%d", i)] {
			t.Errorf("event %d did not arrive", i)
		}
	}
	rep := verifyFile(t, col.Out)
	if !rep.OK() || rep.Gaps[ReasonBefore] != 1 || rep.Losses["export:r:shutdown"] < 30 || rep.Proven != rep.Records {
		t.Fatalf("verify: %+v", rep)
	}
}
