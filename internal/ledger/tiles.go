package ledger

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/mod/sumdb/tlog"
)

// Tree hash files. The Merkle tree over the records is kept as C2SP
// tlog-tiles of height 8, one flat file per tile level: tree-<L>.hashes
// holds, in order, the hashes of the perfect subtrees of 256^L records
// (level 0: the record hashes themselves). A tile (L, N, width W) is bytes
// [N*256*32, (N*256+W)*32) of file L, so serving, proving (inclusion and
// consistency) and checking a checkpoint need no scan of the segments.
// The files cost 32 bytes per record (plus 1/256 for each level above)
// and are never removed by retention, so proofs stay possible after old
// segments are gone. They are derived data: Open checks them against the
// latest checkpoint and rebuilds them from the segments when they lag,
// disagree or are missing (a ledger written before they existed).
const (
	treePrefix = "tree-"
	treeSuffix = ".hashes"
	// TileHeight is the height of the ledger's tiles (C2SP tlog-tiles).
	TileHeight = 8
	tileWidth  = 1 << TileHeight
	// maxTreeLevels bounds the levels: 256^8 records is beyond any ledger.
	maxTreeLevels = 8
)

func treeName(level int) string { return treePrefix + strconv.Itoa(level) + treeSuffix }

func parseTreeName(name string) (int, bool) {
	s, ok := strings.CutPrefix(name, treePrefix)
	if !ok {
		return 0, false
	}
	s, ok = strings.CutSuffix(s, treeSuffix)
	if !ok || len(s) != 1 || s[0] < '0' || s[0] >= '0'+maxTreeLevels {
		return 0, false
	}
	return int(s[0] - '0'), true
}

// tileStore is the writer's handle on the tree hash files. Reads may run
// concurrently with appends.
type tileStore struct {
	dir string
	mu  sync.RWMutex
	f   []*os.File    // by level, opened on demand
	n   []uint64      // entries per level
	cur [][]tlog.Hash // per level, the entries of the incomplete last tile
	err error         // set when the files could not be written: proofs are off
}

// openTiles opens (creating) the tree hash files of dir, cutting any
// partial trailing hash.
func openTiles(dir string) (*tileStore, error) {
	t := &tileStore{dir: dir}
	for level := 0; level < maxTreeLevels; level++ {
		path := filepath.Join(dir, treeName(level))
		flags := os.O_RDWR
		if level == 0 {
			flags |= os.O_CREATE
		}
		f, err := os.OpenFile(path, flags, 0o644)
		if errors.Is(err, fs.ErrNotExist) {
			break
		}
		if err != nil {
			t.close()
			return nil, fmt.Errorf("open %s: %w", path, err)
		}
		info, err := f.Stat()
		if err != nil {
			f.Close()
			t.close()
			return nil, fmt.Errorf("stat %s: %w", path, err)
		}
		n := uint64(info.Size()) / tlog.HashSize
		t.f = append(t.f, f)
		t.n = append(t.n, n)
		t.cur = append(t.cur, nil)
	}
	// Levels must agree (level L has floor(n/256^L) entries): after a
	// crash between the writes of two levels, keep the records every level
	// covers; the rest is rebuilt from the segments.
	safe := t.n[0]
	for level, span := 1, uint64(tileWidth); level < maxTreeLevels && span <= safe; level, span = level+1, span*tileWidth {
		var have uint64
		if level < len(t.n) {
			have = t.n[level]
		}
		safe = min(safe, have*span+span-1)
	}
	if err := t.truncateLocked(safe); err != nil {
		t.close()
		return nil, err
	}
	return t, nil
}

func (t *tileStore) close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, f := range t.f {
		if f != nil {
			f.Close()
		}
	}
	t.f = nil
	t.err = errors.New("ledger closed")
}

// size is the number of records in the tree files.
func (t *tileStore) size() uint64 {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.n[0]
}

