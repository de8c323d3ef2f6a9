package ledger

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/watcherhq/watcher/internal/audit"
	"golang.org/x/mod/sumdb/tlog"
)

// Record framing. A record is one line:
//
//	{"seq":N,"prev":"<64 hex>",<event fields>,"hash":"<64 hex>"}\n
//
// The hash is tlog.RecordHash of the line up to (not including) the
// `,"hash":"` suffix, so it is at once the chain link and the Merkle leaf.
const (
	seqPrefix   = `{"seq":`
	prevPrefix  = `,"prev":"`
	hashPrefix  = `,"hash":"`
	hexHashLen  = 2 * tlog.HashSize
	suffixLen   = len(hashPrefix) + hexHashLen + len(`"}`) + 1
	minFrameLen = len(seqPrefix) + 1 + len(prevPrefix) + hexHashLen + len(`",`) + suffixLen

	// MaxRecordBytes bounds one record line. Longer events have their
	// arguments and message cut (see fitEvent); readers treat longer lines
	// as corrupt, which keeps their memory bounded.
	MaxRecordBytes = 1 << 20
)

const hexDigits = "0123456789abcdef"

// leafHasher computes tlog record hashes without allocating.
type leafHasher struct {
	d   hash.Hash
	sum [sha256.Size]byte
	// The hex of the last hash written: a record's hash is the next
	// record's prev, so each hash is hex-encoded once.
	hexHash tlog.Hash
	hex     [hexHashLen]byte
	hexOK   bool
	// head is appendRecord's cache of the event members a process's
	// records share.
	head headCache
}

// appendHex is appendHex(b, h), remembering the last encoding.
func (h *leafHasher) appendHex(b []byte, x tlog.Hash) []byte {
	if !h.hexOK || x != h.hexHash {
		h.hexHash, h.hex, h.hexOK = x, hexOf(&x), true
	}
	return append(b, h.hex[:]...)
}

func newLeafHasher() *leafHasher { return &leafHasher{d: sha256.New()} }

var zeroByte = []byte{0}

// hash returns tlog.RecordHash(data): SHA-256(0x00 || data).
func (h *leafHasher) hash(data []byte) tlog.Hash {
	h.d.Reset()
	h.d.Write(zeroByte)
	h.d.Write(data)
	var out tlog.Hash
	copy(out[:], h.d.Sum(h.sum[:0]))
	return out
}

// hexPairs holds the two lower-case hex digits of every byte value.
var hexPairs = func() (t [256][2]byte) {
	for i := range t {
		t[i] = [2]byte{hexDigits[i>>4], hexDigits[i&0xf]}
	}
	return t
}()

// hexOf returns the lower-case hex encoding of h.
func hexOf(h *tlog.Hash) (x [hexHashLen]byte) {
	for i, c := range h {
		x[2*i], x[2*i+1] = hexPairs[c][0], hexPairs[c][1]
	}
	return x
}

func appendHex(b []byte, h tlog.Hash) []byte {
	x := hexOf(&h)
	return append(b, x[:]...)
}

// appendRecord appends the framed record for e to b and returns the new
// buffer and the record's hash.
func appendRecord(b []byte, lh *leafHasher, seq uint64, prev tlog.Hash, e *audit.Event) ([]byte, tlog.Hash) {
	start := len(b)
	b = append(b, seqPrefix...)
	b = strconv.AppendUint(b, seq, 10)
	b = append(b, prevPrefix...)
	b = lh.appendHex(b, prev)
	b = append(b, '"', ',')
	b = appendEventFieldsCached(b, e, &lh.head)
	h := lh.hash(b[start:])
	b = append(b, hashPrefix...)
	b = lh.appendHex(b, h)
	b = append(b, '"', '}', '\n')
	return b, h
}

// frame is the chain-relevant part of a record line, parsed without
// decoding the event.
type frame struct {
	seq     uint64
	prevHex []byte
	body    []byte // hashed bytes
	hashHex []byte
}

// errFrame describes why a line is not a well-formed record.
type errFrame string

func (e errFrame) Error() string { return string(e) }

