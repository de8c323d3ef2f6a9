package otlpexport

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/ledger"
	"golang.org/x/mod/sumdb/tlog"
)

// mechanism marks the records an exporter writes to the ledger (throttle
// and loss records); they bypass filters and rate limits.
const mechanism = "export"

// ownReserve is room past the buffer for the exporter's own records
// (loss, throttle): the record saying that records were dropped must not
// be dropped for the same reason.
const ownReserve = 64

// Gap reasons: why records of the ledger are not in the export.
const (
	ReasonFiltered  = "filtered"      // the exporter's filter left them out
	ReasonThrottled = "throttled"     // held back by the per-sandbox rate limit
	ReasonDropped   = "dropped"       // the buffer was full (a loss)
	ReasonBefore    = "before_export" // written before this exporter started
)

// Source is the ledger as the exporter sees it.
type Source interface {
	ID() string
	Dir() string
	// Durable is the sequence number below which records are on stable
	// storage; only those are sent, so a ledger that fails a write and
	// rolls its tail back never takes back a record already exported.
	Durable() uint64
	// Sync makes everything appended durable (at Close).
	Sync() error
	PublicKey() string
	LastCheckpoint() *ledger.Checkpoint
}

// itemKind says what a queued item is.
type itemKind uint8

const (
	itemRecord itemKind = iota
	itemGap
	itemCheckpoint
)

// item is one queued log record to send.
type item struct {
	kind itemKind
	// record
	seq  uint64
	leaf tlog.Hash
	line []byte
	ev   audit.Event
	// gap
	gap *gap
	// checkpoint
	ckpt *ledger.Checkpoint
}

// Stats are an exporter's counters since it started.
type Stats struct {
	Sent      uint64 // records the Collector accepted
	Queued    uint64 // records waiting
	Filtered  uint64
	Throttled uint64
	Dropped   uint64 // buffer full
	Rejected  uint64 // refused by the Collector (partial success, 4xx)
	Failures  uint64 // failed requests (retried)
	Gaps      uint64 // gap records sent
	Ckpts     uint64 // checkpoints sent
	// MetricExports and MetricFailures count metrics requests (SetMetrics).
	MetricExports, MetricFailures uint64
	LastError                     string
}

// Exporter sends the ledger's records to one Collector.
type Exporter struct {
	cfg  Config
	src  Source
	emit func(audit.Event)
	tr   transport
	res  resource

	mu       sync.Mutex
	q        []*item
	nrec     int // record items in q
	next     uint64
	started  bool
	buckets  map[string]*bucket
	stats    Stats
	lossSent uint64 // Dropped+Rejected already recorded in the ledger
	ckptSize uint64 // size of the last checkpoint queued
	ckptSigs int    // and the length of its cosignatures
	closing  bool

	buf []byte // the encoded request, reused; owned by the sending goroutine

	gatherer     prometheus.Gatherer
	metricsEvery time.Duration
	metricsDone  chan struct{}

	// acked: every record below it was sent or covered by a sent gap;
	// saved to the cursor file so a restarted agent resumes there.
	acked, savedAcked uint64
	savedAt           time.Time

	closeOnce sync.Once
	closeErr  error

	wake chan struct{}
	stop chan struct{}
	done chan struct{}
}

// bucket is one sandbox's rate limit state.
type bucket struct {
	tokens   float64
	last     time.Time
	held     uint64 // records held back in the current throttle
	active   bool
	announce bool // throttle-start not yet recorded
	heldAt   time.Time
}

// New returns an exporter; it sends nothing until Begin.
// emit records the exporter's own events (throttle, loss) in the ledger;
// it is called from the exporter's goroutine, never from Tap.
func New(cfg Config, src Source, emit func(audit.Event)) (*Exporter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.withDefaults()
	tr, err := newTransport(&cfg)
	if err != nil {
		return nil, err
	}
	return &Exporter{cfg: cfg, src: src, emit: emit, tr: tr, res: newResource(src),
		buckets: map[string]*bucket{}, wake: make(chan struct{}, 1),
		stop: make(chan struct{}), done: make(chan struct{})}, nil
}

