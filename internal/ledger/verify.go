package ledger

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/watcherhq/watcher/internal/audit"
	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

// VerifyOptions configure VerifyDir.
type VerifyOptions struct {
	// PubKey is the checkpoint verifier key ("name+hash+base64"). Use a copy
	// kept away from the ledger host: the one in DIR/ledger.pub only proves
	// the ledger is consistent with itself.
	PubKey string
	// Checkpoints are extra signed checkpoints kept elsewhere (for example
	// shipped off the host); each must match the records too. Their names
	// are used in problems.
	Checkpoints map[string][]byte
	// Decode also decodes every record's event, catching records that are
	// chained correctly but are not valid events (possible only after the
	// last checkpoint, by someone who recomputed the hashes).
	Decode bool
	// Progress, when set, is called about every 4 MiB read and at the end.
	Progress func(Progress)
	// Witnesses are the verifier keys (cosignature/v1 vkeys) of witnesses
	// the verifier trusts. With any given, the ledger verifies only if a
	// checkpoint that matches the records carries valid cosignatures of
	// at least Quorum of them: a host that rewrote its history and
	// re-signed it with the ledger key cannot produce one.
	Witnesses []string
	// Quorum is how many of Witnesses must have cosigned; 0 means all.
	Quorum int
}

// Progress reports how far a verification got.
type Progress struct {
	File       string
	BytesDone  int64 // stored bytes read so far, all segments
	BytesTotal int64 // stored bytes of all segments
	Records    uint64
}

// Problem is one thing wrong with a ledger.
type Problem struct {
	// File is the segment or checkpoint file concerned.
	File string
	// Seq is the sequence number of the bad record: the one expected at
	// Offset. For a rewritten range (a checkpoint whose root does not
	// match), Seq..SeqEnd-1 is the range in which history was changed.
	Seq, SeqEnd uint64
	// HasSeq is false for problems that concern no record (a checkpoint
	// file that does not verify, a foreign file).
	HasSeq bool
	// Offset is the byte offset in File of the bad record or header, -1 if
	// none. For compressed segments it counts decompressed bytes.
	Offset int64
	// Reason says what is wrong.
	Reason string
}

func (p Problem) String() string {
	var b strings.Builder
	if p.HasSeq {
		if p.SeqEnd > p.Seq+1 {
			fmt.Fprintf(&b, "records %d..%d", p.Seq, p.SeqEnd-1)
		} else {
			fmt.Fprintf(&b, "record %d", p.Seq)
		}
	}
	if p.File != "" {
		if b.Len() > 0 {
			b.WriteString(" in ")
		}
		b.WriteString(p.File)
		if p.Offset >= 0 {
			fmt.Fprintf(&b, " at offset %d", p.Offset)
		}
	}
	b.WriteString(": ")
	b.WriteString(p.Reason)
	return b.String()
}

// Report is the result of a verification.
type Report struct {
	Dir      string
	LedgerID string
	// Segments and Bytes count the segment files and their stored size.
	Segments int
	Bytes    int64
	// FirstSeq and NextSeq bound the records checked: FirstSeq > 0 when
	// retention removed older segments.
	FirstSeq, NextSeq uint64
	// Records is how many records were checked.
	Records uint64
	// Checkpoints is how many signed checkpoints matched the records;
	// Covered is the size of the largest of them. Records from Covered on
	// are protected by the hash chain only: someone able to rewrite files
	// could have recomputed their hashes.
	Checkpoints int
	Covered     uint64
	// Witnessed is the size of the largest matching checkpoint cosigned by
	// a quorum of VerifyOptions.Witnesses, WitnessedBy who cosigned it.
	// Records from Witnessed on rest on the ledger key alone.
	Witnessed   uint64
	WitnessedBy []string
	// RemovedBefore is the highest "records before seq N removed" stated by
	// retention records.
	RemovedBefore uint64
	// LossRecords and Lost add up loss records (events the agent knew it
	// did not record); Recoveries counts torn tails cut on restart.
	LossRecords uint64
	Lost        uint64
	Recoveries  uint64
	// Warnings are oddities that are not tampering (foreign files,
	// checkpoints older than the retained records).
	Warnings []string
	// FirstBad is the first bad record in chain order, if any.
	FirstBad *Problem
	// Problems lists everything wrong, FirstBad included.
	Problems []Problem
}

