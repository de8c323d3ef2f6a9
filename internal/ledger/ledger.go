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
	"sync"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/watcherhq/watcher/internal/audit"
	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
	"golang.org/x/sys/unix"
)

// Options configure a Ledger. The zero value is usable: every zero field
// takes the default named in its comment.
type Options struct {
	// SampleEvery keeps 1 in N routine events per sandbox and kind; alerts
	// are always kept. 0 or 1 keeps everything (default).
	SampleEvery uint64
	// Seed fixes which routine events sampling keeps, so a run can be
	// reproduced.
	Seed uint64
	// SummaryInterval is how often a sample_summary record states, per
	// sandbox and kind, how many events were seen and kept. Default 1m; a
	// final summary is written at Close.
	SummaryInterval time.Duration
	// CheckpointEvery signs a checkpoint once this many records were
	// acknowledged since the last one (checked at every group commit).
	// Default 1,000,000.
	CheckpointEvery uint64
	// CheckpointInterval signs a checkpoint at least this often while
	// records arrive. Default 1m. A checkpoint is also signed at Close.
	CheckpointInterval time.Duration
	// SyncInterval is the group-commit period: buffered records are written
	// and fdatasync'ed at least this often. Default 100ms. Alerts trigger a
	// commit at once (batched with whatever else is pending).
	SyncInterval time.Duration
	// BufferBytes is the size at which the append buffer is written to the
	// segment file (without fsync) between commits. Default 512 KiB.
	BufferBytes int
	// SegmentMaxBytes rolls over to a new segment once the current one
	// reaches this size. Default 64 MiB.
	SegmentMaxBytes int64
	// SegmentMaxAge rolls over to a new segment once the current one's
	// first record is this old. Default 24h.
	SegmentMaxAge time.Duration
	// Compress compresses segments with zstd once they are rolled over.
	Compress bool
	// Retention removes old segments; the zero value keeps everything.
	Retention Retention
	// KeyFile holds the Ed25519 signed-note private key (mode 0600).
	// Default DIR/ledger.key. It is generated when a new ledger is created
	// and must exist for an existing one.
	KeyFile string
	// KeyName names a generated key (appears in checkpoint signatures).
	// Default the checkpoints' origin, "watcher-ledger/<ledger id>", as
	// witnesses expect of a log's key (C2SP tlog-witness).
	KeyName string
}

// Retention says which rolled-over segments to remove. The active segment
// is never removed. Before removing, the ledger appends (and commits) a
// record stating that records before a sequence number are removed, so a
// verifier can tell retention from deletion.
type Retention struct {
	// MaxAge removes segments last written longer ago than this; 0 = no
	// age limit.
	MaxAge time.Duration
	// MaxBytes removes the oldest segments while all segments together
	// (as stored, compressed or not) exceed this; 0 = no size limit.
	MaxBytes int64
}

func (o Options) withDefaults(dir string) Options {
	if o.SampleEvery == 0 {
		o.SampleEvery = 1
	}
	if o.SummaryInterval <= 0 {
		o.SummaryInterval = time.Minute
	}
	if o.CheckpointEvery == 0 {
		o.CheckpointEvery = 1_000_000
	}
	if o.CheckpointInterval <= 0 {
		o.CheckpointInterval = time.Minute
	}
	if o.SyncInterval <= 0 {
		o.SyncInterval = 100 * time.Millisecond
	}
	if o.BufferBytes <= 0 {
		o.BufferBytes = 512 << 10
	}
	if o.SegmentMaxBytes <= 0 {
		o.SegmentMaxBytes = 64 << 20
	}
	if o.SegmentMaxAge <= 0 {
		o.SegmentMaxAge = 24 * time.Hour
	}
	if o.KeyFile == "" {
		o.KeyFile = filepath.Join(dir, defaultKeyName)
	}
	return o
}

// Errors.
var (
	// ErrClosed is returned by appends after Close.
	ErrClosed = errors.New("ledger closed")
	// ErrNotWritten wraps the write error while the ledger cannot write
	// (for example ENOSPC): the record was counted, not written, and will
	// be reported in a loss record once writing works again.
	ErrNotWritten = errors.New("ledger record not written")
	// ErrLocked is returned by Open while another process has the ledger
	// open (one writer per ledger).
	ErrLocked = errors.New("in use by another process")
)

