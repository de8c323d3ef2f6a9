package main

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/watcherhq/watcher/internal/ledger"
	"github.com/watcherhq/watcher/internal/otlpexport/otelcoltest"
	"github.com/watcherhq/watcher/internal/witness/witnesstest"
	collogs "go.opentelemetry.io/proto/otlp/collector/logs/v1"
	colmetrics "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	"google.golang.org/protobuf/encoding/protojson"
)

// TestRunningAgentExportsToCollector: `watcher run` with agent.export
// naming a real OpenTelemetry Collector (OTLP/gRPC in, file exporter
// out): a command run through the agent arrives as log records with the
// semantic-convention and watcher attributes, and `watcher verify
// --export` proves the Collector's copy complete against the host's key;
// a copy with one record cut out of it is refused.
func TestRunningAgentExportsToCollector(t *testing.T) {
	tb := newTestbed(t, "", "{enabled: false}")
	col := otelcoltest.Start(t)
	// A real witness (litewitness) cosigns the checkpoints the agent
	// exports; the ledger is registered with it first, as an operator does.
	w := witnesstest.Start(t)
	l, err := ledger.Open(tb.ledger, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	w.AddLog("watcher-ledger/"+l.ID(), l.PublicKey())
	l.Close()
	pol, _ := os.ReadFile(tb.policy)
	export := "agent:\n  witnesses:\n    - {url: \"" + w.URL + "\", key: \"" + w.VKey + "\"}\n  export:\n    - name: central\n      endpoint: " + col.GRPC +
		"\n      insecure: true\n      batch_interval: 100ms\n      metrics_interval: 1s\n      headers: {x-tenant: e2e}\n"
	os.WriteFile(tb.policy, []byte(strings.Replace(string(pol), "agent:\n", export, 1)), 0o600)
	tb.startAgent()
	ctl := filepath.Join(tb.socketDir, "control.sock")
	if out, code := tb.watcher("exec", "--socket", ctl, "--label", "otlp-call", "--", "sh", "-c", "cat /etc/hostname >/dev/null; sleep 1.5; echo done"); code != 0 || !strings.Contains(out, "done") {
		t.Fatalf("exec: %d\n%s\nagent:\n%s", code, out, tb.agentLog)
	}
	if out, _ := tb.watcher("status", "--socket", tb.ControlSocket()); !strings.Contains(out, "EXPORT") || !strings.Contains(out, col.GRPC) {
		t.Errorf("status does not show the exporter:\n%s", out)
	}
	tb.stopAgent(syscall.SIGTERM)
	col.Stop()

	data, err := os.ReadFile(col.Out)
	if err != nil {
		t.Fatal(err)
	}
	var sawCat bool
	metrics := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 64<<20)
	for sc.Scan() {
		var mreq colmetrics.ExportMetricsServiceRequest
		if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(sc.Bytes(), &mreq); err != nil {
			t.Fatal(err)
		}
		for _, rm := range mreq.ResourceMetrics {
			for _, sm := range rm.ScopeMetrics {
				for _, m := range sm.Metrics {
					metrics[m.Name] = true
				}
			}
		}
		var req collogs.ExportLogsServiceRequest
		if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(sc.Bytes(), &req); err != nil {
			t.Fatal(err)
		}
		for _, rl := range req.ResourceLogs {
			for _, sl := range rl.ScopeLogs {
				for _, lr := range sl.LogRecords {
					a := map[string]string{}
					for _, kv := range lr.Attributes {
						a[kv.Key] = kv.Value.GetStringValue()
					}
					if a["watcher.kind"] == "exec" && a["process.executable.name"] == "cat" {
						sawCat = true
						if a["watcher.sandbox"] == "" || a["watcher.label.label"] != "otlp-call" || len(a["watcher.ledger.leaf"]) != 64 {
							t.Errorf("exec of cat exported with attributes %v", a)
						}
					}
				}
			}
		}
	}
	if !sawCat {
		t.Fatalf("the exec of cat is not in the collector's output (%d bytes)\nagent:\n%s", len(data), tb.agentLog)
	}
	if !metrics["watcher_events_total"] || !metrics["watcher_export_records_total"] {
		t.Errorf("agent metrics not exported as OTLP metrics: %v", metrics)
	}
	pub := filepath.Join(tb.ledger, "ledger.pub")
	out, code := tb.watcher("verify", "--export", col.Out, "--pubkey", pub, "--witness", w.VKey)
	if code != 0 || !strings.Contains(out, "ok: complete and proven") || !strings.Contains(out, "key given") ||
		!strings.Contains(out, "cosigned by "+w.Name) {
		t.Fatalf("verify --export: exit %d\n%s", code, out)
	}
	t.Logf("verify --export:\n%s", out)

	// Cut one record out of the copy (the first record of a request that
	// is not the last): verify names the missing record.
	lines := bytes.Split(bytes.TrimSpace(data), []byte("\n"))
	cutOne := false
	for i := 0; i < len(lines)-1 && !cutOne; i++ {
		var req collogs.ExportLogsServiceRequest
		if err := protojson.Unmarshal(lines[i], &req); err != nil {
			t.Fatal(err)
		}
		sl := req.ResourceLogs[0].ScopeLogs[0]
		for j, lr := range sl.LogRecords {
			if lr.EventName == "watcher.record" {
				sl.LogRecords = append(sl.LogRecords[:j], sl.LogRecords[j+1:]...)
				lines[i], _ = protojson.Marshal(&req)
				cutOne = true
				break
			}
		}
	}
	if !cutOne {
		t.Fatalf("no record to cut in %d requests", len(lines))
	}
	cut := filepath.Join(tb.dir, "cut.json")
	os.WriteFile(cut, bytes.Join(lines, []byte("\n")), 0o600)
	if out, code := tb.watcher("verify", "--export", cut, "--pubkey", pub); code != 1 || !strings.Contains(out, "MISSING: records") {
		t.Fatalf("verify --export of a cut copy: exit %d\n%s", code, out)
	}
}