// Name returns the exporter's name.
func (e *Exporter) Name() string { return e.cfg.Name }

// Endpoint returns where the exporter sends.
func (e *Exporter) Endpoint() string { return e.cfg.Endpoint }

// Begin starts sending. start and prefix are what ledger.Tap returned.
// With a cursor file from an earlier run of this exporter on this ledger,
// the records from the cursor to start are read from the ledger's files
// and sent first (what the last run still held at its stop, and the loss
// record it wrote); otherwise the records before start are covered by one
// gap of their subtrees.
func (e *Exporter) Begin(start uint64, prefix []ledger.Subtree) {
	resumed, ok := e.readResume(start)
	e.mu.Lock()
	if ok {
		tapped, n := e.q, e.nrec
		e.q, e.nrec = nil, 0
		for i := range resumed {
			r := &resumed[i]
			if r.dropped {
				e.stats.Dropped++
				e.skip(r.seq, r.leaf, ReasonDropped)
				continue
			}
			e.admitLocked(r.seq, r.leaf, r.line, &r.ev)
		}
		if k := len(e.q); k > 0 && e.q[k-1].kind == itemGap {
			e.q[k-1].gap.sealed = true
		}
		e.q, e.nrec = append(e.q, tapped...), e.nrec+n
	} else if start > 0 {
		g := &gap{from: 0, to: start, nodes: prefix, sealed: true}
		g.count[reasonIndex(ReasonBefore)] = start
		e.q = append([]*item{{kind: itemGap, gap: g}}, e.q...)
	}
	if !e.started && len(e.q) == 0 {
		e.next = start
	}
	e.started = true
	e.mu.Unlock()
	go e.loop()
	if e.gatherer != nil && e.metricsEvery > 0 {
		e.metricsDone = make(chan struct{})
		go e.metricsLoop()
	}
}

// Tap takes one ledger record (ledger.Tap's callback, under the ledger's
// lock): queue it, or account for it in a gap. It never waits.
func (e *Exporter) Tap(t ledger.Tapped) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closing {
		return
	}
	if t.Seq < e.next {
		e.rollbackLocked(t.Seq)
	}
	e.next = t.Seq + 1
	e.admitLocked(t.Seq, t.Leaf, t.Line, t.Event)
}

// durable reports whether it may be sent: all of its records are below
// the ledger's durable point.
func (it *item) durable(durable uint64) bool {
	switch it.kind {
	case itemRecord:
		return it.seq < durable
	case itemGap:
		return it.gap.to <= durable
	}
	return true
}

// rollbackLocked forgets the queued records from seq on: the ledger
// failed to write them and reuses their sequence numbers. None was sent
// (only durable records are). A gap that starts before seq and reaches
// past it cannot be cut (its subtree hashes are merged); it stays, and a
// verifier will find its root does not match: the ledger's loss record
// says why.
func (e *Exporter) rollbackLocked(seq uint64) {
	for k := len(e.q) - 1; k >= 0; k-- {
		it := e.q[k]
		switch {
		case it.kind == itemRecord && it.seq >= seq:
			e.nrec--
		case it.kind == itemGap && it.gap.from >= seq:
		default:
			continue
		}
		e.q = append(e.q[:k], e.q[k+1:]...)
	}
}

// admitLocked queues a record, or accounts for it in a gap.
func (e *Exporter) admitLocked(seq uint64, leaf tlog.Hash, line []byte, ev *audit.Event) {
	reason := ""
	switch {
	case !e.cfg.Filter.selected(ev):
		reason = ReasonFiltered
		e.stats.Filtered++
	case !e.allow(ev):
		reason = ReasonThrottled
		e.stats.Throttled++
	case e.nrec >= e.cfg.BufferRecords+ownReserve || (e.nrec >= e.cfg.BufferRecords && ev.Mechanism != mechanism):
		reason = ReasonDropped
		e.stats.Dropped++
	}
	if reason != "" {
		e.skip(seq, leaf, reason)
		return
	}
	if n := len(line); n > 0 && line[n-1] == '\n' {
		line = line[:n-1]
	}
	e.q = append(e.q, &item{kind: itemRecord, seq: seq, leaf: leaf,
		line: append([]byte(nil), line...), ev: *ev})
	e.nrec++
	if e.nrec >= e.cfg.BatchRecords {
		select {
		case e.wake <- struct{}{}:
		default:
		}
	}
}