// Stats are the ledger's counters since Open.
type Stats struct {
	Records         uint64 // records in the chain (the next sequence number)
	Durable         uint64 // acknowledged records: seqs below this are on stable storage
	Offered         uint64 // events given to Append or Notify
	Kept            uint64 // events kept by sampling
	SampledOut      uint64 // routine events sampled out (counted in summaries)
	Alerts          uint64 // alerts kept (never sampled out)
	Bytes           uint64 // record bytes written to segment files
	Syncs           uint64 // successful group commits (fdatasync)
	Checkpoints     uint64 // checkpoints signed and stored
	Segments        uint64 // segments created
	Compressed      uint64 // segments compressed
	RemovedSegments uint64 // segments removed by retention
	WriteFailures   uint64 // failed write, fdatasync or file creation calls
	Unwritten       uint64 // records accepted but not written, all told
	UnwrittenAlerts uint64 // of which alerts
	PendingLoss     uint64 // unwritten records not yet reported in a loss record
	Degraded        bool   // writes are failing; records are being counted, not written
	LastError       string // the most recent write or background error
}

// state is the chain and file position after some record.
type state struct {
	next   uint64 // records so far (next seq)
	alerts uint64 // alerts appended so far (for loss accounting)
	prev   tlog.Hash
	fr     frontier
	off    int64 // segment file size
}

func (s *state) copyFrom(o *state) {
	s.next, s.alerts, s.prev, s.off = o.next, o.alerts, o.prev, o.off
	o.fr.cloneInto(&s.fr)
}

// Ledger is an open, writable ledger directory. It is an audit.Sink.
// All methods are safe for concurrent use.
type Ledger struct {
	dir      string
	opts     Options
	lock     *os.File
	id       string
	origin   string
	vkey     string
	signer   note.Signer
	verifier note.Verifier

	// syncMu serialises commits, rotation, checkpoints and recovery; it is
	// taken before mu. Appends take only mu, so they proceed while a
	// commit waits for fdatasync.
	syncMu sync.Mutex

	mu         sync.Mutex
	closed     bool
	lh         *leafHasher
	cur        state // after the last appended record
	buf        []byte
	seg        *os.File
	segName    string
	segFirst   uint64
	segStart   time.Time // when the segment was started
	written    state     // after the last successful write(2)
	durable    state     // after the last successful fdatasync
	sampler    *sampler
	degraded   bool
	truncFail  bool // the segment may hold bytes past written.off
	lostSince  time.Time
	lostAlerts uint64 // pending, part of stats.PendingLoss
	lastErr    error
	stats      Stats
	lastCkpt   *Checkpoint
	ckptAt     time.Time
	summaryAt  time.Time
	rotateAsk  bool
	// pendingWork lists segments Open found uncompressed.
	pendingWork []string

	// Tree hash files (tiles.go): leaves holds the hashes of records
	// appended but not yet in them, from record leavesBase on.
	tiles      *tileStore
	leaves     []tlog.Hash
	uppers     []tileNode // tile-level subtree roots the chain computed, not yet in the files
	onNode     func(level int, index int64, h tlog.Hash)
	leavesBase uint64
	ckptMu     sync.Mutex // serialises writes of DIR/checkpoint
	ckptNotify chan struct{}

	// tap sees every record appended (Tap), under mu, in seq order.
	tap func(Tapped)

	kick     chan struct{} // commit now (alert, rotation)
	stop     chan struct{}
	bgDone   chan struct{}
	work     chan string
	workDone chan struct{}
}

var _ audit.Sink = (*Ledger)(nil)

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
		sampler: newSampler(opts.SampleEvery, opts.Seed),
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