// parseFrame checks the fixed layout of a record line (which must end in
// '\n') and returns its parts.
func parseFrame(line []byte) (frame, error) {
	var f frame
	if len(line) == 0 || line[len(line)-1] != '\n' {
		return f, errFrame("incomplete record (no terminating newline)")
	}
	if len(line) < minFrameLen {
		return f, errFrame("record too short")
	}
	if len(line) > MaxRecordBytes {
		return f, errFrame("record longer than MaxRecordBytes")
	}
	if !bytes.HasPrefix(line, []byte(seqPrefix)) {
		return f, errFrame(`record does not start with {"seq":`)
	}
	i := len(seqPrefix)
	j := i
	for j < len(line) && j-i <= 20 && line[j] >= '0' && line[j] <= '9' {
		j++
	}
	if j == i || j-i > 20 || (line[i] == '0' && j-i > 1) {
		return f, errFrame("malformed sequence number")
	}
	seq, err := strconv.ParseUint(string(line[i:j]), 10, 64)
	if err != nil {
		return f, errFrame("malformed sequence number")
	}
	f.seq = seq
	if !bytes.HasPrefix(line[j:], []byte(prevPrefix)) {
		return f, errFrame(`missing "prev" after "seq"`)
	}
	j += len(prevPrefix)
	// The hex digits themselves are checked by comparison with the hash
	// they must equal (hexEqual), or by hexDecode.
	if len(line)-j < hexHashLen+2+suffixLen || line[j+hexHashLen] != '"' || line[j+hexHashLen+1] != ',' {
		return f, errFrame(`malformed "prev" hash`)
	}
	f.prevHex = line[j : j+hexHashLen]
	s := len(line) - suffixLen
	if !bytes.HasPrefix(line[s:], []byte(hashPrefix)) || !bytes.HasSuffix(line, []byte("\"}\n")) {
		return f, errFrame(`malformed "hash" suffix`)
	}
	f.body = line[:s]
	f.hashHex = line[s+len(hashPrefix) : len(line)-3]
	return f, nil
}

