package ledger

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"slices"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"golang.org/x/mod/sumdb/tlog"
	"golang.org/x/sys/unix"
)

// Append adds e to the ledger unless sampling drops it, and returns its
// sequence number and whether it was kept. Secrets are redacted first
// (audit.Redact) and a missing time is set: this is the way in for
// everything that does not come through the agent's pipeline (watcher
// workspace, exec proofs, the ledger's own records), so no record reaches
// the file unredacted. The record is acknowledged (durable) once Durable()
// exceeds seq or a later Sync returns nil. While the ledger cannot write
// (for example ENOSPC) kept records are counted and ErrNotWritten is
// returned; they are reported in a loss record once writing works again.
func (l *Ledger) Append(e audit.Event) (seq uint64, kept bool, err error) {
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	audit.Redact(&e)
	return l.append(&e)
}

// AppendRedacted is Append for an event the pipeline's redact stage has
// already redacted (pipeline.LedgerSink): it is appended as it is, not
// redacted a second time, and neither kept nor changed. Only the pipeline
// calls it; anything else appends with Append.
func (l *Ledger) AppendRedacted(e *audit.Event) (seq uint64, kept bool, err error) {
	if e.Time.IsZero() {
		// The enrich stage sets it; a record without a time is still
		// never written.
		cp := *e
		cp.Time = time.Now()
		e = &cp
	}
	return l.append(e)
}

// append samples, encodes and buffers e, which it does not change.
func (l *Ledger) append(e *audit.Event) (seq uint64, kept bool, err error) {
	alert := e.IsAlert()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return 0, false, ErrClosed
	}
	l.stats.Offered++
	if !l.sampler.Offer(e, alert) {
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
	seq = l.appendLocked(e, alert)
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

// NotifyRedacted is Notify for the pipeline's ledger sink
// (pipeline.RedactedAppender): AppendRedacted, failing only after Close.
func (l *Ledger) NotifyRedacted(e *audit.Event) error {
	_, _, err := l.AppendRedacted(e)
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
		// Cut a copy: e may be the pipeline's, which later sinks see.
		cp := *e
		cp.Redacted = slices.Clip(cp.Redacted)
		fitEvent(&cp)
		e = &cp
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