// newSegment creates the segment starting at the current state and makes
// it the active one. The header is written atomically (temporary file and
// rename), so a segment file always has a complete header.
func (l *Ledger) newSegment() error {
	name := segName(l.cur.next)
	path := filepath.Join(l.dir, name)
	hdr := renderHeader(l.id, l.vkey, l.cur.next, l.cur.prev, &l.cur.fr)
	if err := writeFileSync(path, hdr, 0o600, false); err != nil {
		return fmt.Errorf("create segment %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("open segment %s: %w", path, err)
	}
	if l.seg != nil {
		l.seg.Close()
	}
	l.seg, l.segName, l.segFirst, l.segStart = f, name, l.cur.next, time.Now()
	l.cur.off = int64(len(hdr))
	l.written.copyFrom(&l.cur)
	l.durable.copyFrom(&l.cur)
	return nil
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

// Append adds e to the ledger unless sampling drops it, and returns its
// sequence number and whether it was kept. Secrets are redacted first
// (audit.Redact). The record is acknowledged (durable) once Durable()
// exceeds seq or a later Sync returns nil. While the ledger cannot write
// (for example ENOSPC) kept records are counted and ErrNotWritten is
// returned; they are reported in a loss record once writing works again.
func (l *Ledger) Append(e audit.Event) (seq uint64, kept bool, err error) {
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	audit.Redact(&e)
	alert := e.IsAlert()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return 0, false, ErrClosed
	}
	l.stats.Offered++
	if !l.sampler.offer(&e, alert) {
		l.stats.SampledOut++
		return 0, false, nil
	}
	l.stats.Kept++
	if alert {
		l.stats.Alerts++
	}
	if l.degraded {
		l.loseLocked(1, b2u(alert))
		return 0, true, l.notWrittenLocked()
	}
	seq = l.appendLocked(&e, alert)
	if len(l.buf) >= l.opts.BufferBytes {
		// write(2) only: page cache, no waiting for the disk.
		l.flushLocked()
	}
	if l.degraded {
		return 0, true, l.notWrittenLocked()
	}
	if alert || (!l.rotateAsk && l.cur.off+int64(len(l.buf)) >= l.opts.SegmentMaxBytes) {
		if !alert {
			l.rotateAsk = true
		}
		select {
		case l.kick <- struct{}{}:
		default:
		}
	}
	return seq, true, nil
}

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// Notify implements audit.Sink. It fails only after Close: write failures
// are counted and reported as loss records instead, because the fan-out
// drops a sink that returns an error.
func (l *Ledger) Notify(e audit.Event) error {
	_, _, err := l.Append(e)
	if errors.Is(err, ErrClosed) {
		return err
	}
	return nil
}

// RecordLoss writes a loss record: count events lost at stage (ringbuf_alert,
// ringbuf_routine, queue, sink:<name>, ...). Loss records are alerts and are
// never sampled out.
func (l *Ledger) RecordLoss(stage string, count uint64) error {
	_, _, err := l.Append(audit.Event{Kind: audit.KindLoss, Verdict: audit.VerdictRecorded,
		Severity: audit.SeverityAlert, Mechanism: "agent", Loss: &audit.LossDetail{Stage: stage, Count: count}})
	return err
}

// appendLocked encodes e as the next record into the buffer.
func (l *Ledger) appendLocked(e *audit.Event, alert bool) uint64 {
	start := len(l.buf)
	var h tlog.Hash
	l.buf, h = appendRecord(l.buf, l.lh, l.cur.next, l.cur.prev, e)
	if n := len(l.buf) - start; n > MaxRecordBytes {
		l.buf = l.buf[:start]
		fitEvent(e)
		l.buf, h = appendRecord(l.buf, l.lh, l.cur.next, l.cur.prev, e)
		if len(l.buf)-start > MaxRecordBytes {
			l.buf = l.buf[:start]
			small := audit.Event{Time: e.Time, Kind: e.Kind, Verdict: e.Verdict, Severity: e.Severity,
				Rule: e.Rule, Mechanism: e.Mechanism,
				Sandbox:  audit.Sandbox{CgroupID: e.Sandbox.CgroupID, Name: e.Sandbox.Name},
				Process:  audit.Process{PID: e.Process.PID, TGID: e.Process.TGID, PPID: e.Process.PPID, UID: e.Process.UID, Comm: e.Process.Comm, CgroupID: e.Process.CgroupID},
				Message:  fmt.Sprintf("event too large for the ledger (%d bytes encoded); details dropped", n),
				Redacted: []string{"truncated"}}
			l.buf, h = appendRecord(l.buf, l.lh, l.cur.next, l.cur.prev, &small)
			e = &small
		}
	}
	seq := l.cur.next
	if l.tap != nil {
		l.tap(Tapped{Seq: seq, Leaf: h, Line: l.buf[start:], Event: e})
	}
	l.cur.fr.add(h, l.onNode)
	l.leaves = append(l.leaves, h)
	l.cur.prev = h
	l.cur.next++
	if alert {
		l.cur.alerts++
	}
	return seq
}

// flushLocked writes the buffer to the segment (no fsync).
func (l *Ledger) flushLocked() error {
	if len(l.buf) == 0 {
		return nil
	}
	n, err := l.seg.Write(l.buf)
	if err == nil && n < len(l.buf) {
		err = io.ErrShortWrite
	}
	if err != nil {
		err = l.segWriteErr(err)
		l.failLocked(err, &l.written)
		return err
	}
	l.stats.Bytes += uint64(n)
	l.cur.off += int64(n)
	l.buf = l.buf[:0]
	l.written.copyFrom(&l.cur)
	return nil
}

// failLocked handles a failed write or fdatasync: the segment is cut back
// to the snapshot to (so it ends with a complete record), the chain state
// rolls back to it, every record after it is counted as not written, and
// the ledger is degraded until recoverLocked succeeds.
func (l *Ledger) failLocked(err error, to *state) {
	l.stats.WriteFailures++
	l.lastErr = err
	l.loseLocked(l.cur.next-to.next, l.cur.alerts-to.alerts)
	if terr := l.seg.Truncate(to.off); terr != nil {
		l.truncFail = true
		l.lastErr = errors.Join(err, fmt.Errorf("cut back %s: %w", l.segName, terr))
	}
	var snap state
	snap.copyFrom(to)
	l.rollbackLeaves(snap.next)
	l.cur.copyFrom(&snap)
	l.written.copyFrom(&snap)
	if l.durable.next > snap.next {
		l.durable.copyFrom(&snap)
	}
	l.buf = l.buf[:0]
	l.degraded = true
}

// segWriteErr names the segment in a failed write's error, once: errors
// from os.File already say "write PATH".
func (l *Ledger) segWriteErr(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return err
	}
	return fmt.Errorf("write %s: %w", filepath.Join(l.dir, l.segName), err)
}