// OK reports whether no problem was found.
func (r *Report) OK() bool { return len(r.Problems) == 0 }

func (r *Report) problem(p Problem) {
	r.Problems = append(r.Problems, p)
	if p.HasSeq && r.FirstBad == nil {
		r.FirstBad = &r.Problems[len(r.Problems)-1]
	}
}

// Verify checks the ledger in dir against the verifier key pubkey: every
// segment header, hash link, sequence number and stored hash, and every
// checkpoint's signature and Merkle root. It returns an error only when the
// ledger cannot be read (missing directory, unreadable file, bad key);
// tampering is reported in the Report. Memory use does not grow with the
// ledger's size.
func Verify(dir, pubkey string, progress func(Progress)) (*Report, error) {
	return VerifyDir(dir, VerifyOptions{PubKey: pubkey, Progress: progress})
}

type verifyCkpt struct {
	c         *Checkpoint
	name      string
	witnessed []string // quorum of trusted witnesses that cosigned it, or nil
}

// VerifyDir is Verify with options.
func VerifyDir(dir string, opts VerifyOptions) (*Report, error) {
	v, err := note.NewVerifier(strings.TrimSpace(opts.PubKey))
	if err != nil {
		return nil, fmt.Errorf("public key: %w", err)
	}
	var witnesses []note.Verifier
	for _, k := range opts.Witnesses {
		wv, err := ParseWitnessKey(k)
		if err != nil {
			return nil, err
		}
		witnesses = append(witnesses, wv)
	}
	quorum := opts.Quorum
	if quorum <= 0 || quorum > len(witnesses) {
		if quorum > len(witnesses) {
			return nil, fmt.Errorf("quorum %d is more than the %d witnesses given", quorum, len(witnesses))
		}
		quorum = len(witnesses)
	}
	layout, err := scanDir(dir)
	if err != nil {
		return nil, err
	}
	if len(layout.segments) == 0 {
		return nil, fmt.Errorf("%s holds no ledger segments (%s*%s)", dir, segPrefix, segSuffix)
	}
	rep := &Report{Dir: dir, Segments: len(layout.segments)}
	for _, f := range layout.foreign {
		rep.Warnings = append(rep.Warnings, fmt.Sprintf("foreign file %s ignored", filepath.Join(dir, f)))
	}
	for _, f := range layout.duplicates {
		rep.Warnings = append(rep.Warnings, fmt.Sprintf("%s duplicates a plain segment; the plain one was checked", filepath.Join(dir, f)))
	}
	for _, s := range layout.segments {
		rep.Bytes += s.Size
	}

	// Checkpoints: signature and form first, roots during the walk.
	var parsed []*Checkpoint
	addCkpt := func(name string, off int64, data []byte, wantSize int64) {
		c, err := ParseCosigned(data, v)
		if err != nil {
			rep.problem(Problem{File: name, Offset: off, Reason: "checkpoint does not verify: " + err.Error()})
			return
		}
		if wantSize >= 0 && c.Size != uint64(wantSize) {
			rep.problem(Problem{File: name, Offset: off, Reason: fmt.Sprintf("checkpoint covers %d records, not what its name says", c.Size)})
			return
		}
		c.File = name
		if len(witnesses) > 0 {
			// Each stored copy's cosignatures must verify on their own:
			// a damaged copy is reported even when another is intact.
			if _, err := c.Cosigners(witnesses); err != nil {
				rep.problem(Problem{File: name, Offset: off, Reason: "checkpoint cosignature does not verify (altered): " + err.Error()})
				return
			}
		}
		parsed = append(parsed, c)
	}
	if layout.hasHistory {
		path := filepath.Join(dir, historyName)
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("read checkpoint history: %w", err)
		}
		entries, torn := splitHistory(data)
		for _, e := range entries {
			addCkpt(path, e.off, e.note, -1)
		}
		if torn >= 0 {
			latest, _ := readLatest(dir, v)
			if err := checkTornHistory(path, torn, latest); err != nil {
				rep.problem(Problem{File: path, Offset: torn, Reason: err.Error()})
			} else {
				rep.Warnings = append(rep.Warnings, fmt.Sprintf("%s: incomplete note at offset %d (an append cut short; the writer removes it)", path, torn))
			}
		}
	}
	for _, cf := range layout.checkpoints {
		path := filepath.Join(dir, cf.Name)
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("read checkpoint: %w", err)
		}
		addCkpt(path, -1, data, int64(cf.Size))
	}
	if layout.hasLatest {
		path := filepath.Join(dir, latestName)
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("read checkpoint: %w", err)
		}
		addCkpt(path, -1, data, -1)
	}
	for name, data := range opts.Checkpoints {
		addCkpt(name, -1, data, -1)
	}
	var ckpts []verifyCkpt
	for _, c := range mergeCheckpoints(parsed) {
		vc := verifyCkpt{c: c, name: c.File}
		if len(witnesses) > 0 {
			if names, err := c.Cosigners(witnesses); err == nil && len(names) >= quorum {
				vc.witnessed = names
			}
		}
		ckpts = append(ckpts, vc)
	}

	w := &walker{rep: rep, opts: &opts, vkey: strings.TrimSpace(opts.PubKey), ckpts: ckpts}
	for _, s := range layout.segments {
		w.total += s.Size
	}
	for i, s := range layout.segments {
		done, err := w.segment(filepath.Join(dir, s.Name), s, i == 0)
		if err != nil {
			return nil, err
		}
		if done {
			break
		}
	}
	w.progress(true)
	rep.NextSeq = w.st.next
	if rep.FirstBad != nil {
		return rep, nil
	}
	// Checkpoints beyond the end: the tail was cut.
	for _, c := range w.ckpts[w.ci:] {
		if c.c.Size > w.st.next {
			rep.problem(Problem{File: w.lastFile, Offset: w.st.off, Seq: w.st.next, SeqEnd: c.c.Size, HasSeq: true,
				Reason: fmt.Sprintf("ledger ends at record %d but checkpoint %s covers %d records: the tail was truncated", w.st.next, c.name, c.c.Size)})
			break
		}
	}
	if len(witnesses) > 0 && rep.WitnessedBy == nil {
		rep.problem(Problem{File: filepath.Join(dir, latestName), Offset: -1,
			Reason: fmt.Sprintf("no checkpoint matching the records carries cosignatures of %d of the %d witnesses given: the ledger is not witnessed (rewritten and re-signed, or never cosigned)", quorum, len(witnesses))})
	}
	if rep.FirstSeq > rep.RemovedBefore {
		rep.problem(Problem{File: w.firstFile, Offset: 0, Seq: rep.RemovedBefore, SeqEnd: rep.FirstSeq, HasSeq: true,
			Reason: fmt.Sprintf("records before %d are missing and no retention record accounts for them", rep.FirstSeq)})
	}
	return rep, nil
}

