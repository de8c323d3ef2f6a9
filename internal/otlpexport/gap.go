package otlpexport

import (
	"github.com/watcherhq/watcher/internal/ledger"
	"golang.org/x/mod/sumdb/tlog"
)

var reasons = [...]string{ReasonFiltered, ReasonThrottled, ReasonDropped, ReasonBefore}

func reasonIndex(r string) int {
	for i, x := range reasons {
		if x == r {
			return i
		}
	}
	panic("otlpexport: unknown gap reason " + r)
}

// gap stands for the ledger records [from, to) an exporter left out: how
// many for each reason, and the perfect Merkle subtrees that cover them
// (O(log n) hashes however long the gap), so a verifier can still compute
// the tree root of a checkpoint from what it received.
type gap struct {
	from, to uint64
	nodes    []ledger.Subtree
	count    [len(reasons)]uint64
	sealed   bool // being sent or sent: the next skipped record opens a new gap
}

// add appends the record seq (== g.to) with leaf hash leaf, merging
// sibling subtrees as they complete.
func (g *gap) add(seq uint64, leaf tlog.Hash, reason string) {
	g.count[reasonIndex(reason)]++
	g.to = seq + 1
	g.nodes = append(g.nodes, ledger.Subtree{Level: 0, Index: seq, Hash: leaf})
	for n := len(g.nodes); n >= 2; n = len(g.nodes) {
		a, b := g.nodes[n-2], g.nodes[n-1]
		if a.Level != b.Level || a.Index%2 != 0 || b.Index != a.Index+1 {
			break
		}
		g.nodes[n-2] = ledger.Subtree{Level: a.Level + 1, Index: a.Index / 2, Hash: tlog.NodeHash(a.Hash, b.Hash)}
		g.nodes = g.nodes[:n-1]
	}
}
