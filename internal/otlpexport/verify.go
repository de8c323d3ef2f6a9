package otlpexport

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/watcherhq/watcher/internal/ledger"
	collogs "go.opentelemetry.io/proto/otlp/collector/logs/v1"
	common "go.opentelemetry.io/proto/otlp/common/v1"
	logs "go.opentelemetry.io/proto/otlp/logs/v1"
	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
	"google.golang.org/protobuf/encoding/protojson"
)

// Range is the ledger records [From, To).
type Range struct{ From, To uint64 }

// LedgerReport is what Verify found for one host's ledger.
type LedgerReport struct {
	ID  string // ledger id
	Key string // the verifier key used
	// KeyFromExport is set when the key came from the export itself (no
	// key given): the result then shows consistency, not authenticity.
	KeyFromExport bool
	Records       int    // distinct records received
	Duplicates    int    // the same record received more than once
	Checkpoint    uint64 // size of the newest valid checkpoint received (0: none)
	// Cosigners are the witnesses (of those Verify was given) whose
	// cosignature on that checkpoint verifies.
	Cosigners []string
	Proven    int // received records proven included in it
	// Unproven are received records below the checkpoint that a gap also
	// covers (sent before a restart lost their neighbours): their chain
	// links are checked, their inclusion is not.
	Unproven int
	Pending  int               // received records past the checkpoint
	Gaps     map[string]uint64 // records accounted for by gaps, per reason
	// Losses sums the loss records received (the ledger's own account,
	// per stage).
	Losses map[string]uint64
	// Unaccounted are ranges missing between received records (or below
	// the checkpoint) with no gap to account for them.
	Unaccounted []Range
	// Problems are failures: a record whose hash does not match its body,
	// a broken chain, conflicting copies, a root that does not match.
	Problems []string
}

// OK reports whether the copy is complete and proven: no problems and
// nothing unaccounted for.
func (r *LedgerReport) OK() bool { return len(r.Problems) == 0 && len(r.Unaccounted) == 0 }

// received holds one ledger's records as parsed from the export.
type received struct {
	id, key string
	recs    map[uint64]recvRecord
	gaps    []gap
	ckpts   [][]byte
	dups    int
	losses  map[string]uint64
	probs   []string
}

type recvRecord struct {
	leaf, prev tlog.Hash
}

// Verify reads a Collector file exporter's output (JSON lines, each an
// OTLP logs request) and checks, per ledger, every watcher record in it:
// its body's hash is its leaf hash and sequence number, consecutive ones
// chain, no range between received records is missing without a gap
// record, and the newest signed checkpoint's root is computed from the
// received leaves and the gaps' subtree hashes. keys maps ledger ids to
// verifier keys; a ledger without one is checked with the key its own
// export carries (KeyFromExport).
func Verify(r io.Reader, keys map[string]string) ([]*LedgerReport, error) {
	return VerifyWitnessed(r, keys, nil, 0)
}

// VerifyWitnessed is Verify that also requires the checkpoint proving the
// copy to carry cosignatures of quorum of the witnesses (verifier keys;
// quorum 0: all): a host that rewrote its history and re-signed it cannot
// have the rewrite cosigned.
func VerifyWitnessed(r io.Reader, keys map[string]string, witnesses []note.Verifier, quorum int) ([]*LedgerReport, error) {
	if quorum <= 0 || quorum > len(witnesses) {
		quorum = len(witnesses)
	}
	byID := map[string]*received{}
	var order []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 256<<20)
	line := 0
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		var req collogs.ExportLogsServiceRequest
		if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(b, &req); err != nil {
			return nil, fmt.Errorf("export line %d: not OTLP logs JSON: %w", line, err)
		}
		for _, rl := range req.ResourceLogs {
			ra := attrMap(rl.GetResource().GetAttributes())
			id := ra[AttrLedgerID].GetStringValue()
			if id == "" {
				continue // not watcher's
			}
			lr := byID[id]
			if lr == nil {
				lr = &received{id: id, key: ra[AttrLedgerKey].GetStringValue(), recs: map[uint64]recvRecord{}, losses: map[string]uint64{}}
				byID[id] = lr
				order = append(order, id)
			}
			for _, sl := range rl.ScopeLogs {
				for _, rec := range sl.LogRecords {
					lr.add(rec)
				}
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read export: %w", err)
	}
	var out []*LedgerReport
	for _, id := range order {
		out = append(out, byID[id].verify(keys[id], witnesses, quorum))
	}
	return out, nil
}

func attrMap(kvs []*common.KeyValue) map[string]*common.AnyValue {
	m := make(map[string]*common.AnyValue, len(kvs))
	for _, kv := range kvs {
		m[kv.Key] = kv.Value
	}
	return m
}