// walker carries verification state across segments.
type walker struct {
	rep       *Report
	opts      *VerifyOptions
	vkey      string
	id        string
	st        state
	ckpts     []verifyCkpt
	ci        int    // next checkpoint to check
	covered   uint64 // size of the last checkpoint that matched
	total     int64
	doneBytes int64 // bytes of finished segments
	curN      int64 // bytes of the current segment read (as of the batch being checked)
	lastFile  string
	firstFile string
	lastProg  int64
	lr        *lineReader // reused across segments
	pool      *verifyPool // batches, reused across segments
}

func (w *walker) progress(final bool) {
	if w.opts.Progress == nil {
		return
	}
	done := w.doneBytes + w.curN
	if !final && done-w.lastProg < 4<<20 {
		return
	}
	w.lastProg = done
	w.opts.Progress(Progress{File: w.lastFile, BytesDone: done, BytesTotal: w.total, Records: w.rep.Records})
}

// checkpoints compares the roots of checkpoints covering exactly the
// records seen so far.
func (w *walker) checkpoints(file string, off int64) bool {
	for w.ci < len(w.ckpts) && w.ckpts[w.ci].c.Size <= w.st.next {
		c := w.ckpts[w.ci]
		w.ci++
		if c.c.Size < w.st.next || c.c.Size < w.rep.FirstSeq {
			w.rep.Warnings = append(w.rep.Warnings, fmt.Sprintf("checkpoint %s covers %d records, before the retained ones; not checked", c.name, c.c.Size))
			continue
		}
		if w.st.fr.root() != c.c.Root {
			start := max(w.covered, w.rep.FirstSeq)
			w.rep.problem(Problem{File: file, Offset: off, Seq: start, SeqEnd: c.c.Size, HasSeq: true,
				Reason: fmt.Sprintf("Merkle root of records 0..%d does not match signed checkpoint %s: history between records %d and %d was rewritten (hashes recomputed)",
					c.c.Size-1, c.name, start, c.c.Size-1)})
			return true
		}
		w.rep.Checkpoints++
		w.covered = c.c.Size
		w.rep.Covered = c.c.Size
		if c.witnessed != nil {
			w.rep.Witnessed, w.rep.WitnessedBy = c.c.Size, c.witnessed
		}
	}
	return false
}

