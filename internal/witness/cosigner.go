package witness

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/ledger"
	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

// Log is what the Cosigner needs of the ledger (*ledger.Ledger).
type Log interface {
	LastCheckpoint() *ledger.Checkpoint
	CheckpointNotify() <-chan struct{}
	ProveConsistency(old uint64, c *ledger.Checkpoint) (tlog.TreeProof, error)
	AddCosignatures(size uint64, sigs []byte) error
}

// Options configure a Cosigner.
type Options struct {
	// Witnesses to submit every checkpoint to.
	Witnesses []*Witness
	// Notify receives alerts (a witness refusing the ledger's history) and
	// notices; the agent passes them into its event pipeline.
	Notify func(audit.Event)
	// HTTP is the client for requests (default: 10s timeout).
	HTTP *http.Client
	// MinBackoff and MaxBackoff bound the wait between retries of an
	// unreachable witness (defaults 1s and 1m).
	MinBackoff, MaxBackoff time.Duration
}

// Status is one witness's state.
type Status struct {
	Name, URL string
	// Cosigned is the size of the last checkpoint it cosigned (0: none yet
	// in this run, unless the stored checkpoint carried its cosignature).
	Cosigned uint64
	// Failures counts consecutive failed submissions; LastError is the last.
	Failures  int
	LastError string
	// Refused is set while the witness refuses the ledger's history.
	Refused bool
}

// Cosigner submits the ledger's checkpoints to witnesses.
type Cosigner struct {
	log    Log
	opts   Options
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	changed chan struct{} // closed and replaced on every status change
	status  []Status
}

// Start starts one submitter per witness.
func Start(l Log, opts Options) *Cosigner {
	if opts.HTTP == nil {
		opts.HTTP = &http.Client{Timeout: 10 * time.Second}
	}
	if opts.MinBackoff <= 0 {
		opts.MinBackoff = time.Second
	}
	if opts.MaxBackoff < opts.MinBackoff {
		opts.MaxBackoff = max(time.Minute, opts.MinBackoff)
	}
	if opts.Notify == nil {
		opts.Notify = func(audit.Event) {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &Cosigner{log: l, opts: opts, cancel: cancel, changed: make(chan struct{})}
	c.status = make([]Status, len(opts.Witnesses))
	// The notify channel is shared: one goroutine fans it out.
	wake := make([]chan struct{}, len(opts.Witnesses))
	for i, w := range opts.Witnesses {
		c.status[i] = Status{Name: w.Name, URL: w.URL}
		wake[i] = make(chan struct{}, 1)
		c.wg.Add(1)
		go c.run(ctx, i, w, wake[i])
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		for {
			select {
			case <-ctx.Done():
				return
			case <-l.CheckpointNotify():
				for _, ch := range wake {
					select {
					case ch <- struct{}{}:
					default:
					}
				}
			}
		}
	}()
	return c
}

// Stop ends the submitters (a request in flight is abandoned).
func (c *Cosigner) Stop() {
	c.cancel()
	c.wg.Wait()
}

// Status returns each witness's state.
func (c *Cosigner) Status() []Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.status)
}

// Wait blocks until at least quorum witnesses cosigned a checkpoint of at
// least size records, or ctx ends.
func (c *Cosigner) Wait(ctx context.Context, size uint64, quorum int) error {
	for {
		c.mu.Lock()
		n := 0
		for _, s := range c.status {
			if s.Cosigned >= size {
				n++
			}
		}
		ch := c.changed
		c.mu.Unlock()
		if n >= quorum {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d of %d witnesses cosigned size %d: %w", n, quorum, size, ctx.Err())
		case <-ch:
		}
	}
}

func (c *Cosigner) update(i int, f func(*Status)) {
	c.mu.Lock()
	f(&c.status[i])
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
}

