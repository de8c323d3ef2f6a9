package ledger

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/mod/sumdb/tlog"
)

// initTiles opens the tree hash files and brings them in line with the
// records (n of them): cut back when ahead, rebuilt when they disagree
// with the latest checkpoint, extended from the segments when behind
// (after a machine crash, or for a ledger written before they existed).
// When the records needed were removed by retention, proofs are off and
// Stats.LastError says why; the ledger itself keeps working.
func (l *Ledger) initTiles(layout *dirLayout, n uint64, latest *Checkpoint) error {
	t, err := openTiles(l.dir)
	if err != nil {
		return err
	}
	l.tiles = t
	if t.n[0] > n {
		if err := t.truncateLocked(n); err != nil {
			return err
		}
	}
	if latest != nil && t.n[0] >= latest.Size && latest.Size > 0 {
		if _, err := tlog.TreeHash(int64(latest.Size), hashReader(latest.Size, latest.Root, t)); err != nil {
			if err := t.truncateLocked(0); err != nil {
				return err
			}
		}
	}
	if t.n[0] < n {
		if err := l.fillTiles(layout, t.n[0], n); err != nil {
			t.err = fmt.Errorf("tree hash files: %w", err)
			l.lastErr = t.err
		}
	}
	l.leavesBase = n
	return nil
}

// fillTiles appends the hashes of records [from, to) read from the
// segments.
func (l *Ledger) fillTiles(layout *dirLayout, from, to uint64) error {
	segs := layout.segments
	start := -1
	for i, s := range segs {
		if s.First <= from {
			start = i
		}
	}
	if start < 0 {
		return fmt.Errorf("records %d..%d were removed by retention before the tree hash files were written; inclusion and consistency proofs are unavailable", from, segs[0].First-1)
	}
	lh := newLeafHasher()
	batch := make([]tlog.Hash, 0, 4096)
	next := from
	for _, s := range segs[start:] {
		if next >= to {
			break
		}
		path := filepath.Join(l.dir, s.Name)
		err := func() error {
			rd, _, closeFn, err := openSegment(path, s.Compressed)
			if err != nil {
				return fmt.Errorf("open segment %s: %w", path, err)
			}
			defer closeFn()
			lr := newLineReader(rd)
			if _, _, _, err := lr.next(); err != nil {
				return fmt.Errorf("%s: read header: %w", path, err)
			}
			for next < to {
				line, off, tooLong, err := lr.next()
				if err == io.EOF {
					return nil
				}
				if err != nil || tooLong {
					return fmt.Errorf("%s: read at offset %d: %v", path, off, err)
				}
				f, err := parseFrame(line)
				if err != nil {
					return fmt.Errorf("%s: record at offset %d: %w", path, off, err)
				}
				if f.seq < next {
					continue
				}
				if f.seq != next {
					return fmt.Errorf("%s: record %d where %d was expected", path, f.seq, next)
				}
				batch = append(batch, lh.hash(f.body))
				next++
				if len(batch) == cap(batch) {
					if err := l.tiles.add(batch); err != nil {
						return err
					}
					batch = batch[:0]
				}
			}
			return nil
		}()
		if err != nil {
			return err
		}
	}
	if err := l.tiles.add(batch); err != nil {
		return err
	}
	if next < to {
		return fmt.Errorf("segments end at record %d, expected %d", next, to)
	}
	return nil
}

// tileNode is the root of a perfect subtree of 256^level records.
type tileNode struct {
	level int // tile level (tree level / 8)
	index uint64
	hash  tlog.Hash
}

func (n tileNode) end() uint64 { return (n.index + 1) << (TileHeight * n.level) }

// captureNode keeps the subtree roots the frontier computes anyway that
// belong in the tree files above level 0 (every 8th tree level), so the
// tiles cost no hashing of their own. Called with mu held.
func (l *Ledger) captureNode(level int, index int64, h tlog.Hash) {
	if level > 0 && level%TileHeight == 0 {
		l.uppers = append(l.uppers, tileNode{level / TileHeight, uint64(index), h})
	}
}

// flushTiles moves the hashes of acknowledged records into the tree hash
// files. Called with syncMu held.
func (l *Ledger) flushTiles() {
	l.mu.Lock()
	k := l.durable.next - l.leavesBase
	if l.durable.next < l.leavesBase || k == 0 || uint64(len(l.leaves)) < k {
		l.mu.Unlock()
		return
	}
	// The batch buffer is reused: flushTiles runs under syncMu only.
	batch := append(l.tileBatch[:0], l.leaves[:k]...)
	l.tileBatch = batch
	l.leaves = append(l.leaves[:0], l.leaves[k:]...)
	l.leavesBase += k
	var up []tileNode
	for len(l.uppers) > 0 && l.uppers[0].end() <= l.durable.next {
		up = append(up, l.uppers[0])
		l.uppers = l.uppers[1:]
	}
	if len(l.uppers) == 0 {
		l.uppers = nil // let the backing array go
	}
	l.mu.Unlock()
	if err := l.tiles.addComputed(batch, up); err != nil {
		l.mu.Lock()
		l.lastErr = err
		l.mu.Unlock()
	}
	if cap(batch) > 1<<16 {
		l.tileBatch = nil // a rare large batch (after a stall) is not kept
	}
}

// rollbackLeaves drops pending hashes of records after n (a failed write
// cut the chain back). Called with mu held.
func (l *Ledger) rollbackLeaves(n uint64) {
	if n < l.leavesBase {
		n = l.leavesBase
	}
	if k := n - l.leavesBase; k < uint64(len(l.leaves)) {
		l.leaves = l.leaves[:k]
	}
	for len(l.uppers) > 0 && l.uppers[len(l.uppers)-1].end() > n {
		l.uppers = l.uppers[:len(l.uppers)-1]
	}
}

// removeTiles deletes tree hash files left in a directory without
// segments (a new ledger starts from an empty tree).
func removeTiles(dir string, names []string) error {
	for _, n := range names {
		if err := os.Remove(filepath.Join(dir, n)); err != nil && !os.IsNotExist(err) {
			return fmt.Errorf("remove %s: %w", filepath.Join(dir, n), err)
		}
	}
	return nil
}