func isLowerHex(b []byte) bool {
	for _, c := range b {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// hexEqual reports whether hx is the lower-case hex encoding of h.
func hexEqual(hx []byte, h tlog.Hash) bool {
	x := hexOf(&h)
	return string(hx) == string(x[:])
}

// Record is one decoded ledger record.
type Record struct {
	// Seq is the record's sequence number (its Merkle leaf index).
	Seq uint64
	// Prev and Hash are the chain links as stored.
	Prev, Hash tlog.Hash
	// Event is the decoded event.
	Event audit.Event
	// File and Offset locate the record (offsets in compressed segments
	// count decompressed bytes).
	File   string
	Offset int64
	// Raw is the record line including its newline.
	Raw []byte
}

// wireRecord is the JSON shape of a record line.
type wireRecord struct {
	Seq  *uint64 `json:"seq"`
	Prev string  `json:"prev"`
	Hash string  `json:"hash"`
	audit.Event
}

// DecodeRecord parses one record line (with or without its newline),
// checks its framing and that its stored hash matches its content, and
// decodes the event. It does not check the link to the previous record.
func DecodeRecord(line []byte) (Record, error) {
	var r Record
	if len(line) == 0 || line[len(line)-1] != '\n' {
		line = append(line[:len(line):len(line)], '\n')
	}
	f, err := parseFrame(line)
	if err != nil {
		return r, err
	}
	h := newLeafHasher().hash(f.body)
	if !hexEqual(f.hashHex, h) {
		return r, errFrame("record hash does not match its content")
	}
	var w wireRecord
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&w); err != nil {
		return r, fmt.Errorf("decode record: %w", err)
	}
	if w.Seq == nil || *w.Seq != f.seq {
		return r, errFrame("record seq field disagrees with its frame")
	}
	r.Seq = f.seq
	r.Hash = h
	if _, err := hexDecode(f.prevHex, r.Prev[:]); err != nil {
		return r, err
	}
	r.Event = w.Event
	r.Raw = line
	return r, nil
}

func hexDecode(src []byte, dst []byte) (int, error) {
	if len(src) != 2*len(dst) || !isLowerHex(src) {
		return 0, errors.New("malformed hex hash")
	}
	for i := range dst {
		dst[i] = unhex(src[2*i])<<4 | unhex(src[2*i+1])
	}
	return len(dst), nil
}

func unhex(c byte) byte {
	if c <= '9' {
		return c - '0'
	}
	return c - 'a' + 10
}

// appendEventFields appends the canonical JSON members of e, without the
// enclosing braces. The output is what encoding/json would produce for e
// (HTML escaping off, time in UTC) except that an empty Sandbox or Process
// is always omitted and invalid UTF-8 becomes a literal U+FFFD, which makes
// the encoding stable under decode and re-encode. A test compares the two
// for every field of audit.Event.
func appendEventFields(b []byte, e *audit.Event) []byte {
	return appendEventFieldsCached(b, e, nil)
}

// appendEventFieldsCached is appendEventFields taking the members from
// "kind" to "process" from c when they equal the previous event's (a
// process's events share them), which is most of a routine record.
func appendEventFieldsCached(b []byte, e *audit.Event, c *headCache) []byte {
	b = append(b, `"time":"`...)
	if c != nil {
		b = c.appendTime(b, e.Time)
		b = append(b, '"')
		b = c.append(b, e)
	} else {
		b = appendTime(b, e.Time)
		b = append(b, '"')
		b = appendHead(b, e)
	}
	return appendDetails(b, e)
}

// appendHead appends the members from "kind" to "process".
func appendHead(b []byte, e *audit.Event) []byte {
	b = append(b, `,"kind":`...)
	b = appendString(b, string(e.Kind))
	b = append(b, `,"verdict":`...)
	b = appendString(b, string(e.Verdict))
	b = append(b, `,"severity":`...)
	b = appendString(b, string(e.Severity))
	b = strField(b, "rule", e.Rule, true)
	b = strField(b, "mechanism", e.Mechanism, true)
	if sb := &e.Sandbox; sb.CgroupID != 0 || sb.Name != "" || len(sb.Labels) > 0 {
		b = append(b, `,"sandbox":{`...)
		b = uintField(b, "cgroup_id", sb.CgroupID, true)
		b = strField(b, "name", sb.Name, true)
		if len(sb.Labels) > 0 {
			b = append(fieldName(b, "labels"), '{')
			keys := make([]string, 0, len(sb.Labels))
			for k := range sb.Labels {
				keys = append(keys, k)
			}
			// Sort as a decoder will see the keys: invalid UTF-8 turns
			// into U+FFFD.
			slices.SortFunc(keys, func(a, b string) int { return strings.Compare(validUTF8(a), validUTF8(b)) })
			for i, k := range keys {
				if i > 0 {
					b = append(b, ',')
				}
				b = appendString(b, k)
				b = append(b, ':')
				b = appendString(b, sb.Labels[k])
			}
			b = append(b, '}')
		}
		b = closeObject(b)
	}
	if p := &e.Process; p.PID != 0 || p.TGID != 0 || p.PPID != 0 || p.UID != 0 || p.Comm != "" ||
		p.Exe != "" || len(p.Args) > 0 || p.CgroupID != 0 {
		b = append(b, `,"process":{`...)
		b = uintField(b, "pid", uint64(p.PID), true)
		b = uintField(b, "tgid", uint64(p.TGID), true)
		b = uintField(b, "ppid", uint64(p.PPID), true)
		b = uintField(b, "uid", uint64(p.UID), false)
		b = strField(b, "comm", p.Comm, true)
		b = strField(b, "exe", p.Exe, true)
		b = strsField(b, "args", p.Args, true)
		b = uintField(b, "cgroup_id", p.CgroupID, true)
		b = closeObject(b)
	}
	return b
}

// appendDetails appends the members after "process".
func appendDetails(b []byte, e *audit.Event) []byte {
	if f := e.File; f != nil {
		b = append(b, `,"file":{`...)
		b = strField(b, "path", f.Path, false)
		b = uintField(b, "flags", uint64(f.Flags), true)
		b = uintField(b, "mode", uint64(f.Mode), true)
		b = uintField(b, "dev", uint64(f.Dev), true)
		b = boolField(b, "write", f.Write, true)
		b = strField(b, "op", f.Op, true)
		b = closeObject(b)
	}
	if t := e.Target; t != nil {
		b = append(b, `,"target":{`...)
		b = uintField(b, "pid", uint64(t.PID), true)
		b = strField(b, "comm", t.Comm, true)
		b = uintField(b, "mode", uint64(t.Mode), true)
		b = intField(b, "capability", int64(t.Capability), true)
		b = closeObject(b)
	}
	if m := e.Mount; m != nil {
		b = append(b, `,"mount":{`...)
		b = strField(b, "op", m.Op, false)
		b = strField(b, "source", m.Source, true)
		b = strField(b, "target", m.Target, true)
		b = strField(b, "fstype", m.FSType, true)
		b = uintField(b, "flags", m.Flags, true)
		b = closeObject(b)
	}
	if s := e.Syscall; s != nil {
		b = append(b, `,"syscall":{`...)
		b = intField(b, "nr", s.Nr, false)
		b = strField(b, "name", s.Name, true)
		b = intField(b, "ret", s.Ret, true)
		b = uintField(b, "count", s.Count, true)
		b = closeObject(b)
	}
	if d := e.DNS; d != nil {
		b = append(b, `,"dns":{`...)
		b = strField(b, "name", d.Name, false)
		b = strField(b, "qtype", d.QType, true)
		b = strField(b, "rcode", d.Rcode, true)
		b = strField(b, "reason", d.Reason, true)
		b = strsField(b, "answers", d.Answers, true)
		b = strField(b, "client", d.Client, true)
		b = closeObject(b)
	}
	if nd := e.Net; nd != nil {
		b = append(b, `,"net":{`...)
		b = strField(b, "op", nd.Op, false)
		b = uintField(b, "family", uint64(nd.Family), true)
		b = uintField(b, "type", uint64(nd.Type), true)
		b = uintField(b, "protocol", uint64(nd.Protocol), true)
		b = strField(b, "addr", nd.Addr, true)
		b = uintField(b, "port", uint64(nd.Port), true)
		b = strField(b, "reason", nd.Reason, true)
		b = strField(b, "name", nd.Name, true)
		b = closeObject(b)
	}
	if l := e.Loss; l != nil {
		b = append(b, `,"loss":{`...)
		b = strField(b, "stage", l.Stage, false)
		b = uintField(b, "count", l.Count, false)
		b = closeObject(b)
	}
	if s := e.Summary; s != nil {
		b = append(b, `,"summary":{"rows":`...)
		if s.Rows == nil {
			b = append(b, "null"...)
		} else {
			b = append(b, '[')
			for i, r := range s.Rows {
				if i > 0 {
					b = append(b, ',')
				}
				b = append(b, `{"sandbox":`...)
				b = appendString(b, r.Sandbox)
				b = append(b, `,"kind":`...)
				b = appendString(b, string(r.Kind))
				b = append(b, `,"seen":`...)
				b = strconv.AppendUint(b, r.Seen, 10)
				b = append(b, `,"kept":`...)
				b = strconv.AppendUint(b, r.Kept, 10)
				b = append(b, '}')
			}
			b = append(b, ']')
		}
		b = append(b, '}')
	}
	if w := e.Workspace; w != nil {
		b = append(b, `,"workspace":{`...)
		b = strField(b, "op", w.Op, false)
		b = strField(b, "snapshot", w.Snapshot, true)
		b = strsField(b, "added", w.Added, true)
		b = strsField(b, "changed", w.Changed, true)
		b = strsField(b, "deleted", w.Deleted, true)
		b = uintField(b, "bytes", w.Bytes, true)
		b = strField(b, "hash", w.Hash, true)
		b = strsField(b, "ipc", w.IPC, true)
		b = closeObject(b)
	}
	if l := e.Limit; l != nil {
		b = append(b, `,"limit":{`...)
		b = strField(b, "resource", l.Resource, false)
		b = uintField(b, "limit", l.Limit, true)
		b = uintField(b, "usage", l.Usage, true)
		b = uintField(b, "count", l.Count, true)
		b = strField(b, "mechanism", l.Mechanism, true)
		b = closeObject(b)
	}
	if r := e.Repeat; r != nil {
		b = append(b, `,"repeat":{"count":`...)
		b = strconv.AppendUint(b, r.Count, 10)
		b = append(b, `,"first":"`...)
		b = appendTime(b, r.First)
		b = append(b, `","last":"`...)
		b = appendTime(b, r.Last)
		b = append(b, `"}`...)
	}
	if t := e.Tool; t != nil {
		b = append(b, `,"tool":{`...)
		b = strField(b, "call_id", t.CallID, false)
		b = strField(b, "session", t.Session, true)
		b = uintField(b, "seq", t.Seq, true)
		b = strField(b, "tool", t.Tool, false)
		b = strField(b, "stage", t.Stage, false)
		b = strField(b, "decision", t.Decision, true)
		b = strField(b, "by", t.By, true)
		b = strField(b, "reason", t.Reason, true)
		b = strField(b, "arguments", t.Arguments, true)
		b = strField(b, "result", t.Result, true)
		b = strField(b, "sha256", t.SHA256, true)
		b = strField(b, "protocol", t.Protocol, true)
		b = strField(b, "protocol_session", t.ProtocolSession, true)
		b = strField(b, "protocol_request", t.ProtocolRequest, true)
		b = closeObject(b)
	}
	if p := e.Posture; p != nil {
		b = appendPosture(b, p)
	}
	if c := e.Canary; c != nil {
		b = appendCanary(b, c)
	}
	b = strField(b, "message", e.Message, true)
	b = strsField(b, "redacted", e.Redacted, true)
	return b
}

// headCache holds the encoding of the members appendHead writes for the
// last event it saw, and a private copy of the fields it was made from (the
// caller's Args and Labels may change after the event was appended).
type headCache struct {
	ok                   bool
	kind                 audit.Kind
	verdict              audit.Verdict
	severity             audit.Severity
	rule, mechanism      string
	sbCgroup             uint64
	sbName               string
	labels               map[string]string
	pid, tgid, ppid, uid uint32
	comm, exe            string
	args                 []string
	cgroup               uint64
	enc                  []byte
	// The time up to its seconds ("2006-01-02T15:04:05") of tSec.
	tOK    bool
	tSec   int64
	tWhole []byte
}

// appendTime is appendTime, with the date and clock of the second of the
// last time it wrote taken from the cache.
func (c *headCache) appendTime(b []byte, t time.Time) []byte {
	t = t.UTC()
	if sec := t.Unix(); !c.tOK || sec != c.tSec {
		if y := t.Year(); y < 0 || y > 9999 {
			return appendTime(b, t)
		}
		c.tWhole = appendTime(c.tWhole[:0], t.Truncate(time.Second))
		c.tWhole = c.tWhole[:len(c.tWhole)-1] // without the 'Z'
		c.tOK, c.tSec = true, sec
	}
	b = append(b, c.tWhole...)
	return append(appendFraction(b, t.Nanosecond()), 'Z')
}

// append appends e's head members, from the cache when they are the same.
func (c *headCache) append(b []byte, e *audit.Event) []byte {
	if c.same(e) {
		return append(b, c.enc...)
	}
	start := len(b)
	b = appendHead(b, e)
	c.enc = append(c.enc[:0], b[start:]...)
	c.ok = true
	c.kind, c.verdict, c.severity, c.rule, c.mechanism = e.Kind, e.Verdict, e.Severity, e.Rule, e.Mechanism
	sb, p := &e.Sandbox, &e.Process
	c.sbCgroup, c.sbName = sb.CgroupID, sb.Name
	clear(c.labels)
	if len(sb.Labels) > 0 {
		if c.labels == nil {
			c.labels = make(map[string]string, len(sb.Labels))
		}
		maps.Copy(c.labels, sb.Labels)
	}
	c.pid, c.tgid, c.ppid, c.uid, c.comm, c.exe, c.cgroup = p.PID, p.TGID, p.PPID, p.UID, p.Comm, p.Exe, p.CgroupID
	c.args = append(c.args[:0], p.Args...)
	return b
}

func (c *headCache) same(e *audit.Event) bool {
	sb, p := &e.Sandbox, &e.Process
	return c.ok && e.Kind == c.kind && e.Verdict == c.verdict && e.Severity == c.severity &&
		e.Rule == c.rule && e.Mechanism == c.mechanism &&
		sb.CgroupID == c.sbCgroup && sb.Name == c.sbName && maps.Equal(sb.Labels, c.labels) &&
		p.PID == c.pid && p.TGID == c.tgid && p.PPID == c.ppid && p.UID == c.uid &&
		p.Comm == c.comm && p.Exe == c.exe && p.CgroupID == c.cgroup && slices.Equal(p.Args, c.args)
}

// appendPosture writes a posture record's fields in struct order.
func appendPosture(b []byte, p *audit.Posture) []byte {
	b = append(b, `,"posture":{`...)
	b = strField(b, "cgroup", p.Cgroup, false)
	b = strField(b, "container", p.Container, true)
	b = intField(b, "procs", int64(p.Procs), false)
	b = intField(b, "threads", int64(p.Threads), false)
	b = uintField(b, "cap_eff", p.CapEff, false)
	b = uintField(b, "cap_bnd", p.CapBnd, false)
	b = boolField(b, "no_new_privs", p.NoNewPrivs, false)
	b = strField(b, "seccomp", p.Seccomp, false)
	b = boolField(b, "user_ns", p.UserNS, false)
	b = strField(b, "uid_map", p.UIDMap, true)
	b = boolField(b, "root_user", p.RootUser, false)
	b = appendMountPosture(fieldName(b, "root"), &p.Root)
	b = appendMountPosture(fieldName(b, "tmp"), &p.Tmp)
	if len(p.Workspace) > 0 {
		b = append(fieldName(b, "workspace"), '[')
		for i := range p.Workspace {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendMountPosture(b, &p.Workspace[i])
		}
		b = append(b, ']')
	}
	b = append(fieldName(b, "limits"), '{')
	b = intField(b, "memory_bytes", p.Limits.MemoryBytes, false)
	b = intField(b, "cpu_millicores", p.Limits.CPUMillis, false)
	b = intField(b, "pids", p.Limits.PIDs, false)
	b = closeObject(b)
	b = strsField(b, "missing", p.Missing, true)
	b = strsField(b, "errors", p.Errors, true)
	return closeObject(b)
}

// appendCanary writes a canary run's record in struct order.
func appendCanary(b []byte, c *audit.CanaryDetail) []byte {
	b = append(b, `,"canary":{`...)
	b = strField(b, "reason", c.Reason, false)
	b = fieldName(b, "checks")
	if c.Checks == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i := range c.Checks {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, '{')
			b = strField(b, "name", c.Checks[i].Name, false)
			b = boolField(b, "ok", c.Checks[i].OK, false)
			b = closeObject(b)
		}
		b = append(b, ']')
	}
	return closeObject(b)
}

