package ledger

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/mod/sumdb/note"
)

// Checkpoint layout. A ledger keeps two checkpoint files whatever its
// size:
//
//	checkpoint    the latest checkpoint and its cosignatures (replaced)
//	checkpoints   every checkpoint signed, and again each time one gained
//	              cosignatures, as signed notes one after another
//	              (append-only; a verifier unions the cosignatures of
//	              identical notes)
//
// Ledgers written before this layout have one ckpt-<size>.note file per
// checkpoint; Open appends them to checkpoints and removes them, and
// Verify reads them where they still are.
const historyName = "checkpoints"

// historyEntry is one signed note in the history file.
type historyEntry struct {
	off  int64
	note []byte
}

// splitHistory splits the history file into signed notes. A note is text
// lines, an empty line, and signature lines ("— ..."); the next note
// starts at the first line after them that is not a signature. An
// incomplete last note (a torn append) is returned as torn offset >= 0.
func splitHistory(data []byte) (entries []historyEntry, torn int64) {
	torn = -1
	start, off := 0, 0
	inSigs, sigs := false, 0
	for off < len(data) {
		end := bytes.IndexByte(data[off:], '\n')
		if end < 0 {
			break // unterminated line: torn
		}
		line := data[off : off+end]
		switch {
		case inSigs && bytes.HasPrefix(line, []byte("— ")):
			sigs++
		case inSigs:
			entries = append(entries, historyEntry{int64(start), data[start:off]})
			start, inSigs, sigs = off, false, 0
			if len(line) == 0 {
				inSigs = true
			}
		case len(line) == 0:
			inSigs = true
		}
		off += end + 1
	}
	if inSigs && sigs > 0 && off == len(data) {
		entries = append(entries, historyEntry{int64(start), data[start:]})
	} else if start < len(data) {
		torn = int64(start)
	}
	return entries, torn
}

// appendHistory appends signed notes to the history file and syncs it.
func appendHistory(dir string, notes ...[]byte) error {
	path := filepath.Join(dir, historyName)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	for _, n := range notes {
		if _, err = f.Write(n); err != nil {
			break
		}
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("append %s: %w", path, err)
	}
	return nil
}

// mergeCheckpoints unions the cosignatures of checkpoints with the same
// note and sorts them by size (stable: the first occurrence's name stays).
func mergeCheckpoints(in []*Checkpoint) []*Checkpoint {
	var out []*Checkpoint
	byNote := map[string]*Checkpoint{}
	for _, c := range in {
		m, ok := byNote[string(c.Note)]
		if !ok {
			cc := *c
			byNote[string(c.Note)] = &cc
			out = append(out, &cc)
			continue
		}
		m.Cosigs = unionSigs(m.Cosigs, c.Cosigs)
	}
	slices.SortStableFunc(out, func(a, b *Checkpoint) int { return cmpU64(a.Size, b.Size) })
	return out
}

// unionSigs appends to a the signature lines of b it lacks.
func unionSigs(a, b []byte) []byte {
	out := append([]byte(nil), a...)
	for _, line := range bytes.SplitAfter(b, []byte("\n")) {
		if len(line) > 0 && !bytes.Contains(append([]byte("\n"), out...), append([]byte("\n"), line...)) {
			out = append(out, line...)
		}
	}
	return out
}

// readHistory parses and verifies the history file. Problems name the
// file and the offset of the bad note.
func readHistory(dir string, v note.Verifier) (cs []*Checkpoint, torn int64, err error) {
	path := filepath.Join(dir, historyName)
	data, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil, -1, nil
	}
	if err != nil {
		return nil, -1, fmt.Errorf("read %s: %w", path, err)
	}
	entries, torn := splitHistory(data)
	for _, e := range entries {
		c, err := ParseCosigned(e.note, v)
		if err != nil {
			return nil, torn, &historyError{path: path, off: e.off, err: err}
		}
		c.File = fmt.Sprintf("%s@%d", path, e.off)
		cs = append(cs, c)
	}
	return cs, torn, nil
}

// historyError is a bad note in the history file.
type historyError struct {
	path string
	off  int64
	err  error
}

func (e *historyError) Error() string {
	return fmt.Sprintf("checkpoint history %s at offset %d: %v", e.path, e.off, e.err)
}
func (e *historyError) Unwrap() error { return e.err }

// checkTornHistory accepts an incomplete last note at torn only when it is
// a prefix of the latest checkpoint as stored (an append cut short).
func checkTornHistory(path string, torn int64, latest *Checkpoint) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	tail := data[torn:]
	if latest != nil && (bytes.HasPrefix(latest.Cosigned(), tail) || bytes.HasPrefix(latest.Note, tail)) {
		return nil
	}
	return fmt.Errorf("checkpoint history %s: damaged note at offset %d (not an interrupted append of %s)", path, torn, latestName)
}

// inHistory reports whether the history holds c with all its cosignatures.
func inHistory(hist []*Checkpoint, c *Checkpoint) bool {
	for _, h := range hist {
		if bytes.Equal(h.Note, c.Note) && bytes.Equal(unionSigs(h.Cosigs, c.Cosigs), h.Cosigs) {
			return true
		}
	}
	return false
}