// skip adds a record left out to the open gap at the end of the queue.
func (e *Exporter) skip(seq uint64, leaf tlog.Hash, reason string) {
	var g *gap
	if n := len(e.q); n > 0 && e.q[n-1].kind == itemGap && !e.q[n-1].gap.sealed && e.q[n-1].gap.to == seq {
		g = e.q[n-1].gap
	} else {
		g = &gap{from: seq, to: seq}
		e.q = append(e.q, &item{kind: itemGap, gap: g})
	}
	g.add(seq, leaf, reason)
}

// allow applies the per-sandbox rate limit.
func (e *Exporter) allow(ev *audit.Event) bool {
	if e.cfg.RateLimit <= 0 || ev.Sandbox.Name == "" || ev.Kind == audit.KindLoss || ev.Mechanism == mechanism {
		return true
	}
	now := time.Now()
	b := e.buckets[ev.Sandbox.Name]
	if b == nil {
		b = &bucket{tokens: float64(e.cfg.RateBurst), last: now}
		e.buckets[ev.Sandbox.Name] = b
	}
	b.tokens = min(float64(e.cfg.RateBurst), b.tokens+now.Sub(b.last).Seconds()*e.cfg.RateLimit)
	b.last = now
	if b.tokens >= 1 {
		b.tokens--
		return true
	}
	if !b.active {
		b.active, b.announce = true, true
	}
	b.held++
	b.heldAt = now
	return false
}

// Stats returns a snapshot of the counters.
func (e *Exporter) Stats() Stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.stats
	s.Queued = uint64(e.nrec)
	return s
}

// loop sends batches until Close.
func (e *Exporter) loop() {
	defer close(e.done)
	t := time.NewTicker(e.cfg.BatchInterval)
	defer t.Stop()
	backoff := time.Duration(0)
	for {
		if backoff > 0 {
			select {
			case <-e.stop:
				return
			case <-time.After(backoff):
			}
		} else {
			select {
			case <-e.stop:
				return
			case <-t.C:
			case <-e.wake:
			}
		}
		e.report()
		e.queueCheckpoint()
		err := e.flush(context.Background())
		e.saveCursor(false)
		if err != nil {
			backoff = min(max(2*backoff, 100*time.Millisecond), 5*time.Second)
		} else {
			backoff = 0
		}
	}
}

// flush sends what is queued, batch by batch, until the queue is empty;
// it stops at the first failure. The ticker and a full batch call it.
func (e *Exporter) flush(ctx context.Context) error {
	for {
		durable := e.src.Durable()
		e.mu.Lock()
		n := 0
		for n < len(e.q) && n < e.cfg.BatchRecords && e.q[n].durable(durable) {
			n++
		}
		if n == 0 {
			e.mu.Unlock()
			return nil
		}
		batch := make([]*item, n)
		copy(batch, e.q[:n])
		for _, it := range batch {
			if it.kind == itemGap {
				it.gap.sealed = true
			}
		}
		e.mu.Unlock()
		rejected, err := e.send(ctx, batch)
		e.mu.Lock()
		if err != nil {
			e.stats.Failures++
			e.stats.LastError = err.Error()
			e.mu.Unlock()
			var perm *permanentError
			if !errors.As(err, &perm) {
				return err
			}
			// The Collector refused the request as malformed: retrying
			// cannot help; the records count as rejected.
			e.mu.Lock()
			rejected = uint64(n)
		}
		e.q = e.q[n:]
		for _, it := range batch {
			switch it.kind {
			case itemRecord:
				e.nrec--
				e.stats.Sent++
				e.acked = max(e.acked, it.seq+1)
			case itemGap:
				e.stats.Gaps++
				e.acked = max(e.acked, it.gap.to)
			case itemCheckpoint:
				e.stats.Ckpts++
			}
		}
		e.stats.Sent -= min(e.stats.Sent, rejected)
		e.stats.Rejected += rejected
		if len(e.q) == 0 {
			e.q = nil // let the backing array go
		}
		e.mu.Unlock()
	}
}