func appendMountPosture(b []byte, m *audit.MountPosture) []byte {
	b = append(b, '{')
	b = strField(b, "path", m.Path, false)
	b = strField(b, "mount", m.Mount, true)
	b = strField(b, "fstype", m.FSType, true)
	b = boolField(b, "ro", m.ReadOnly, false)
	b = boolField(b, "noexec", m.NoExec, false)
	b = boolField(b, "nosuid", m.NoSuid, false)
	b = boolField(b, "nodev", m.NoDev, false)
	b = boolField(b, "absent", m.Absent, true)
	return closeObject(b)
}

// appendTime appends t in UTC as t.UTC().AppendFormat(b, time.RFC3339Nano)
// does (a test checks this), without parsing the layout each time.
func appendTime(b []byte, t time.Time) []byte {
	t = t.UTC()
	y, mo, d := t.Date()
	if y < 0 || y > 9999 {
		return t.AppendFormat(b, time.RFC3339Nano)
	}
	hh, mm, ss := t.Clock()
	b = append(b, byte('0'+y/1000), byte('0'+y/100%10), byte('0'+y/10%10), byte('0'+y%10), '-',
		byte('0'+mo/10), byte('0'+mo%10), '-', byte('0'+d/10), byte('0'+d%10), 'T',
		byte('0'+hh/10), byte('0'+hh%10), ':', byte('0'+mm/10), byte('0'+mm%10), ':',
		byte('0'+ss/10), byte('0'+ss%10))
	return append(appendFraction(b, t.Nanosecond()), 'Z')
}

