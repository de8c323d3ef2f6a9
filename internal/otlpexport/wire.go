package otlpexport

import (
	"encoding/hex"
	"strconv"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	logs "go.opentelemetry.io/proto/otlp/logs/v1"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// The OTLP request is encoded by hand (protowire) rather than built as a
// message tree and marshalled: per record that tree was a dozen small
// allocations and a reflective size-then-marshal pass, most of the
// export's CPU (bench/otlp). encodeRequest produces the same bytes as
// proto.Marshal(e.request(batch)) would decode to (wire_test.go checks).

// Field numbers from opentelemetry/proto (logs/v1, common/v1, resource/v1,
// collector/logs/v1).
const (
	fReqResourceLogs   = 1
	fRLResource        = 1
	fRLScopeLogs       = 2
	fResAttributes     = 1
	fSLScope           = 1
	fSLLogRecords      = 2
	fScopeName         = 1
	fLRTime            = 1
	fLRSeverityNumber  = 2
	fLRSeverityText    = 3
	fLRBody            = 5
	fLRAttributes      = 6
	fLRObservedTime    = 11
	fLREventName       = 12
	fKVKey             = 1
	fKVValue           = 2
	fAnyString         = 1
	fAnyInt            = 3
	lenPrefixReserve   = 4 // bytes reserved for a nested message's length
	maxReservedMessage = 1<<(7*lenPrefixReserve) - 1
)

// encoder appends protobuf to a reused buffer.
type encoder struct {
	b []byte
}

// begin starts a nested message of field num: it reserves room for the
// length and returns where the message starts.
func (e *encoder) begin(num protowire.Number) int {
	e.b = protowire.AppendTag(e.b, num, protowire.BytesType)
	e.b = append(e.b, 0, 0, 0, 0)
	return len(e.b)
}

// end writes the length of the message begun at start, as a padded
// varint in the reserved bytes (valid protobuf: a varint may carry
// redundant continuation bytes), or moves the message if it is too long.
func (e *encoder) end(start int) {
	n := len(e.b) - start
	if n <= maxReservedMessage {
		p := e.b[start-lenPrefixReserve : start]
		for i := range lenPrefixReserve {
			c := byte(n>>(7*i)) & 0x7f
			if i < lenPrefixReserve-1 {
				c |= 0x80
			}
			p[i] = c
		}
		return
	}
	msg := append([]byte(nil), e.b[start:]...)
	e.b = protowire.AppendBytes(e.b[:start-lenPrefixReserve], msg)
}

func (e *encoder) str(num protowire.Number, s string) {
	e.b = protowire.AppendTag(e.b, num, protowire.BytesType)
	e.b = protowire.AppendString(e.b, s)
}

func (e *encoder) fixed64(num protowire.Number, v uint64) {
	e.b = protowire.AppendTag(e.b, num, protowire.Fixed64Type)
	e.b = protowire.AppendFixed64(e.b, v)
}

func (e *encoder) varint(num protowire.Number, v uint64) {
	e.b = protowire.AppendTag(e.b, num, protowire.VarintType)
	e.b = protowire.AppendVarint(e.b, v)
}

// attrStr appends a string attribute (KeyValue) of a log record.
func (e *encoder) attrStr(k, v string) {
	kv := e.begin(fLRAttributes)
	e.str(fKVKey, k)
	av := e.begin(fKVValue)
	e.str(fAnyString, v)
	e.end(av)
	e.end(kv)
}

func (e *encoder) attrInt(k string, v int64) {
	kv := e.begin(fLRAttributes)
	e.str(fKVKey, k)
	av := e.begin(fKVValue)
	e.varint(fAnyInt, uint64(v))
	e.end(av)
	e.end(kv)
}

// encodeRequest encodes the ExportLogsServiceRequest for a batch into
// buf's storage and returns the bytes.
func (e *Exporter) encodeRequest(buf []byte, batch []*item) []byte {
	enc := encoder{b: buf[:0]}
	now := uint64(time.Now().UnixNano())
	rl := enc.begin(fReqResourceLogs)
	res := enc.begin(fRLResource)
	for _, kv := range e.res.r.Attributes {
		a := enc.begin(fResAttributes)
		enc.str(fKVKey, kv.Key)
		av := enc.begin(fKVValue)
		enc.str(fAnyString, kv.Value.GetStringValue())
		enc.end(av)
		enc.end(a)
	}
	enc.end(res)
	sl := enc.begin(fRLScopeLogs)
	sc := enc.begin(fSLScope)
	enc.str(fScopeName, scopeName)
	enc.end(sc)
	for _, it := range batch {
		if it.kind == itemRecord {
			lr := enc.begin(fSLLogRecords)
			enc.record(it, now)
			enc.end(lr)
			continue
		}
		var m *logs.LogRecord
		if it.kind == itemGap {
			m = gapLog(it.gap)
		} else {
			m = ckptLog(it.ckpt)
		}
		m.ObservedTimeUnixNano = now
		data, _ := proto.Marshal(m)
		enc.b = protowire.AppendTag(enc.b, fSLLogRecords, protowire.BytesType)
		enc.b = protowire.AppendBytes(enc.b, data)
	}
	enc.end(sl)
	enc.end(rl)
	return enc.b
}

// record appends the fields of recordLog(it), in the same order.
func (enc *encoder) record(it *item, now uint64) {
	ev := &it.ev
	enc.fixed64(fLRTime, uint64(ev.Time.UnixNano()))
	sev, _ := severityOf(ev)
	enc.varint(fLRSeverityNumber, uint64(sev))
	if ev.Severity != "" {
		enc.str(fLRSeverityText, string(ev.Severity))
	}
	body := enc.begin(fLRBody)
	enc.b = protowire.AppendTag(enc.b, fAnyString, protowire.BytesType)
	enc.b = protowire.AppendBytes(enc.b, it.line)
	enc.end(body)
	enc.attrInt(AttrSeq, int64(it.seq))
	var leaf [64]byte
	hex.Encode(leaf[:], it.leaf[:])
	kv := enc.begin(fLRAttributes)
	enc.str(fKVKey, AttrLeaf)
	av := enc.begin(fKVValue)
	enc.b = protowire.AppendTag(enc.b, fAnyString, protowire.BytesType)
	enc.b = protowire.AppendBytes(enc.b, leaf[:])
	enc.end(av)
	enc.end(kv)
	enc.attrStr(AttrKind, string(ev.Kind))
	enc.attrStr(AttrVerdict, string(ev.Verdict))
	eachAttr(ev, enc.attrStr, enc.attrInt)
	enc.fixed64(fLRObservedTime, now)
	enc.str(fLREventName, EventRecord)
}

// severityOf maps watcher's severity and verdict to OTel's.
func severityOf(ev *audit.Event) (logs.SeverityNumber, string) {
	switch {
	case ev.Verdict == audit.VerdictKilled || ev.Kind == audit.KindLoss:
		return logs.SeverityNumber_SEVERITY_NUMBER_ERROR, string(ev.Severity)
	case ev.Severity == audit.SeverityAlert:
		return logs.SeverityNumber_SEVERITY_NUMBER_WARN, string(ev.Severity)
	}
	return logs.SeverityNumber_SEVERITY_NUMBER_INFO, string(ev.Severity)
}

// eachAttr calls str and num for the attributes after seq, leaf, kind and
// verdict, in order: the one list of them, for both encoders.
func eachAttr(ev *audit.Event, str func(k, v string), num func(k string, v int64)) {
	add := func(k, v string) {
		if v != "" {
			str(k, v)
		}
	}
	add(AttrSandbox, ev.Sandbox.Name)
	add(AttrRule, ev.Rule)
	add(AttrLayer, ev.Mechanism)
	if p := ev.Process; p.TGID != 0 || p.PID != 0 {
		num("process.pid", int64(max(p.TGID, p.PID)))
		if p.PPID != 0 {
			num("process.parent_pid", int64(p.PPID))
		}
		str("process.owner", strconv.FormatUint(uint64(p.UID), 10))
		add("process.executable.name", p.Comm)
		add("process.executable.path", p.Exe)
	}
	for _, k := range sortedKeys(ev.Sandbox.Labels) {
		v := ev.Sandbox.Labels[k]
		switch k {
		case "container.id", "container.name", "k8s.pod.name", "k8s.namespace.name", "k8s.container.name", "k8s.pod.uid":
			add(k, v)
		default:
			add("watcher.label."+k, v)
		}
	}
	if ev.File != nil {
		add("file.path", ev.File.Path)
	}
	if ev.Net != nil && ev.Net.Addr != "" {
		add("network.peer.address", ev.Net.Addr)
		num("network.peer.port", int64(ev.Net.Port))
	}
	if ev.DNS != nil {
		add("dns.question.name", ev.DNS.Name)
	}
	if ev.Tool != nil {
		add(AttrCallID, ev.Tool.CallID)
		add(AttrTool, ev.Tool.Tool)
	}
	if ev.Loss != nil {
		add(AttrLossStage, ev.Loss.Stage)
		num(AttrLossCount, int64(ev.Loss.Count))
	}
}