func (l *Ledger) loseLocked(n, alerts uint64) {
	if n == 0 {
		return
	}
	if l.stats.PendingLoss == 0 {
		l.lostSince = time.Now()
	}
	l.stats.Unwritten += n
	l.stats.UnwrittenAlerts += alerts
	l.stats.PendingLoss += n
	l.lostAlerts += alerts
}

func (l *Ledger) notWrittenLocked() error {
	return fmt.Errorf("%w: %w", ErrNotWritten, l.lastErr)
}

// recoverLocked tries to leave the degraded state by writing and committing
// a loss record for what was not written. Called with syncMu and mu held.
func (l *Ledger) recoverLocked() {
	if !l.degraded {
		return
	}
	if l.truncFail {
		if err := l.seg.Truncate(l.written.off); err != nil {
			l.stats.WriteFailures++
			l.lastErr = fmt.Errorf("cut back %s: %w", l.segName, err)
			return
		}
		l.truncFail = false
	}
	e := audit.Event{Time: time.Now(), Kind: audit.KindLoss, Verdict: audit.VerdictRecorded,
		Severity: audit.SeverityAlert, Mechanism: "ledger",
		Loss: &audit.LossDetail{Stage: "ledger_write", Count: l.stats.PendingLoss},
		Message: fmt.Sprintf("%d records (%d alerts) accepted since %s were not written: %v",
			l.stats.PendingLoss, l.lostAlerts, l.lostSince.UTC().Format(time.RFC3339Nano), l.lastErr)}
	rec, h := appendRecord(nil, l.lh, l.cur.next, l.cur.prev, &e)
	n, err := l.seg.Write(rec)
	if err == nil && n < len(rec) {
		err = io.ErrShortWrite
	}
	if err == nil {
		if err = unix.Fdatasync(int(l.seg.Fd())); err != nil {
			// Anything since the last good fdatasync is in doubt.
			l.failLocked(fmt.Errorf("fdatasync %s: %w", l.segName, err), &l.durable)
			return
		}
	}
	if err != nil {
		l.stats.WriteFailures++
		l.lastErr = l.segWriteErr(err)
		if terr := l.seg.Truncate(l.written.off); terr != nil {
			l.truncFail = true
		}
		return
	}
	l.stats.Bytes += uint64(n)
	l.stats.Syncs++
	if l.tap != nil {
		// The tap learns here that the records it saw from this seq on
		// were cut back.
		l.tap(Tapped{Seq: l.cur.next, Leaf: h, Line: rec, Event: &e})
	}
	l.cur.fr.add(h, l.onNode)
	l.leaves = append(l.leaves, h)
	l.cur.prev = h
	l.cur.next++
	l.cur.alerts++
	l.cur.off += int64(n)
	l.written.copyFrom(&l.cur)
	l.durable.copyFrom(&l.cur)
	l.stats.PendingLoss, l.lostAlerts = 0, 0
	l.degraded = false
}

