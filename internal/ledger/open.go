package ledger

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/pipeline"
	"golang.org/x/mod/sumdb/note"
	"golang.org/x/sys/unix"
)

// Open opens the ledger in dir, creating it (and its signing key) if the
// directory holds no segments yet. An existing ledger is checked and a torn
// tail cut back to the last complete record, with a recovery record saying
// what was cut. Open fails, naming the file, on anything it does not
// recognise: foreign files, a missing key, a corrupt segment header, a
// checkpoint that is invalid, from another ledger, or ahead of the records.
func Open(dir string, opts Options) (*Ledger, error) {
	opts = opts.withDefaults(dir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create ledger directory: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, lockName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock ledger: %w", err)
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		lock.Close()
		return nil, fmt.Errorf("lock ledger %s: %w: %w", dir, ErrLocked, err)
	}
	l := &Ledger{
		dir: dir, opts: opts, lock: lock, lh: newLeafHasher(),
		sampler: pipeline.NewSampler(opts.SampleEvery, opts.Seed),
		kick:    make(chan struct{}, 1), stop: make(chan struct{}), bgDone: make(chan struct{}),
		work: make(chan string, 64), workDone: make(chan struct{}), ckptNotify: make(chan struct{}, 1),
	}
	l.onNode = l.captureNode
	if err := l.open(); err != nil {
		if l.seg != nil {
			l.seg.Close()
		}
		if l.tiles != nil {
			l.tiles.close()
		}
		lock.Close()
		return nil, err
	}
	now := time.Now()
	l.summaryAt, l.ckptAt = now, now
	go l.loop()
	go l.worker(l.pendingWork)
	l.pendingWork = nil
	return l, nil
}

func (l *Ledger) open() error {
	layout, err := scanDir(l.dir)
	if err != nil {
		return err
	}
	if len(layout.foreign) > 0 {
		return fmt.Errorf("foreign file %s in ledger directory (move it away)", filepath.Join(l.dir, layout.foreign[0]))
	}
	for _, t := range layout.temps {
		if err := os.Remove(filepath.Join(l.dir, t)); err != nil {
			return fmt.Errorf("remove leftover %s: %w", filepath.Join(l.dir, t), err)
		}
	}
	for _, d := range layout.duplicates {
		// The plain original is kept; the compressor will redo the copy.
		if err := os.Remove(filepath.Join(l.dir, d)); err != nil {
			return fmt.Errorf("remove duplicate %s: %w", filepath.Join(l.dir, d), err)
		}
	}
	if len(layout.segments) == 0 {
		if len(layout.checkpoints) > 0 || layout.hasLatest || layout.hasHistory {
			return fmt.Errorf("checkpoint in ledger directory %s without segments", l.dir)
		}
		if err := removeTiles(l.dir, layout.trees); err != nil {
			return err
		}
		return l.create(layout)
	}
	if err := l.loadKey(layout, false); err != nil {
		return err
	}
	return l.resume(layout)
}

// loadKey loads (or for a new ledger, creates) the signing key and checks
// ledger.pub against it.
func (l *Ledger) loadKey(layout *dirLayout, create bool) error {
	signer, vkey, err := loadKey(l.opts.KeyFile)
	if err != nil && create && errors.Is(err, fs.ErrNotExist) {
		if _, err := GenerateKey(l.opts.KeyFile, l.opts.KeyName); err != nil {
			return err
		}
		signer, vkey, err = loadKey(l.opts.KeyFile)
	}
	if err != nil {
		return err
	}
	l.signer, l.vkey = signer, vkey
	if l.verifier, err = note.NewVerifier(vkey); err != nil {
		return fmt.Errorf("signing key %s: %w", l.opts.KeyFile, err)
	}
	pub := filepath.Join(l.dir, pubKeyName)
	if layout.hasPub {
		data, err := os.ReadFile(pub)
		if err != nil {
			return fmt.Errorf("read %s: %w", pub, err)
		}
		if strings.TrimSpace(string(data)) != vkey {
			return fmt.Errorf("public key %s does not match signing key %s", pub, l.opts.KeyFile)
		}
		return nil
	}
	if err := writeFileSync(pub, []byte(vkey+"\n"), 0o644, false); err != nil {
		return fmt.Errorf("write %s: %w", pub, err)
	}
	return nil
}