// appendFraction appends ".fraction" of ns as RFC3339Nano does (trailing
// zeros removed; nothing for 0).
func appendFraction(b []byte, ns int) []byte {
	if ns != 0 {
		var frac [10]byte
		frac[0] = '.'
		for i := 9; i >= 1; i-- {
			frac[i] = byte('0' + ns%10)
			ns /= 10
		}
		n := 10
		for frac[n-1] == '0' {
			n--
		}
		b = append(b, frac[:n]...)
	}
	return b
}

// Field helpers write `,"name":value`, without the comma as an object's
// first member (no value ends in '{', so the last byte tells), which
// spares closing an object the copy that removing that comma would cost.
// closeObject closes an object.
func closeObject(b []byte) []byte {
	return append(b, '}')
}

func fieldName(b []byte, name string) []byte {
	if len(b) == 0 || b[len(b)-1] != '{' {
		b = append(b, ',')
	}
	b = append(b, '"')
	b = append(b, name...)
	return append(b, '"', ':')
}

func strField(b []byte, name, v string, omitEmpty bool) []byte {
	if omitEmpty && v == "" {
		return b
	}
	return appendString(fieldName(b, name), v)
}

func strsField(b []byte, name string, v []string, omitEmpty bool) []byte {
	if omitEmpty && len(v) == 0 {
		return b
	}
	b = fieldName(b, name)
	if v == nil {
		return append(b, "null"...)
	}
	b = append(b, '[')
	for i, s := range v {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, s)
	}
	return append(b, ']')
}