// Sync writes and fdatasyncs everything appended so far. When it returns
// nil, every record appended before the call is acknowledged.
func (l *Ledger) Sync() error {
	l.syncMu.Lock()
	defer l.syncMu.Unlock()
	return l.commitLocked()
}

// commitLocked is one group commit. Called with syncMu held (or during
// Open); it takes mu itself but releases it during fdatasync.
func (l *Ledger) commitLocked() error {
	l.mu.Lock()
	if l.degraded {
		l.recoverLocked()
		if l.degraded {
			err := l.notWrittenLocked()
			l.mu.Unlock()
			return err
		}
	}
	if err := l.flushLocked(); err != nil {
		l.mu.Unlock()
		return err
	}
	if l.durable.next == l.written.next && l.durable.off == l.written.off {
		l.mu.Unlock()
		return nil
	}
	var target state
	target.copyFrom(&l.written)
	f, name := l.seg, l.segName
	l.mu.Unlock()
	err := unix.Fdatasync(int(f.Fd()))
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		err = fmt.Errorf("fdatasync %s: %w", filepath.Join(l.dir, name), err)
		l.failLocked(err, &l.durable)
		return err
	}
	l.stats.Syncs++
	// An append may have failed and cut the file meanwhile, but only back
	// to a snapshot at or after target, so target is still on disk.
	if target.next > l.durable.next {
		l.durable.copyFrom(&target)
	}
	return nil
}

// Durable returns the number of acknowledged records: every record with a
// lower sequence number is on stable storage.
func (l *Ledger) Durable() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.durable.next
}

// Head returns the sequence number and hash of the last record appended
// (not necessarily acknowledged yet).
func (l *Ledger) Head() (seq uint64, hash tlog.Hash) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cur.next - 1, l.cur.prev
}

// ID returns the ledger's random id; its checkpoints' origin is
// "watcher-ledger/<id>".
func (l *Ledger) ID() string { return l.id }

// PublicKey returns the verifier key for the ledger's checkpoints.
func (l *Ledger) PublicKey() string { return l.vkey }

// LastCheckpoint returns the most recent checkpoint, or nil. Copy its Note
// somewhere the host's root cannot rewrite: with it, truncation and
// rewritten history are detectable even if every hash was recomputed.
func (l *Ledger) LastCheckpoint() *Checkpoint {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lastCkpt
}

// Stats returns a snapshot of the counters.
func (l *Ledger) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.stats
	s.Records = l.cur.next
	s.Durable = l.durable.next
	s.Degraded = l.degraded
	if l.lastErr != nil {
		s.LastError = l.lastErr.Error()
	}
	return s
}

// Checkpoint commits everything appended so far and signs a checkpoint
// over it (or returns the latest if nothing changed).
func (l *Ledger) Checkpoint() (*Checkpoint, error) {
	l.syncMu.Lock()
	defer l.syncMu.Unlock()
	return l.checkpointLocked()
}

func (l *Ledger) checkpointLocked() (*Checkpoint, error) {
	if err := l.commitLocked(); err != nil {
		return nil, err
	}
	l.mu.Lock()
	size, root := l.durable.next, l.durable.fr.root()
	last := l.lastCkpt
	l.mu.Unlock()
	if last != nil && last.Size == size {
		return last, nil
	}
	// Proofs against the new checkpoint read the tree hash files.
	l.flushTiles()
	if err := l.tiles.sync(); err != nil {
		l.mu.Lock()
		l.lastErr = err
		l.mu.Unlock()
	}
	now := time.Now()
	l.ckptMu.Lock()
	// DIR/checkpoint first: an append to the history cut short by a
	// crash is then a prefix of it (see loadCheckpoints).
	c, err := signCheckpoint(l.signer, l.origin, size, root, now)
	if err == nil {
		c.File = filepath.Join(l.dir, latestName)
		err = l.writeLatest(c)
	}
	if err == nil {
		err = appendHistory(l.dir, c.Note)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	defer l.ckptMu.Unlock()
	l.ckptAt = now
	if err != nil {
		l.stats.WriteFailures++
		l.lastErr = err
		return nil, err
	}
	l.lastCkpt = c
	l.stats.Checkpoints++
	select {
	case l.ckptNotify <- struct{}{}:
	default:
	}
	return c, nil
}

// loop runs group commits, summaries, rotation and checkpoints.
func (l *Ledger) loop() {
	defer close(l.bgDone)
	t := time.NewTicker(l.opts.SyncInterval)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
		case <-l.kick:
		}
		l.tick()
	}
}