func (l *Ledger) create(layout *dirLayout) error {
	var idb [16]byte
	if _, err := rand.Read(idb[:]); err != nil {
		return fmt.Errorf("ledger id: %w", err)
	}
	l.id = hex.EncodeToString(idb[:])
	l.origin = originFor(l.id)
	if l.opts.KeyName == "" {
		l.opts.KeyName = l.origin
	}
	if err := l.loadKey(layout, true); err != nil {
		return err
	}
	if err := l.initTiles(layout, 0, nil); err != nil {
		return err
	}
	if err := l.newSegment(); err != nil {
		return err
	}
	l.stats.Segments++
	g := genesisEvent(l.id, l.vkey, time.Now())
	l.appendLocked(&g, false)
	if err := l.commitLocked(); err != nil {
		return fmt.Errorf("write genesis record: %w", err)
	}
	return nil
}

// genesisMessage binds the ledger id and key into the chain's first record.
func genesisMessage(id, vkey string) string { return "ledger created id=" + id + " key=" + vkey }

func genesisEvent(id, vkey string, t time.Time) audit.Event {
	return audit.Event{Time: t, Kind: audit.KindAgent, Verdict: audit.VerdictRecorded,
		Severity: audit.SeverityRoutine, Mechanism: "ledger", Message: genesisMessage(id, vkey)}
}

// resume continues an existing ledger from its last segment.
func (l *Ledger) resume(layout *dirLayout) error {
	last := layout.segments[len(layout.segments)-1]
	path := filepath.Join(l.dir, last.Name)
	ckpts, err := l.loadCheckpoints(layout)
	if err != nil {
		return err
	}
	var latest *Checkpoint
	if len(ckpts) > 0 {
		latest = ckpts[len(ckpts)-1]
	}
	sc, err := scanSegment(path, last.Compressed, latest)
	if err != nil {
		return err
	}
	if sc.hdr.Key != l.vkey {
		return fmt.Errorf("segment %s was signed with another key than %s", path, l.opts.KeyFile)
	}
	if sc.hdr.FirstSeq != last.First {
		return fmt.Errorf("segment %s: header says first_seq %d", path, sc.hdr.FirstSeq)
	}
	l.id = sc.hdr.Ledger
	l.origin = originFor(l.id)
	for _, c := range ckpts {
		if c.Origin != l.origin {
			return fmt.Errorf("checkpoint %s belongs to another ledger (%s, this is %s)", c.File, c.Origin, l.origin)
		}
	}
	if latest != nil && latest.Size > sc.end.next {
		return fmt.Errorf("checkpoint %s covers %d records but the ledger ends at %d: records were removed",
			latest.File, latest.Size, sc.end.next)
	}
	if sc.ckptErr != nil {
		return sc.ckptErr
	}
	l.cur.copyFrom(&sc.end)
	l.lastCkpt = latest
	if err := l.initTiles(layout, sc.end.next, latest); err != nil {
		return err
	}
	if last.Compressed {
		// A compressed segment is closed; continue in a new one.
		if err := l.newSegment(); err != nil {
			return err
		}
		l.stats.Segments++
	} else {
		if sc.torn != nil {
			if err := os.Truncate(path, sc.end.off); err != nil {
				return fmt.Errorf("cut torn tail of %s: %w", path, err)
			}
		}
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			return fmt.Errorf("open segment %s: %w", path, err)
		}
		// Segment age goes by the wall clock; after a restart, by the
		// first record's time (events carry the time they happened).
		start := time.Now()
		if !sc.firstTime.IsZero() && sc.firstTime.Before(start) {
			start = sc.firstTime
		}
		l.seg, l.segName, l.segFirst, l.segStart = f, last.Name, last.First, start
		l.written.copyFrom(&l.cur)
		l.durable.copyFrom(&l.cur)
	}
	if sc.torn != nil {
		e := audit.Event{Time: time.Now(), Kind: audit.KindRecovery, Verdict: audit.VerdictRecorded,
			Severity: audit.SeverityAlert, Mechanism: "ledger", Message: sc.torn.message(last.Name)}
		l.appendLocked(&e, true)
	}
	if err := l.commitLocked(); err != nil {
		return fmt.Errorf("resume ledger: %w", err)
	}
	for _, s := range layout.segments[:len(layout.segments)-1] {
		if l.opts.Compress && !s.Compressed {
			l.pendingWork = append(l.pendingWork, s.Name)
		}
	}
	if l.opts.Retention != (Retention{}) && len(l.pendingWork) == 0 {
		l.pendingWork = append(l.pendingWork, "")
	}
	return nil
}