func uintField(b []byte, name string, v uint64, omitEmpty bool) []byte {
	if omitEmpty && v == 0 {
		return b
	}
	return strconv.AppendUint(fieldName(b, name), v, 10)
}

func intField(b []byte, name string, v int64, omitEmpty bool) []byte {
	if omitEmpty && v == 0 {
		return b
	}
	return strconv.AppendInt(fieldName(b, name), v, 10)
}

func boolField(b []byte, name string, v bool, omitEmpty bool) []byte {
	if omitEmpty && !v {
		return b
	}
	return strconv.AppendBool(fieldName(b, name), v)
}

// jsonPlain marks the bytes appendString copies as they are: ASCII other
// than control characters, '"' and '\\'.
var jsonPlain = func() (t [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// appendString appends s as a JSON string as encoding/json does with HTML
// escaping off (U+2028 and U+2029 escaped), except that each invalid UTF-8
// byte becomes a literal U+FFFD rather than the escape \ufffd.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if jsonPlain[c] {
			i++
			continue
		}
		if c < utf8.RuneSelf {
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			// Written as the character, not as the \ufffd escape, so
			// that re-encoding a decoded record gives the same bytes.
			b = append(b, s[start:i]...)
			b = append(b, "\uFFFD"...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// validUTF8 replaces each invalid byte of s with U+FFFD, as appendString
// does.
func validUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b.WriteString("\uFFFD")
		} else {
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// fitEvent shortens an event whose record would exceed MaxRecordBytes:
// arguments are cut to 4 KiB each and the message to 64 KiB, and the event
// says so in Redacted. Only the caller's copy is changed.
func fitEvent(e *audit.Event) {
	const argMax, msgMax = 4 << 10, 64 << 10
	cut := false
	if len(e.Process.Args) > 0 {
		args := make([]string, 0, min(len(e.Process.Args), 128))
		for i, a := range e.Process.Args {
			if i == 128 {
				cut = true
				break
			}
			if len(a) > argMax {
				a, cut = a[:argMax], true
			}
			args = append(args, a)
		}
		e.Process.Args = args
	}
	if len(e.Message) > msgMax {
		e.Message, cut = e.Message[:msgMax], true
	}
	if e.DNS != nil && len(e.DNS.Answers) > 64 {
		d := *e.DNS
		d.Answers = d.Answers[:64]
		e.DNS, cut = &d, true
	}
	if cut {
		e.Redacted = append(e.Redacted, "truncated")
	}
}