// add files one log record.
func (lr *received) add(rec *logs.LogRecord) {
	a := attrMap(rec.Attributes)
	body := rec.GetBody().GetStringValue()
	switch rec.EventName {
	case EventRecord:
		seq := uint64(a[AttrSeq].GetIntValue())
		r, err := ledger.DecodeRecord([]byte(body))
		if err != nil {
			lr.probs = append(lr.probs, fmt.Sprintf("record %d: body is not its ledger record: %v", seq, err))
			return
		}
		if r.Seq != seq || hex.EncodeToString(r.Hash[:]) != a[AttrLeaf].GetStringValue() {
			lr.probs = append(lr.probs, fmt.Sprintf("record %d: attributes (seq %d, leaf %s) disagree with its body (seq %d, hash %x)",
				seq, seq, a[AttrLeaf].GetStringValue(), r.Seq, r.Hash[:]))
			return
		}
		if old, ok := lr.recs[seq]; ok {
			if old.leaf != r.Hash {
				lr.probs = append(lr.probs, fmt.Sprintf("record %d received with two different contents", seq))
			}
			lr.dups++
			return
		}
		lr.recs[seq] = recvRecord{leaf: r.Hash, prev: r.Prev}
		if r.Event.Loss != nil {
			lr.losses[r.Event.Loss.Stage] += r.Event.Loss.Count
		}
	case EventGap:
		g := gap{from: uint64(a[AttrGapFrom].GetIntValue()), to: uint64(a[AttrGapTo].GetIntValue())}
		for i, reason := range reasons {
			g.count[i] = uint64(a[attrGapReasons+reason].GetIntValue())
		}
		nodes, err := decodeNodes(a[AttrGapNodes].GetStringValue())
		if err == nil {
			err = checkCover(g.from, g.to, nodes)
		}
		if err != nil {
			lr.probs = append(lr.probs, fmt.Sprintf("gap %d..%d: %v", g.from, g.to, err))
			return
		}
		g.nodes = nodes
		lr.gaps = append(lr.gaps, g)
	case EventCkpt:
		lr.ckpts = append(lr.ckpts, []byte(body))
	}
}

func decodeNodes(s string) ([]ledger.Subtree, error) {
	var out []ledger.Subtree
	for _, w := range strings.Fields(s) {
		parts := strings.Split(w, "/")
		if len(parts) != 3 {
			return nil, fmt.Errorf("subtree %q: want level/index/hash", w)
		}
		level, err1 := strconv.Atoi(parts[0])
		index, err2 := strconv.ParseUint(parts[1], 10, 64)
		h, err3 := hex.DecodeString(parts[2])
		if err1 != nil || err2 != nil || err3 != nil || len(h) != tlog.HashSize || level < 0 || level > 63 {
			return nil, fmt.Errorf("subtree %q malformed", w)
		}
		var st ledger.Subtree
		st.Level, st.Index = level, index
		copy(st.Hash[:], h)
		out = append(out, st)
	}
	return out, nil
}

// checkCover checks that nodes tile [from, to) in order.
func checkCover(from, to uint64, nodes []ledger.Subtree) error {
	at := from
	for _, n := range nodes {
		if n.Index<<n.Level != at {
			return fmt.Errorf("subtree %d/%d does not start at %d", n.Level, n.Index, at)
		}
		at += 1 << n.Level
	}
	if at != to {
		return fmt.Errorf("subtrees end at %d, not %d", at, to)
	}
	return nil
}