// loadCheckpoints verifies every checkpoint (history, latest, and legacy
// ckpt-*.note files, which it moves into the history) and returns them by
// size, cosignatures of identical notes united.
func (l *Ledger) loadCheckpoints(layout *dirLayout) ([]*Checkpoint, error) {
	var legacy []*Checkpoint
	for _, cf := range layout.checkpoints {
		path := filepath.Join(l.dir, cf.Name)
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("read checkpoint %s: %w", path, err)
		}
		c, err := ParseCheckpoint(data, l.verifier)
		if err != nil {
			return nil, fmt.Errorf("checkpoint %s: %w", path, err)
		}
		if c.Size != cf.Size {
			return nil, fmt.Errorf("checkpoint %s: covers %d records, not what its name says", path, c.Size)
		}
		c.File = path
		legacy = append(legacy, c)
	}
	latest, err := readLatest(l.dir, l.verifier)
	if err != nil {
		return nil, err
	}
	hist, torn, err := readHistory(l.dir, l.verifier)
	if err != nil {
		return nil, err
	}
	histPath := filepath.Join(l.dir, historyName)
	if torn >= 0 {
		// An append cut short by a crash leaves a prefix of what
		// DIR/checkpoint holds; anything else is damage, not ours to cut.
		if err := checkTornHistory(histPath, torn, latest); err != nil {
			return nil, err
		}
		if err := os.Truncate(histPath, torn); err != nil {
			return nil, fmt.Errorf("cut torn tail of %s: %w", histPath, err)
		}
	}
	if latest != nil && !inHistory(hist, latest) {
		if err := appendHistory(l.dir, latest.Cosigned()); err != nil {
			return nil, err
		}
	}
	all := append(append([]*Checkpoint(nil), hist...), legacy...)
	if latest != nil {
		all = append(all, latest)
	}
	out := mergeCheckpoints(all)
	if len(legacy) > 0 {
		// Migrate: one history file instead of a file per checkpoint.
		have := map[string]bool{}
		for _, c := range hist {
			have[string(c.Note)] = true
		}
		var notes [][]byte
		for _, c := range legacy {
			if !have[string(c.Note)] {
				notes = append(notes, c.Note)
			}
		}
		if err := appendHistory(l.dir, notes...); err != nil {
			return nil, err
		}
		for _, c := range legacy {
			if err := os.Remove(c.File); err != nil {
				return nil, fmt.Errorf("migrate checkpoints: %w", err)
			}
		}
		if err := syncDir(l.dir); err != nil {
			return nil, err
		}
	}
	if n := len(out); n > 0 && (latest == nil || latest.Size < out[n-1].Size) {
		// DIR/checkpoint is missing or behind (a crash between the two
		// writes, or a migrated ledger): rewrite it from the history.
		if err := writeFileSync(filepath.Join(l.dir, latestName), out[n-1].Cosigned(), 0o644, false); err != nil {
			return nil, fmt.Errorf("write %s: %w", filepath.Join(l.dir, latestName), err)
		}
	}
	return out, nil
}

// tornTail describes bytes cut from the end of a segment.
type tornTail struct {
	off      int64
	n        int64
	sum      [32]byte
	afterSq  uint64
	hasAfter bool
	reason   string
}