func (l *Ledger) tick() {
	l.syncMu.Lock()
	defer l.syncMu.Unlock()
	now := time.Now()
	l.mu.Lock()
	if now.Sub(l.summaryAt) >= l.opts.SummaryInterval {
		l.summaryLocked(now)
	}
	l.mu.Unlock()
	if err := l.commitLocked(); err != nil {
		return // counted; retried next tick
	}
	l.mu.Lock()
	rotate := l.cur.off >= l.opts.SegmentMaxBytes ||
		(now.Sub(l.segStart) >= l.opts.SegmentMaxAge && l.cur.next > l.segFirst)
	ckpt := l.durable.next > 0 && (l.lastCkpt == nil || l.durable.next-l.lastCkpt.Size >= l.opts.CheckpointEvery ||
		(now.Sub(l.ckptAt) >= l.opts.CheckpointInterval && l.durable.next != l.lastCkpt.Size))
	l.mu.Unlock()
	if rotate {
		l.rotateLocked()
	}
	if ckpt {
		l.checkpointLocked()
	}
	l.flushTiles()
}

// summaryLocked appends a sample_summary record if anything was offered
// since the last one.
func (l *Ledger) summaryLocked(now time.Time) {
	l.summaryAt = now
	if l.degraded {
		return // counts carry over to the next summary
	}
	rows := l.sampler.rows()
	if len(rows) == 0 {
		return
	}
	e := audit.Event{Time: now, Kind: audit.KindSampleSummary, Verdict: audit.VerdictRecorded,
		Severity: audit.SeverityRoutine, Mechanism: "ledger", Summary: &audit.SampleSummary{Rows: rows}}
	l.appendLocked(&e, false)
	l.sampler.reset()
}

// rotateLocked closes the active segment and starts a new one. Called with
// syncMu held, after a successful commit.
func (l *Ledger) rotateLocked() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.rotateAsk = false
	if l.degraded || l.flushLocked() != nil {
		return
	}
	// Appends wait for this one fdatasync: the old segment must be
	// complete and durable before the new one links to it.
	if err := unix.Fdatasync(int(l.seg.Fd())); err != nil {
		l.failLocked(fmt.Errorf("fdatasync %s: %w", filepath.Join(l.dir, l.segName), err), &l.durable)
		return
	}
	l.stats.Syncs++
	l.durable.copyFrom(&l.written)
	old := l.segName
	if err := l.newSegment(); err != nil {
		l.stats.WriteFailures++
		l.lastErr = err
		return
	}
	l.stats.Segments++
	if l.opts.Compress || l.opts.Retention != (Retention{}) {
		select {
		case l.work <- old:
		default: // the worker is behind; Open picks up uncompressed segments
		}
	}
}

// worker compresses rolled-over segments and applies retention.
func (l *Ledger) worker(pending []string) {
	defer close(l.workDone)
	for _, name := range pending {
		l.work1(name)
	}
	for name := range l.work {
		l.work1(name)
	}
}

func (l *Ledger) work1(name string) {
	{
		if l.opts.Compress && name != "" {
			if err := compressSegment(filepath.Join(l.dir, name)); err != nil {
				l.mu.Lock()
				l.lastErr = err
				l.mu.Unlock()
			} else {
				l.mu.Lock()
				l.stats.Compressed++
				l.mu.Unlock()
			}
		}
		l.applyRetention()
	}
}

// segmentEncoderOptions are the zstd settings of rolled-over segments.
// The fastest level: compression runs beside the agent's hot path on busy
// hosts, and JSON lines still shrink about ten-fold at this level. A 1 MiB
// window: a record's matches are in the records just before it (the same
// ratio as the default 8 MiB window, with a third of the encoder's memory).
// No zstd checksum: the frame's XXH64 cost a tenth of the compression time
// and guards nothing the hash chain does not (every decompressed record is
// hashed and linked by the verifier, so a changed byte is found and located
// either way); frames written with a checksum still decode and verify.
var segmentEncoderOptions = []zstd.EOption{zstd.WithEncoderConcurrency(1), zstd.WithEncoderCRC(false),
	zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithWindowSize(1 << 20)}

