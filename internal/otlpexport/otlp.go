package otlpexport

import (
	"encoding/hex"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/watcherhq/watcher/internal/ledger"
	collogs "go.opentelemetry.io/proto/otlp/collector/logs/v1"
	common "go.opentelemetry.io/proto/otlp/common/v1"
	logs "go.opentelemetry.io/proto/otlp/logs/v1"
	res "go.opentelemetry.io/proto/otlp/resource/v1"
)

// Attribute names beyond the OpenTelemetry semantic conventions.
const (
	AttrLedgerID   = "watcher.ledger.id"
	AttrLedgerKey  = "watcher.ledger.key"
	AttrSeq        = "watcher.ledger.seq"
	AttrLeaf       = "watcher.ledger.leaf"
	AttrSandbox    = "watcher.sandbox"
	AttrRule       = "watcher.rule"
	AttrLayer      = "watcher.layer"
	AttrKind       = "watcher.kind"
	AttrVerdict    = "watcher.verdict"
	AttrCallID     = "watcher.call_id"
	AttrTool       = "watcher.tool"
	AttrLossStage  = "watcher.loss.stage"
	AttrLossCount  = "watcher.loss.count"
	AttrGapFrom    = "watcher.gap.from"
	AttrGapTo      = "watcher.gap.to"
	AttrGapNodes   = "watcher.gap.nodes"
	AttrCkptSize   = "watcher.checkpoint.size"
	AttrCkptRoot   = "watcher.checkpoint.root"
	EventRecord    = "watcher.record"
	EventGap       = "watcher.export.gap"
	EventCkpt      = "watcher.checkpoint"
	scopeName      = "github.com/watcherhq/watcher"
	attrGapReasons = "watcher.gap." // + reason: count
)

// resource is the exporter's OTLP resource: the host and the ledger.
type resource struct{ r *res.Resource }

func newResource(src Source) resource {
	host, _ := os.Hostname()
	return resource{&res.Resource{Attributes: []*common.KeyValue{
		str("service.name", "watcher"),
		str("host.name", host),
		str(AttrLedgerID, src.ID()),
		str(AttrLedgerKey, src.PublicKey()),
	}}}
}

func str(k, v string) *common.KeyValue {
	return &common.KeyValue{Key: k, Value: &common.AnyValue{Value: &common.AnyValue_StringValue{StringValue: v}}}
}

func num(k string, v int64) *common.KeyValue {
	return &common.KeyValue{Key: k, Value: &common.AnyValue{Value: &common.AnyValue_IntValue{IntValue: v}}}
}

// request builds the OTLP request for a batch.
func (e *Exporter) request(batch []*item) *collogs.ExportLogsServiceRequest {
	now := uint64(time.Now().UnixNano())
	recs := make([]*logs.LogRecord, 0, len(batch))
	for _, it := range batch {
		var lr *logs.LogRecord
		switch it.kind {
		case itemRecord:
			lr = recordLog(it)
		case itemGap:
			lr = gapLog(it.gap)
		case itemCheckpoint:
			lr = ckptLog(it.ckpt)
		}
		lr.ObservedTimeUnixNano = now
		recs = append(recs, lr)
	}
	return &collogs.ExportLogsServiceRequest{ResourceLogs: []*logs.ResourceLogs{{
		Resource:  e.res.r,
		ScopeLogs: []*logs.ScopeLogs{{Scope: &common.InstrumentationScope{Name: scopeName}, LogRecords: recs}},
	}}}
}

// recordLog is a ledger record as an OTel log record: the body is the
// ledger line (so its hash can be recomputed), attributes follow the
// semantic conventions where one exists. The exporter sends the same
// fields encoded by hand (wire.go); this form is the reference.
func recordLog(it *item) *logs.LogRecord {
	ev := &it.ev
	attrs := []*common.KeyValue{
		num(AttrSeq, int64(it.seq)),
		str(AttrLeaf, hex.EncodeToString(it.leaf[:])),
		str(AttrKind, string(ev.Kind)),
		str(AttrVerdict, string(ev.Verdict)),
	}
	eachAttr(ev, func(k, v string) { attrs = append(attrs, str(k, v)) },
		func(k string, v int64) { attrs = append(attrs, num(k, v)) })
	sev, text := severityOf(ev)
	return &logs.LogRecord{
		TimeUnixNano:   uint64(ev.Time.UnixNano()),
		SeverityNumber: sev,
		SeverityText:   text,
		EventName:      EventRecord,
		Body:           &common.AnyValue{Value: &common.AnyValue_StringValue{StringValue: string(it.line)}},
		Attributes:     attrs,
	}
}

// sortedKeys returns m's keys in order, so records encode the same way
// every time.
func sortedKeys(m map[string]string) []string {
	if len(m) == 0 {
		return nil
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// gapLog is a gap: the range, the count per reason, and the subtrees as
// "level/index/hex" words.
func gapLog(g *gap) *logs.LogRecord {
	attrs := []*common.KeyValue{num(AttrGapFrom, int64(g.from)), num(AttrGapTo, int64(g.to))}
	var lost uint64
	var parts []string
	for i, r := range reasons {
		if g.count[i] > 0 {
			attrs = append(attrs, num(attrGapReasons+r, int64(g.count[i])))
			parts = append(parts, fmt.Sprintf("%d %s", g.count[i], r))
		}
		if r == ReasonDropped {
			lost = g.count[i]
		}
	}
	attrs = append(attrs, str(AttrGapNodes, encodeNodes(g.nodes)))
	sev := logs.SeverityNumber_SEVERITY_NUMBER_INFO
	if lost > 0 {
		sev = logs.SeverityNumber_SEVERITY_NUMBER_ERROR
	}
	return &logs.LogRecord{
		TimeUnixNano:   uint64(time.Now().UnixNano()),
		SeverityNumber: sev,
		EventName:      EventGap,
		Body: &common.AnyValue{Value: &common.AnyValue_StringValue{StringValue: fmt.Sprintf(
			"ledger records %d..%d not exported: %s", g.from, g.to-1, strings.Join(parts, ", "))}},
		Attributes: attrs,
	}
}

func encodeNodes(ns []ledger.Subtree) string {
	var b strings.Builder
	for i, n := range ns {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%d/%d/%x", n.Level, n.Index, n.Hash[:])
	}
	return b.String()
}

// ckptLog is a signed (and cosigned, as far as the witnesses answered by
// then) checkpoint; the body is the note.
func ckptLog(c *ledger.Checkpoint) *logs.LogRecord {
	return &logs.LogRecord{
		TimeUnixNano:   uint64(c.Time.UnixNano()),
		SeverityNumber: logs.SeverityNumber_SEVERITY_NUMBER_INFO,
		EventName:      EventCkpt,
		Body:           &common.AnyValue{Value: &common.AnyValue_StringValue{StringValue: string(c.Cosigned())}},
		Attributes: []*common.KeyValue{num(AttrCkptSize, int64(c.Size)),
			str(AttrCkptRoot, hex.EncodeToString(c.Root[:]))},
	}
}
