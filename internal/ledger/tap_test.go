package ledger

import (
	"testing"

	"golang.org/x/mod/sumdb/tlog"
)

// nodeReader serves tlog.TreeHash from perfect subtrees and leaves,
// combining children where a node itself is not given.
type nodeReader map[[2]int64]tlog.Hash

func (m nodeReader) hash(level int, index int64) (tlog.Hash, bool) {
	if h, ok := m[[2]int64{int64(level), index}]; ok {
		return h, true
	}
	if level == 0 {
		return tlog.Hash{}, false
	}
	l, ok1 := m.hash(level-1, 2*index)
	r, ok2 := m.hash(level-1, 2*index+1)
	return tlog.NodeHash(l, r), ok1 && ok2
}

func (m nodeReader) ReadHashes(idx []int64) ([]tlog.Hash, error) {
	out := make([]tlog.Hash, len(idx))
	for i, x := range idx {
		level, n := tlog.SplitStoredHashIndex(x)
		h, ok := m.hash(level, n)
		if !ok {
			return nil, errNoHash
		}
		out[i] = h
	}
	return out, nil
}

var errNoHash = errFrame("hash not available")

// TestTap: a tap sees every record from its start, in order, with the
// leaf hash the chain uses; the prefix subtrees it is given and those
// leaves make the root a checkpoint signs.
func TestTap(t *testing.T) {
	l := openT(t, t.TempDir(), Options{})
	defer l.Close()
	for i := range 13 {
		l.Append(testEvent(i, i%4 == 0))
	}
	var seqs []uint64
	nodes := nodeReader{}
	start, prefix := l.Tap(func(tp Tapped) {
		seqs = append(seqs, tp.Seq)
		if h := newLeafHasher().hash(tp.Line[:len(tp.Line)-suffixLen]); h != tp.Leaf {
			t.Errorf("record %d: leaf %x is not the hash of its line", tp.Seq, tp.Leaf)
		}
		nodes[[2]int64{0, int64(tp.Seq)}] = tp.Leaf
	})
	if start != 14 { // the genesis record and 13
		t.Fatalf("tap starts at %d, want 14", start)
	}
	covered := uint64(0)
	for _, p := range prefix {
		if p.Index<<p.Level != covered {
			t.Fatalf("prefix subtree %d/%d does not start at %d", p.Level, p.Index, covered)
		}
		covered += 1 << p.Level
		nodes[[2]int64{int64(p.Level), int64(p.Index)}] = p.Hash
	}
	if covered != start {
		t.Fatalf("prefix covers %d records, want %d", covered, start)
	}
	for i := 13; i < 40; i++ {
		l.Append(testEvent(i, false))
	}
	c, err := l.Checkpoint()
	if err != nil {
		t.Fatal(err)
	}
	if len(seqs) != int(c.Size-start) || seqs[0] != start || seqs[len(seqs)-1] != c.Size-1 {
		t.Fatalf("tap saw %d records %v, want %d..%d", len(seqs), seqs, start, c.Size-1)
	}
	root, err := tlog.TreeHash(int64(c.Size), nodes)
	if err != nil || root != c.Root {
		t.Fatalf("root from the prefix and tapped leaves %x (%v), checkpoint %x", root, err, c.Root)
	}
	l.Tap(nil)
	l.Append(testEvent(99, false))
	if n := len(seqs); seqs[n-1] != c.Size-1 {
		t.Fatalf("removed tap still called: %v", seqs[n-1])
	}
}