// run submits checkpoints to witness w until ctx ends.
func (c *Cosigner) run(ctx context.Context, i int, w *Witness, wake <-chan struct{}) {
	defer c.wg.Done()
	// What the witness last cosigned: known from the stored checkpoint if
	// it carries its cosignature, else learnt from its 409 answer.
	var known uint64
	if cp := c.log.LastCheckpoint(); cp != nil {
		if ok, _ := cosignedBy(cp, w); ok {
			known = cp.Size
			c.update(i, func(s *Status) { s.Cosigned = cp.Size })
		}
	}
	failures := 0
	var downSince time.Time // first failure of the current outage, once reported
	refusedAt := uint64(0)  // checkpoint size the witness refused; not retried
	for {
		cp := c.log.LastCheckpoint()
		pending := cp != nil && cp.Size > c.cosigned(i) && cp.Size != refusedAt
		if !pending {
			select {
			case <-ctx.Done():
				return
			case <-wake:
				continue
			}
		}
		err := c.submit(ctx, w, cp, &known)
		if ctx.Err() != nil {
			return
		}
		var refusal *refusalError
		switch {
		case err == nil:
			if !downSince.IsZero() {
				c.opts.Notify(noticeEvent(fmt.Sprintf("witness %s reachable again after %s; cosigned checkpoint size %d", w.Name, time.Since(downSince).Round(time.Second), cp.Size)))
				downSince = time.Time{}
			}
			failures = 0
			c.update(i, func(s *Status) { s.Cosigned, s.Failures, s.LastError, s.Refused = cp.Size, 0, "", false })
			continue
		case errors.As(err, &refusal):
			// A refusal is about this history: alert once, try again only
			// with the next checkpoint.
			refusedAt = cp.Size
			failures = 0
			c.update(i, func(s *Status) { s.Refused, s.LastError = true, err.Error() })
			c.opts.Notify(alertEvent(w, cp, refusal))
			continue
		}
		failures++
		if failures == unreachableNotice {
			// Once per outage: the checkpoints wait, nothing is lost.
			downSince = time.Now()
			c.opts.Notify(noticeEvent(fmt.Sprintf("witness %s unreachable (%d attempts): %v; checkpoints wait for it", w.Name, failures, err)))
		}
		c.update(i, func(s *Status) { s.Failures, s.LastError = failures, err.Error() })
		d := backoff(failures-1, c.opts.MinBackoff, c.opts.MaxBackoff)
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

func (c *Cosigner) cosigned(i int) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.status[i].Cosigned
}

// refusalError is a witness's refusal of the ledger's history (not an
// outage): a fork or truncation, or a witness that does not know the log.
type refusalError struct {
	reason string
	err    error
}

func (e *refusalError) Error() string { return e.reason }
func (e *refusalError) Unwrap() error { return e.err }

// submit sends cp to w with a proof from *known, following one 409 to the
// size the witness reports.
func (c *Cosigner) submit(ctx context.Context, w *Witness, cp *ledger.Checkpoint, known *uint64) error {
	for attempt := 0; ; attempt++ {
		if *known > cp.Size {
			return &refusalError{reason: fmt.Sprintf("witness %s has cosigned %d records of this ledger, which now has %d: records were removed or the history forked", w.Name, *known, cp.Size)}
		}
		proof, err := c.log.ProveConsistency(*known, cp)
		if err != nil {
			return fmt.Errorf("witness %s: %w", w.Name, err)
		}
		sigs, err := w.AddCheckpoint(ctx, c.opts.HTTP, *known, proof, cp.Note)
		var conflict *ConflictError
		switch {
		case err == nil:
			*known = cp.Size
			if err := c.log.AddCosignatures(cp.Size, sigs); err != nil && !errors.Is(err, ledger.ErrStaleCheckpoint) {
				return err
			}
			return nil
		case errors.As(err, &conflict):
			if attempt > 0 || conflict.Known == *known {
				return &refusalError{reason: fmt.Sprintf("witness %s keeps answering 409 (size %d)", w.Name, conflict.Known), err: err}
			}
			*known = conflict.Known
			continue
		case errors.Is(err, ErrInconsistent):
			return &refusalError{reason: fmt.Sprintf("witness %s refused checkpoint %d: not consistent with the checkpoint of size %d it cosigned before: the ledger's history was rewritten", w.Name, cp.Size, *known), err: err}
		case errors.Is(err, ErrUnknownLog):
			return &refusalError{reason: fmt.Sprintf("witness %s refused checkpoint %d: %v (register origin %s and the ledger key with it)", w.Name, cp.Size, err, cp.Origin), err: err}
		}
		return err
	}
}

// cosignedBy reports whether cp carries a valid cosignature of w.
func cosignedBy(cp *ledger.Checkpoint, w *Witness) (bool, error) {
	names, err := cp.Cosigners([]note.Verifier{w.verifier})
	return len(names) > 0, err
}

func alertEvent(w *Witness, cp *ledger.Checkpoint, err error) audit.Event {
	return audit.Event{Time: time.Now(), Kind: audit.KindAgent, Verdict: audit.VerdictRecorded, Severity: audit.SeverityAlert,
		Mechanism: "witness", Message: err.Error() + " (checkpoint " + cp.Origin + " size " + fmt.Sprint(cp.Size) + ", witness " + w.URL + ")"}
}

// unreachableNotice is the failed attempt that is reported (the first few
// are ordinary hiccups).
const unreachableNotice = 3

func noticeEvent(msg string) audit.Event {
	return audit.Event{Time: time.Now(), Kind: audit.KindAgent, Verdict: audit.VerdictRecorded, Severity: audit.SeverityRoutine,
		Mechanism: "witness", Message: msg}
}

func jitter() float64 { return rand.Float64() }