// queueCheckpoint queues the ledger's newest checkpoint if it is new.
func (e *Exporter) queueCheckpoint() {
	c := e.src.LastCheckpoint()
	if c == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	// A new checkpoint, or the same one with more witness cosignatures.
	if c.Size < e.ckptSize || (c.Size == e.ckptSize && len(c.Cosigs) <= e.ckptSigs) {
		return
	}
	e.ckptSize, e.ckptSigs = c.Size, len(c.Cosigs)
	e.q = append(e.q, &item{kind: itemCheckpoint, ckpt: c})
}

// report records throttles and losses in the ledger (through emit, which
// comes back through Tap: so never with e.mu held).
func (e *Exporter) report() {
	var evs []audit.Event
	now := time.Now()
	e.mu.Lock()
	for name, b := range e.buckets {
		if b.announce {
			b.announce = false
			evs = append(evs, audit.Event{Kind: audit.KindAgent, Verdict: audit.VerdictRecorded, Severity: audit.SeverityAlert,
				Mechanism: mechanism, Sandbox: audit.Sandbox{Name: name},
				Message: fmt.Sprintf("export %s: throttle start: sandbox over %g records/s; its records stay in the ledger", e.cfg.Name, e.cfg.RateLimit)})
		}
		if b.active && now.Sub(b.heldAt) >= time.Second {
			evs = append(evs, audit.Event{Kind: audit.KindLoss, Verdict: audit.VerdictRecorded, Severity: audit.SeverityAlert,
				Mechanism: mechanism, Sandbox: audit.Sandbox{Name: name},
				Loss:    &audit.LossDetail{Stage: "export:" + e.cfg.Name + ":throttle", Count: b.held},
				Message: fmt.Sprintf("export %s: throttle stop: %d records held back (in the ledger, not exported)", e.cfg.Name, b.held)})
			b.active, b.held = false, 0
		}
	}
	if lost := e.stats.Dropped + e.stats.Rejected; lost > e.lossSent {
		evs = append(evs, e.lossEvent("buffer", lost-e.lossSent))
		e.lossSent = lost
	}
	e.mu.Unlock()
	for _, ev := range evs {
		e.emit(ev)
	}
}

func (e *Exporter) lossEvent(stage string, n uint64) audit.Event {
	return audit.Event{Kind: audit.KindLoss, Verdict: audit.VerdictRecorded, Severity: audit.SeverityAlert,
		Mechanism: mechanism, Loss: &audit.LossDetail{Stage: "export:" + e.cfg.Name + ":" + stage, Count: n},
		Message: fmt.Sprintf("export %s: %d records not delivered to the collector (they are in the ledger)", e.cfg.Name, n)}
}

// Close sends what it can within wait, then stops; records still queued
// are recorded as lost (stage export:NAME:shutdown). Call it before the
// ledger closes.
func (e *Exporter) Close(wait time.Duration) error {
	e.closeOnce.Do(func() { e.closeErr = e.close(wait) })
	return e.closeErr
}

func (e *Exporter) close(wait time.Duration) error {
	e.mu.Lock()
	started := e.started
	e.mu.Unlock()
	if started {
		close(e.stop)
		<-e.done
		if e.metricsDone != nil {
			<-e.metricsDone
		}
		if err := e.src.Sync(); err != nil {
			e.mu.Lock()
			e.stats.LastError = "ledger sync at close: " + err.Error()
			e.mu.Unlock()
		}
		e.report()
		e.queueCheckpoint()
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		for ctx.Err() == nil {
			if err := e.flush(ctx); err == nil {
				break
			}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
		cancel()
		e.report()
		e.saveCursor(true)
	}
	e.mu.Lock()
	e.closing = true
	left := uint64(e.nrec)
	e.mu.Unlock()
	if left > 0 {
		e.emit(e.lossEvent("shutdown", left))
	}
	return e.tr.close()
}
