package otlpexport

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/ledger"
	"golang.org/x/mod/sumdb/tlog"
)

// resumedRecord is a record read back from the ledger's files at Begin.
type resumedRecord struct {
	seq     uint64
	leaf    tlog.Hash
	line    []byte
	ev      audit.Event
	dropped bool // past the buffer: kept as its leaf hash only
}

// readCursor returns the cursor file's position for this ledger.
func (e *Exporter) readCursor() (uint64, bool) {
	if e.cfg.CursorFile == "" {
		return 0, false
	}
	data, err := os.ReadFile(e.cfg.CursorFile)
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(data))
	if len(f) != 2 || f[0] != e.src.ID() {
		return 0, false // another ledger: start over
	}
	n, err := strconv.ParseUint(f[1], 10, 64)
	return n, err == nil
}

// readResume reads the records [cursor, start) back from the ledger's
// files, outside any lock (Tap keeps running meanwhile). ok is false
// when there is no cursor or the files cannot give all of them: Begin
// then covers [0, start) with a gap instead.
func (e *Exporter) readResume(start uint64) (out []resumedRecord, ok bool) {
	from, found := e.readCursor()
	if !found || from > start {
		return nil, false
	}
	e.acked = from
	if from == start {
		return nil, true
	}
	r, err := ledger.NewReaderFrom(e.src.Dir(), from)
	if err != nil {
		return nil, false
	}
	defer r.Close()
	next, kept := from, 0
	for next < start {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) || err != nil {
			return nil, false
		}
		if rec.Seq < from {
			continue
		}
		if rec.Seq != next {
			return nil, false
		}
		rr := resumedRecord{seq: rec.Seq, leaf: rec.Hash}
		if !e.cfg.Filter.selected(&rec.Event) || kept < e.cfg.BufferRecords {
			rr.line, rr.ev = rec.Raw, rec.Event
			kept++
		} else {
			rr.dropped = true
		}
		out = append(out, rr)
		next++
	}
	return out, true
}

// saveCursor writes the acknowledged position, at most once a second
// unless now.
func (e *Exporter) saveCursor(now bool) {
	if e.cfg.CursorFile == "" {
		return
	}
	e.mu.Lock()
	acked, saved := e.acked, e.savedAcked
	e.mu.Unlock()
	if acked == saved || (!now && time.Since(e.savedAt) < time.Second) {
		return
	}
	tmp := e.cfg.CursorFile + ".tmp"
	err := os.WriteFile(tmp, fmt.Appendf(nil, "%s %d\n", e.src.ID(), acked), 0o600)
	if err == nil {
		err = os.Rename(tmp, e.cfg.CursorFile)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if err != nil {
		e.stats.LastError = fmt.Sprintf("cursor %s: %v", filepath.Base(e.cfg.CursorFile), err)
		return
	}
	e.savedAcked, e.savedAt = acked, time.Now()
}