// verify checks one ledger's copy.
func (lr *received) verify(key string, witnesses []note.Verifier, quorum int) *LedgerReport {
	rep := &LedgerReport{ID: lr.id, Key: key, Records: len(lr.recs), Duplicates: lr.dups,
		Gaps: map[string]uint64{}, Losses: lr.losses, Problems: lr.probs}
	if key == "" {
		rep.Key, rep.KeyFromExport = lr.key, true
	}
	seqs := make([]uint64, 0, len(lr.recs))
	for s := range lr.recs {
		seqs = append(seqs, s)
	}
	slices.Sort(seqs)
	for i := 1; i < len(seqs); i++ {
		if seqs[i] == seqs[i-1]+1 && lr.recs[seqs[i]].prev != lr.recs[seqs[i-1]].leaf {
			rep.Problems = append(rep.Problems, fmt.Sprintf("record %d does not chain to record %d", seqs[i], seqs[i-1]))
		}
	}
	for _, g := range lr.gaps {
		for i, r := range reasons {
			rep.Gaps[r] += g.count[i]
		}
	}
	// The newest checkpoint that verifies.
	var ckpt *ledger.Checkpoint
	if v, err := note.NewVerifier(rep.Key); err != nil {
		rep.Problems = append(rep.Problems, fmt.Sprintf("ledger key %q: %v", rep.Key, err))
	} else {
		for _, msg := range lr.ckpts {
			c, err := ledger.ParseCosigned(msg, v)
			if err != nil {
				rep.Problems = append(rep.Problems, fmt.Sprintf("checkpoint: %v", err))
				continue
			}
			if c.Origin != "watcher-ledger/"+lr.id {
				rep.Problems = append(rep.Problems, fmt.Sprintf("checkpoint of %s exported as ledger %s", c.Origin, lr.id))
				continue
			}
			var names []string
			if len(witnesses) > 0 {
				if names, err = c.Cosigners(witnesses); err != nil {
					rep.Problems = append(rep.Problems, fmt.Sprintf("checkpoint %d: %v", c.Size, err))
					continue
				}
				if len(names) < quorum {
					continue // not (yet) cosigned enough: a later copy may be
				}
			}
			if ckpt == nil || c.Size > ckpt.Size || (c.Size == ckpt.Size && len(names) > len(rep.Cosigners)) {
				ckpt, rep.Cosigners = c, names
			}
		}
	}
	// Coverage: records and gaps, from 0 (or the first thing received)
	// to the end of what was received.
	var spans []Range
	for _, s := range seqs {
		spans = append(spans, Range{s, s + 1})
	}
	for _, g := range lr.gaps {
		spans = append(spans, Range{g.from, g.to})
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].From < spans[j].From })
	var end uint64
	if len(spans) > 0 {
		end = spans[0].From
		if ckpt != nil && ckpt.Size > 0 {
			end = 0 // a checkpoint covers everything from 0
		}
	}
	for _, s := range spans {
		if s.From > end {
			rep.Unaccounted = append(rep.Unaccounted, Range{end, s.From})
		}
		end = max(end, s.To)
	}
	if ckpt != nil && end < ckpt.Size {
		rep.Unaccounted = append(rep.Unaccounted, Range{end, ckpt.Size})
	}
	if ckpt == nil {
		rep.Pending = len(seqs)
		if len(witnesses) > 0 && len(lr.ckpts) > 0 {
			rep.Problems = append(rep.Problems, fmt.Sprintf("no checkpoint in the export carries %d of the %d witnesses' cosignatures", quorum, len(witnesses)))
		}
		return rep
	}
	rep.Checkpoint = ckpt.Size
	t := &tree{recs: lr.recs, seqs: seqs, nodes: map[[2]uint64]tlog.Hash{}}
	for _, g := range lr.gaps {
		for _, n := range g.nodes {
			t.nodes[[2]uint64{uint64(n.Level), n.Index}] = n.Hash
		}
	}
	for _, s := range seqs {
		if s >= ckpt.Size {
			rep.Pending++
		}
	}
	if len(rep.Unaccounted) > 0 {
		rep.Problems = append(rep.Problems, fmt.Sprintf("checkpoint %d: root not computed: records are missing without a recorded gap", ckpt.Size))
		return rep
	}
	root, err := tlog.TreeHash(int64(ckpt.Size), t)
	switch {
	case err != nil:
		rep.Problems = append(rep.Problems, fmt.Sprintf("checkpoint %d: %v", ckpt.Size, err))
	case root != ckpt.Root:
		rep.Problems = append(rep.Problems, fmt.Sprintf("checkpoint %d: root computed from the export %x does not match the signed root %x",
			ckpt.Size, root[:], ckpt.Root[:]))
	default:
		rep.Proven = t.used
		rep.Unproven = len(seqs) - rep.Pending - t.used
	}
	return rep
}

// tree serves tlog.TreeHash the hashes of a partly received ledger:
// received leaves first, gap subtrees where no received record helps.
type tree struct {
	recs  map[uint64]recvRecord
	seqs  []uint64 // sorted
	nodes map[[2]uint64]tlog.Hash
	used  int // received leaves the last hash was computed from
}

// ReadHashes implements tlog.HashReader.
func (t *tree) ReadHashes(indexes []int64) ([]tlog.Hash, error) {
	out := make([]tlog.Hash, len(indexes))
	for i, x := range indexes {
		level, n := tlog.SplitStoredHashIndex(x)
		h, used, ok := t.hashAt(level, uint64(n))
		if !ok {
			lo := uint64(n) << level
			return nil, fmt.Errorf("no hash for records %d..%d: neither received nor in a gap", lo, lo+1<<level-1)
		}
		out[i] = h
		t.used += used
	}
	return out, nil
}

// hashAt computes the subtree hash at (level, index), preferring received
// leaves over a gap's subtree hash; used counts the received leaves it
// came from.
func (t *tree) hashAt(level int, index uint64) (tlog.Hash, int, bool) {
	if level == 0 {
		if r, ok := t.recs[index]; ok {
			return r.leaf, 1, true
		}
	}
	node, haveNode := t.nodes[[2]uint64{uint64(level), index}]
	if level > 0 && (!haveNode || t.anyRecord(index<<level, (index+1)<<level)) {
		l, nl, ok1 := t.hashAt(level-1, 2*index)
		if ok1 {
			if r, nr, ok2 := t.hashAt(level-1, 2*index+1); ok2 {
				return tlog.NodeHash(l, r), nl + nr, true
			}
		}
	}
	return node, 0, haveNode
}

func (t *tree) anyRecord(lo, hi uint64) bool {
	i := sort.Search(len(t.seqs), func(i int) bool { return t.seqs[i] >= lo })
	return i < len(t.seqs) && t.seqs[i] < hi
}
