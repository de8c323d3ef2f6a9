package ledger

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
)

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
