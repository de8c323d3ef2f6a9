package otlpexport

import (
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/ledger"
	collogs "go.opentelemetry.io/proto/otlp/collector/logs/v1"
	common "go.opentelemetry.io/proto/otlp/common/v1"
	"golang.org/x/mod/sumdb/tlog"
	"google.golang.org/protobuf/proto"
)

type fakeSource struct{}

func (fakeSource) ID() string                         { return "0123abcd" }
func (fakeSource) Dir() string                        { return "" }
func (fakeSource) Durable() uint64                    { return 1 << 62 }
func (fakeSource) Sync() error                        { return nil }
func (fakeSource) PublicKey() string                  { return "watcher-ledger/0123abcd+01234567+AAAA" }
func (fakeSource) LastCheckpoint() *ledger.Checkpoint { return nil }

// TestWireMatchesMessages: the hand-encoded request decodes to the same
// message the protobuf types build, for records with every attribute, a
// 3 MiB body (multi-byte lengths), a gap and a checkpoint.
func TestWireMatchesMessages(t *testing.T) {
	e := &Exporter{res: newResource(fakeSource{})}
	full := event(7, "agents", audit.KindNet)
	full.Sandbox.Labels = map[string]string{"k8s.pod.name": "coder-0", "container.id": "abc", "label": "call-1"}
	full.Net = &audit.NetDetail{Op: "connect", Addr: "198.18.0.1", Port: 443}
	full.DNS = &audit.DNSDetail{Name: "example.test"}
	full.Tool = &audit.ToolDetail{CallID: "c-9", Tool: "shell"}
	full.Verdict, full.Severity = audit.VerdictKilled, audit.SeverityAlert
	loss := audit.Event{Time: time.Unix(1_800_000_001, 5), Kind: audit.KindLoss, Verdict: audit.VerdictRecorded,
		Severity: audit.SeverityAlert, Loss: &audit.LossDetail{Stage: "export:x:buffer", Count: 3}}
	long := make([]byte, 3<<20)
	for i := range long {
		long[i] = 'a' + byte(i%26)
	}
	g := &gap{from: 3, to: 3}
	for s := uint64(3); s < 11; s++ {
		g.add(s, tlog.RecordHash([]byte{byte(s)}), ReasonFiltered)
	}
	batch := []*item{
		{kind: itemRecord, seq: 1, leaf: tlog.RecordHash([]byte("a")), line: []byte(`{"seq":1}`), ev: full},
		{kind: itemRecord, seq: 2, leaf: tlog.RecordHash([]byte("b")), line: long, ev: loss},
		{kind: itemGap, gap: g},
		{kind: itemCheckpoint, ckpt: &ledger.Checkpoint{Size: 11, Time: time.Unix(1_800_000_002, 0), Note: []byte("note\n")}},
	}
	var got collogs.ExportLogsServiceRequest
	if err := proto.Unmarshal(e.encodeRequest(nil, batch), &got); err != nil {
		t.Fatal(err)
	}
	want := e.request(batch)
	for _, r := range []*collogs.ExportLogsServiceRequest{&got, want} {
		for _, lr := range r.ResourceLogs[0].ScopeLogs[0].LogRecords {
			lr.ObservedTimeUnixNano = 0
			if lr.EventName == EventGap {
				lr.TimeUnixNano = 0
			}
		}
	}
	if !proto.Equal(&got, want) {
		t.Fatalf("hand-encoded request differs:\n%v\nwant\n%v", shorten(&got), shorten(want))
	}
}

func shorten(r *collogs.ExportLogsServiceRequest) *collogs.ExportLogsServiceRequest {
	c := proto.Clone(r).(*collogs.ExportLogsServiceRequest)
	for _, lr := range c.ResourceLogs[0].ScopeLogs[0].LogRecords {
		if s := lr.GetBody().GetStringValue(); len(s) > 80 {
			lr.Body.Value = &common.AnyValue_StringValue{StringValue: s[:80]}
		}
	}
	return c
}