// segment checks one segment; done reports that checking must stop.
func (w *walker) segment(path string, s segFile, first bool) (done bool, err error) {
	w.lastFile = path
	if first {
		w.firstFile = path
	}
	r, cr, closeFn, err := openSegment(path, s.Compressed)
	if err != nil {
		return false, fmt.Errorf("open segment: %w", err)
	}
	defer closeFn()
	w.curN = 0
	defer func() {
		// The pipeline has stopped by now: cr is no longer being read.
		w.doneBytes += cr.n
		w.curN = 0
	}()
	bad := func(off int64, seq uint64, reason string) (bool, error) {
		w.rep.problem(Problem{File: path, Offset: off, Seq: seq, HasSeq: true, Reason: reason})
		return true, nil
	}
	if w.lr == nil {
		w.lr = newLineReader(r)
	} else {
		w.lr.reset(r)
	}
	lr := w.lr
	line, _, tooLong, err := lr.next()
	expect := w.st.next
	if first {
		expect = s.First
	}
	if err != nil && err != io.EOF {
		if s.Compressed {
			return bad(0, expect, "cannot decompress: "+err.Error())
		}
		return false, fmt.Errorf("read %s: %w", path, err)
	}
	if err == io.EOF || tooLong {
		return bad(0, expect, "segment header missing or too long")
	}
	hdr, prev, fr, err := parseHeader(line)
	if err != nil {
		return bad(0, expect, err.Error())
	}
	hdrOff := lr.off
	switch {
	case hdr.FirstSeq != s.First:
		return bad(0, expect, fmt.Sprintf("header says first_seq %d, file name says %d", hdr.FirstSeq, s.First))
	case hdr.Key != w.vkey:
		return bad(0, expect, "segment belongs to a ledger with another key than the one given")
	case first:
		w.id = hdr.Ledger
		w.rep.LedgerID = hdr.Ledger
		w.rep.FirstSeq = hdr.FirstSeq
		if hdr.FirstSeq == 0 && (prev != (tlog.Hash{}) || len(fr.h) != 0) {
			return bad(0, expect, "first segment's header must start from an empty chain")
		}
		w.st = state{next: hdr.FirstSeq, prev: prev, fr: *fr}
		kept := w.ckpts[:0]
		for _, c := range w.ckpts {
			if c.c.Origin != originFor(w.id) {
				w.rep.problem(Problem{File: c.name, Offset: -1,
					Reason: fmt.Sprintf("checkpoint is for %s, not this ledger (%s)", c.c.Origin, originFor(w.id))})
				continue
			}
			kept = append(kept, c)
		}
		w.ckpts = kept
	case hdr.Ledger != w.id:
		return bad(0, expect, fmt.Sprintf("segment belongs to ledger %s, not %s", hdr.Ledger, w.id))
	case hdr.FirstSeq != w.st.next:
		if hdr.FirstSeq > w.st.next {
			return bad(0, w.st.next, fmt.Sprintf("records %d..%d are missing (segment starts at %d)", w.st.next, hdr.FirstSeq-1, hdr.FirstSeq))
		}
		return bad(0, hdr.FirstSeq, fmt.Sprintf("segment starts at record %d, which the previous segment already holds", hdr.FirstSeq))
	case prev != w.st.prev || !equalFrontier(fr, &w.st.fr):
		return bad(0, expect, "segment header does not continue the previous segment's chain")
	}
	w.st.off = hdrOff
	if first && w.checkpoints(path, hdrOff) {
		return true, nil
	}
	if w.pool == nil {
		w.pool = newVerifyPool()
	}
	vp := w.pool.start(lr, cr)
	defer vp.stop()
	for b := vp.next(); b != nil; b = vp.next() {
		w.curN = b.readN
		for i := range b.recs {
			r := &b.recs[i]
			off := r.off
			if err := r.readErr; err != nil {
				if s.Compressed {
					return bad(off, w.st.next, "cannot decompress: "+err.Error())
				}
				return false, fmt.Errorf("read %s: %w", path, err)
			}
			if r.tooLong {
				return bad(off, w.st.next, "record longer than MaxRecordBytes")
			}
			if r.ferr != nil {
				return bad(off, w.st.next, r.ferr.Error())
			}
			f, h, line := &r.f, r.h, r.line(b)
			switch {
			case f.seq != w.st.next:
				if f.seq > w.st.next {
					return bad(off, w.st.next, fmt.Sprintf("found record %d where %d was expected: records missing", f.seq, w.st.next))
				}
				return bad(off, w.st.next, fmt.Sprintf("found record %d where %d was expected: record duplicated or out of order", f.seq, w.st.next))
			case !hexEqual(f.prevHex, w.st.prev):
				return bad(off, w.st.next, "prev does not match the hash of the previous record (records removed, reordered or spliced)")
			case !r.hashOK:
				return bad(off, w.st.next, "stored hash does not match the record's content (record altered)")
			}
			if w.opts.Decode || r.decode {
				rec, err := DecodeRecord(line)
				if err != nil {
					return bad(off, w.st.next, "record does not decode: "+err.Error())
				}
				if msg := w.account(&rec, hdr); msg != "" {
					if rec.Seq == 0 {
						// The genesis record is chained and hashed; the
						// unauthenticated header is what disagrees.
						return bad(0, 0, msg)
					}
					return bad(off, w.st.next, msg)
				}
			}
			w.st.fr.add(h, nil)
			w.st.prev = h
			w.st.next++
			w.st.off = off + int64(len(line))
			w.rep.Records++
			if w.checkpoints(path, w.st.off) {
				return true, nil
			}
			w.progress(false)
		}
	}
	return false, nil
}

