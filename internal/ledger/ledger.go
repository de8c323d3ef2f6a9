package ledger

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/pipeline"
	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
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
	sampler    *pipeline.Sampler
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
	tileBatch  []tlog.Hash // flushTiles' reused copy of leaves (syncMu)
	ckptMu     sync.Mutex  // serialises writes of DIR/checkpoint
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
