package ledger

import (
	"path/filepath"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
)

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
	rows := l.sampler.Rows()
	if len(rows) == 0 {
		return
	}
	e := audit.Event{Time: now, Kind: audit.KindSampleSummary, Verdict: audit.VerdictRecorded,
		Severity: audit.SeverityRoutine, Mechanism: "ledger", Summary: &audit.SampleSummary{Rows: rows}}
	l.appendLocked(&e, false)
	l.sampler.Reset()
}