// compressSegment replaces path by path.zst: written to a temporary file,
// fsync'ed, renamed, and only then is the original removed.
func compressSegment(path string) error {
	in, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("compress %s: %w", path, err)
	}
	defer in.Close()
	tmp := path + zstSuffix + tmpSuffix
	out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("compress %s: %w", path, err)
	}
	enc, err := zstd.NewWriter(out, segmentEncoderOptions...)
	if err == nil {
		_, err = io.Copy(enc, in)
		if cerr := enc.Close(); err == nil {
			err = cerr
		}
	}
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path+zstSuffix)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("compress %s: %w", path, err)
	}
	if info, err := in.Stat(); err == nil {
		// Keep the last-write time: age-based retention goes by it.
		os.Chtimes(path+zstSuffix, info.ModTime(), info.ModTime())
	}
	if err := syncDir(filepath.Dir(path)); err != nil {
		return fmt.Errorf("compress %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("compress %s: remove original: %w", path, err)
	}
	return syncDir(filepath.Dir(path))
}

// retentionPrefix starts the message of the record written before
// retention removes segments; the verifier looks for it.
const retentionPrefix = "retention: removing records before seq "

// applyRetention removes the oldest rolled-over segments the rule selects,
// after committing a record saying so.
func (l *Ledger) applyRetention() {
	r := l.opts.Retention
	if r == (Retention{}) {
		return
	}
	layout, err := scanDir(l.dir)
	if err != nil {
		return
	}
	l.mu.Lock()
	active := l.segFirst
	l.mu.Unlock()
	var total int64
	for _, s := range layout.segments {
		total += s.Size
	}
	now := time.Now()
	cut := 0 // segments[:cut] go
	for cut < len(layout.segments) && layout.segments[cut].First < active {
		s := layout.segments[cut]
		if !(r.MaxBytes > 0 && total > r.MaxBytes || r.MaxAge > 0 && now.Sub(s.ModTime) > r.MaxAge) {
			break
		}
		total -= s.Size
		cut++
	}
	if cut == 0 {
		return
	}
	keepFrom := layout.segments[cut].First
	e := audit.Event{Time: now, Kind: audit.KindAgent, Verdict: audit.VerdictRecorded,
		Severity: audit.SeverityAlert, Mechanism: "ledger",
		Message: fmt.Sprintf("%s%d (%d segments, %s to %s)", retentionPrefix, keepFrom, cut,
			layout.segments[0].Name, layout.segments[cut-1].Name)}
	l.syncMu.Lock()
	l.mu.Lock()
	degraded := l.degraded
	if !degraded {
		l.appendLocked(&e, true)
	}
	l.mu.Unlock()
	err = l.commitLocked()
	l.syncMu.Unlock()
	if degraded || err != nil {
		return
	}
	for _, s := range layout.segments[:cut] {
		if err := os.Remove(filepath.Join(l.dir, s.Name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			l.mu.Lock()
			l.lastErr = fmt.Errorf("retention: %w", err)
			l.mu.Unlock()
			return
		}
		l.mu.Lock()
		l.stats.RemovedSegments++
		l.mu.Unlock()
	}
	for _, c := range layout.checkpoints {
		if c.Size < keepFrom {
			os.Remove(filepath.Join(l.dir, c.Name))
		}
	}
	syncDir(l.dir)
}

// Close writes a final sample summary, commits, signs a final checkpoint,
// finishes compression and releases the directory.
func (l *Ledger) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	l.mu.Unlock()
	close(l.stop)
	<-l.bgDone
	close(l.work)
	<-l.workDone
	var errs []error
	l.syncMu.Lock()
	l.mu.Lock()
	l.summaryLocked(time.Now())
	l.mu.Unlock()
	if _, err := l.checkpointLocked(); err != nil {
		errs = append(errs, err)
	}
	l.flushTiles()
	if err := l.tiles.sync(); err != nil {
		errs = append(errs, err)
	}
	l.syncMu.Unlock()
	l.mu.Lock()
	if l.degraded {
		errs = append(errs, fmt.Errorf("%d records not written: %w", l.stats.PendingLoss, l.lastErr))
	}
	if err := l.seg.Close(); err != nil {
		errs = append(errs, err)
	}
	l.mu.Unlock()
	l.tiles.close()
	if err := l.lock.Close(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("close ledger %s: %w", l.dir, errors.Join(errs...))
	}
	return nil
}