// truncateLocked cuts the files to n records and reloads the incomplete
// tiles. Called with mu held (or before the store is shared).
func (t *tileStore) truncateLocked(n uint64) error {
	for level := 0; level < len(t.f); level++ {
		if err := t.f[level].Truncate(int64(n) * tlog.HashSize); err != nil {
			return fmt.Errorf("truncate %s: %w", t.f[level].Name(), err)
		}
		t.n[level] = n
		k := n % tileWidth
		cur := make([]tlog.Hash, k)
		buf := make([]byte, k*tlog.HashSize)
		if _, err := t.f[level].ReadAt(buf, int64(n-k)*tlog.HashSize); err != nil && k > 0 {
			return fmt.Errorf("read %s: %w", t.f[level].Name(), err)
		}
		for i := range cur {
			copy(cur[i][:], buf[i*tlog.HashSize:])
		}
		t.cur[level] = cur
		n /= tileWidth
	}
	return nil
}

// addComputed appends record hashes and the subtree roots above them that
// the writer's frontier computed (in the order they completed), checking
// that each lands where the files end. After a mismatch the store is off
// (Open rebuilds it).
func (t *tileStore) addComputed(leaves []tlog.Hash, up []tileNode) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.err != nil {
		return t.err
	}
	err := t.appendLevel(0, leaves)
	for i := 0; err == nil && i < len(up); i++ {
		n := up[i]
		if n.level < len(t.n) && t.n[n.level] != n.index || n.level > len(t.n) {
			err = fmt.Errorf("tree hash files: subtree %d of level %d does not follow the %d stored", n.index, n.level, t.n[min(n.level, len(t.n)-1)])
			break
		}
		err = t.appendLevel(n.level, []tlog.Hash{n.hash})
	}
	if err != nil {
		t.err = err
	}
	return err
}

// appendLevel writes hashes at the end of one level's file (no cascade).
func (t *tileStore) appendLevel(level int, hashes []tlog.Hash) error {
	if len(hashes) == 0 {
		return nil
	}
	if level >= maxTreeLevels {
		return errors.New("ledger tree too large")
	}
	if level == len(t.f) {
		path := filepath.Join(t.dir, treeName(level))
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			return fmt.Errorf("create %s: %w", path, err)
		}
		t.f, t.n, t.cur = append(t.f, f), append(t.n, 0), append(t.cur, nil)
	}
	// The hashes are contiguous arrays of bytes: write them as they lie.
	buf := unsafe.Slice(&hashes[0][0], len(hashes)*tlog.HashSize)
	if _, err := t.f[level].WriteAt(buf, int64(t.n[level])*tlog.HashSize); err != nil {
		return fmt.Errorf("write %s: %w", t.f[level].Name(), err)
	}
	t.n[level] += uint64(len(hashes))
	// The incomplete-tile state is only for add (rebuilding at Open).
	t.cur[level] = nil
	return nil
}

// add appends record hashes, completing higher levels as tiles fill. It
// hashes the subtrees itself: for rebuilding from the segments at Open.
func (t *tileStore) add(leaves []tlog.Hash) error {
	if len(leaves) == 0 {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.err != nil {
		return t.err
	}
	if err := t.addLocked(0, leaves); err != nil {
		t.err = err
		return err
	}
	return nil
}

func (t *tileStore) addLocked(level int, hashes []tlog.Hash) error {
	if level >= maxTreeLevels {
		return errors.New("ledger tree too large")
	}
	if level == len(t.f) {
		path := filepath.Join(t.dir, treeName(level))
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			return fmt.Errorf("create %s: %w", path, err)
		}
		t.f, t.n, t.cur = append(t.f, f), append(t.n, 0), append(t.cur, nil)
	}
	buf := make([]byte, 0, len(hashes)*tlog.HashSize)
	var up []tlog.Hash
	for _, h := range hashes {
		buf = append(buf, h[:]...)
		t.cur[level] = append(t.cur[level], h)
		if len(t.cur[level]) == tileWidth {
			up = append(up, subtreeRoot(t.cur[level]))
			t.cur[level] = t.cur[level][:0]
		}
	}
	if _, err := t.f[level].WriteAt(buf, int64(t.n[level])*tlog.HashSize); err != nil {
		return fmt.Errorf("write %s: %w", t.f[level].Name(), err)
	}
	t.n[level] += uint64(len(hashes))
	if len(up) > 0 {
		return t.addLocked(level+1, up)
	}
	return nil
}

// subtreeRoot is the root of a perfect subtree given its leaves (a power
// of two of them).
func subtreeRoot(h []tlog.Hash) tlog.Hash {
	level := append([]tlog.Hash(nil), h...)
	for len(level) > 1 {
		for i := 0; i < len(level)/2; i++ {
			level[i] = tlog.NodeHash(level[2*i], level[2*i+1])
		}
		level = level[:len(level)/2]
	}
	return level[0]
}

