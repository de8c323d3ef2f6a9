package ledger

import (
	"golang.org/x/mod/sumdb/tlog"
)

// frontier is the compact state of an RFC 6962 Merkle tree over n leaves:
// the roots of the perfect subtrees that make up [0, n), largest first (one
// per set bit of n). It lets the writer and the verifier compute the tree
// root at any size in O(log n) memory, the same value tlog.TreeHash gives.
type frontier struct {
	n uint64
	h []tlog.Hash
}

// add appends a leaf hash. When onNode is set it is called with every
// complete subtree formed: (level, index) as in tlog.StoredHashIndex.
func (f *frontier) add(leaf tlog.Hash, onNode func(level int, index int64, h tlog.Hash)) {
	if onNode != nil {
		onNode(0, int64(f.n), leaf)
	}
	f.h = append(f.h, leaf)
	level := 0
	for m := f.n; m&1 == 1; m >>= 1 {
		k := len(f.h)
		f.h[k-2] = tlog.NodeHash(f.h[k-2], f.h[k-1])
		f.h = f.h[:k-1]
		level++
		if onNode != nil {
			onNode(level, int64(f.n>>level), f.h[k-2])
		}
	}
	f.n++
}

// root returns the tree hash of the n leaves added so far.
func (f *frontier) root() tlog.Hash {
	if len(f.h) == 0 {
		return tlog.Hash{}
	}
	r := f.h[len(f.h)-1]
	for i := len(f.h) - 2; i >= 0; i-- {
		r = tlog.NodeHash(f.h[i], r)
	}
	return r
}

// clone copies f into dst, reusing dst's storage.
func (f *frontier) cloneInto(dst *frontier) {
	dst.n = f.n
	dst.h = append(dst.h[:0], f.h...)
}

// popcount-sized frontier must have exactly one hash per set bit of n.
func validFrontier(n uint64, h []tlog.Hash) bool {
	bits := 0
	for m := n; m != 0; m &= m - 1 {
		bits++
	}
	return bits == len(h)
}