func (t *tornTail) message(file string) string {
	after := "before the first record"
	if t.hasAfter {
		after = fmt.Sprintf("after seq %d", t.afterSq)
	}
	return fmt.Sprintf("recovered torn tail: cut %d bytes at offset %d of %s %s (%s); sha256 of cut bytes %x",
		t.n, t.off, file, after, t.reason, t.sum)
}

type segScan struct {
	hdr       *segHeader
	end       state
	firstTime time.Time
	torn      *tornTail
	ckptErr   error
}

// scanSegment reads a segment to find where its valid records end. An
// invalid record followed only by bytes that hold no valid record is a torn
// tail (reported in torn); an invalid record followed by valid ones is
// corruption and an error. When ckpt's size falls within the segment, its
// root is checked.
func scanSegment(path string, compressed bool, ckpt *Checkpoint) (*segScan, error) {
	r, _, closeFn, err := openSegment(path, compressed)
	if err != nil {
		return nil, fmt.Errorf("open segment %s: %w", path, err)
	}
	defer closeFn()
	lr := newLineReader(r)
	line, _, _, err := lr.next()
	if err != nil {
		return nil, fmt.Errorf("segment %s: read header: %w", path, err)
	}
	hdr, prev, fr, err := parseHeader(line)
	if err != nil {
		return nil, fmt.Errorf("segment %s: %w", path, err)
	}
	sc := &segScan{hdr: hdr}
	sc.end = state{next: hdr.FirstSeq, prev: prev, fr: *fr, off: lr.off}
	lh := newLeafHasher()
	checkCkpt := func() {
		if ckpt != nil && sc.ckptErr == nil && sc.end.next == ckpt.Size && sc.end.fr.root() != ckpt.Root {
			sc.ckptErr = fmt.Errorf("checkpoint %s does not match records 0..%d in %s: history was rewritten", ckpt.File, ckpt.Size-1, path)
		}
	}
	checkCkpt()
	var bad error
	var badOff int64
	for {
		line, off, tooLong, err := lr.next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("segment %s: read at offset %d: %w", path, off, err)
		}
		if bad != nil {
			// After an invalid record, any valid one means corruption in
			// the middle, which is not ours to cut.
			if !tooLong {
				if f, err := parseFrame(line); err == nil && hexEqual(f.hashHex, lh.hash(f.body)) {
					return nil, fmt.Errorf("segment %s: corrupt record at offset %d (%v) followed by valid records; refusing to cut them (run watcher verify)", path, badOff, bad)
				}
			}
			continue
		}
		if tooLong {
			bad, badOff = errFrame("record longer than MaxRecordBytes"), off
			continue
		}
		f, err := parseFrame(line)
		if err == nil {
			switch h := lh.hash(f.body); {
			case f.seq != sc.end.next:
				err = fmt.Errorf("seq %d where %d was expected", f.seq, sc.end.next)
			case !hexEqual(f.prevHex, sc.end.prev):
				err = errors.New("prev hash does not link to the previous record")
			case !hexEqual(f.hashHex, h):
				err = errors.New("hash does not match content")
			default:
				if sc.end.next == hdr.FirstSeq {
					sc.firstTime, _ = recordTime(f)
				}
				sc.end.fr.add(h, nil)
				sc.end.prev = h
				sc.end.next++
				sc.end.off = off + int64(len(line))
				checkCkpt()
				continue
			}
		}
		bad, badOff = err, off
	}
	if bad != nil {
		if compressed {
			return nil, fmt.Errorf("segment %s: corrupt record at offset %d: %v", path, badOff, bad)
		}
		t := &tornTail{off: badOff, reason: bad.Error()}
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("segment %s: %w", path, err)
		}
		defer f.Close()
		h := sha256.New()
		n, err := io.Copy(h, io.NewSectionReader(f, badOff, 1<<62))
		if err != nil {
			return nil, fmt.Errorf("segment %s: read torn tail: %w", path, err)
		}
		t.n = n
		copy(t.sum[:], h.Sum(nil))
		t.afterSq, t.hasAfter = sc.end.next-1, sc.end.next > 0
		sc.torn = t
	}
	return sc, nil
}