// sync makes the files durable.
func (t *tileStore) sync() error {
	t.mu.RLock()
	defer t.mu.RUnlock()
	for _, f := range t.f {
		if err := f.Sync(); err != nil {
			return fmt.Errorf("sync %s: %w", f.Name(), err)
		}
	}
	return nil
}

// ReadTiles implements tlog.TileReader over the files; tlog.TileHashReader
// checks what it returns against a signed root.
func (t *tileStore) ReadTiles(tiles []tlog.Tile) ([][]byte, error) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return readTiles(tiles, func(level int) (io.ReaderAt, uint64) {
		if level >= len(t.f) {
			return nil, 0
		}
		return t.f[level], t.n[level]
	})
}

func (t *tileStore) Height() int                     { return TileHeight }
func (t *tileStore) SaveTiles([]tlog.Tile, [][]byte) {}

func readTiles(tiles []tlog.Tile, level func(int) (io.ReaderAt, uint64)) ([][]byte, error) {
	out := make([][]byte, len(tiles))
	for i, tile := range tiles {
		data, err := readTile(tile, level)
		if err != nil {
			return nil, err
		}
		out[i] = data
	}
	return out, nil
}

func readTile(tile tlog.Tile, level func(int) (io.ReaderAt, uint64)) ([]byte, error) {
	if tile.H != TileHeight || tile.L < 0 || tile.W < 1 || tile.W > tileWidth || tile.N < 0 {
		return nil, fmt.Errorf("tile %v: not a hash tile of height %d", tile.Path(), TileHeight)
	}
	r, n := level(tile.L)
	start := uint64(tile.N) * tileWidth
	if r == nil || start+uint64(tile.W) > n {
		return nil, fmt.Errorf("tile %s: %w", tile.Path(), fs.ErrNotExist)
	}
	data := make([]byte, tile.W*tlog.HashSize)
	if _, err := r.ReadAt(data, int64(start)*tlog.HashSize); err != nil {
		return nil, fmt.Errorf("read tile %s: %w", tile.Path(), err)
	}
	return data, nil
}

// Tiles reads the tree hash files of a ledger directory (of a running
// ledger too: the files only grow between checkpoints).
type Tiles struct {
	dir string
}

// OpenTiles returns a reader of dir's tree hash files.
func OpenTiles(dir string) *Tiles { return &Tiles{dir: dir} }

// Height implements tlog.TileReader.
func (t *Tiles) Height() int { return TileHeight }

// SaveTiles implements tlog.TileReader.
func (t *Tiles) SaveTiles([]tlog.Tile, [][]byte) {}

// ReadTiles implements tlog.TileReader. Missing data is an error wrapping
// fs.ErrNotExist.
func (t *Tiles) ReadTiles(tiles []tlog.Tile) ([][]byte, error) {
	files := map[int]*os.File{}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	return readTiles(tiles, func(level int) (io.ReaderAt, uint64) {
		f, ok := files[level]
		if !ok {
			var err error
			if f, err = os.Open(filepath.Join(t.dir, treeName(level))); err != nil {
				return nil, 0
			}
			files[level] = f
		}
		info, err := f.Stat()
		if err != nil {
			return nil, 0
		}
		return f, uint64(info.Size()) / tlog.HashSize
	})
}

// ReadTile returns the data of one hash tile, for serving.
func (t *Tiles) ReadTile(tile tlog.Tile) ([]byte, error) {
	d, err := t.ReadTiles([]tlog.Tile{tile})
	if err != nil {
		return nil, err
	}
	return d[0], nil
}

// Size returns how many records the tree hash files cover.
func (t *Tiles) Size() uint64 {
	info, err := os.Stat(filepath.Join(t.dir, treeName(0)))
	if err != nil {
		return 0
	}
	return uint64(info.Size()) / tlog.HashSize
}

// hashReader returns a tlog.HashReader over r for the tree (n, root):
// every hash read is checked against the root.
func hashReader(n uint64, root tlog.Hash, r tlog.TileReader) tlog.HashReader {
	return tlog.TileHashReader(tlog.Tree{N: int64(n), Hash: root}, r)
}