func equalFrontier(a, b *frontier) bool {
	if a.n != b.n || len(a.h) != len(b.h) {
		return false
	}
	for i := range a.h {
		if a.h[i] != b.h[i] {
			return false
		}
	}
	return true
}

// needsDecode picks the records the verifier must read: the genesis record
// and the ledger's own accounting (loss, recovery, retention).
func needsDecode(f frame) bool {
	if f.seq == 0 {
		return true
	}
	b := f.body
	i := bytes.Index(b, []byte(`","kind":"`))
	if i < 0 || i > 200 {
		return true // odd layout: look closer
	}
	k := b[i+len(`","kind":"`):]
	switch {
	case bytes.HasPrefix(k, []byte(`loss"`)), bytes.HasPrefix(k, []byte(`recovery"`)):
		return true
	case bytes.HasPrefix(k, []byte(`agent"`)):
		return bytes.Contains(b, []byte(`"mechanism":"ledger"`))
	}
	return false
}

// account checks and counts a decoded record; it returns a problem
// description or "".
func (w *walker) account(r *Record, hdr *segHeader) string {
	e := &r.Event
	if r.Seq == 0 {
		if e.Kind != audit.KindAgent || e.Mechanism != "ledger" || e.Message != genesisMessage(hdr.Ledger, hdr.Key) {
			return "segment header's ledger id or key does not match the genesis record"
		}
		return ""
	}
	switch e.Kind {
	case audit.KindLoss:
		w.rep.LossRecords++
		if e.Loss != nil {
			w.rep.Lost += e.Loss.Count
		}
	case audit.KindRecovery:
		w.rep.Recoveries++
	case audit.KindAgent:
		if e.Mechanism == "ledger" && strings.HasPrefix(e.Message, retentionPrefix) {
			rest := strings.TrimPrefix(e.Message, retentionPrefix)
			if sp := strings.IndexByte(rest, ' '); sp > 0 {
				rest = rest[:sp]
			}
			if n, err := strconv.ParseUint(rest, 10, 64); err == nil && n > w.rep.RemovedBefore {
				w.rep.RemovedBefore = n
			}
		}
	}
	return ""
}

// ErrNoCheckpoint is returned by Prove when the ledger has no checkpoint.
var ErrNoCheckpoint = errors.New("no checkpoint")
