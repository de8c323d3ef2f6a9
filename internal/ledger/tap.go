package ledger

import (
	"github.com/watcherhq/watcher/internal/audit"
	"golang.org/x/mod/sumdb/tlog"
)

// Tapped is one record as the ledger appended it, handed to a Tap.
type Tapped struct {
	Seq  uint64
	Leaf tlog.Hash // the record's hash: chain link and Merkle leaf
	// Line is the record line as written (with its newline); valid only
	// during the call.
	Line []byte
	// Event is the event as recorded (redacted, possibly cut to fit);
	// valid only during the call.
	Event *audit.Event
}

// Subtree is a perfect subtree of the ledger's Merkle tree: the leaves
// [Index<<Level, (Index+1)<<Level), as in tlog.StoredHashIndex.
type Subtree struct {
	Level int
	Index uint64
	Hash  tlog.Hash
}

// Tap makes fn see every record appended from now on, in sequence order,
// the ledger's own records (summaries, losses, recoveries) included. After
// a failed write the ledger cuts its unwritten tail back and reuses those
// sequence numbers: fn then sees a sequence number it saw before, and
// must forget what it kept from there on. fn
// runs under the ledger's lock: it must copy what it keeps and return at
// once. Tap returns the next sequence number and the perfect subtrees
// that cover the records before it, largest first, so a copy of the
// records from start on can still be proven against the full tree.
// A nil fn removes the tap.
func (l *Ledger) Tap(fn func(Tapped)) (start uint64, prefix []Subtree) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.tap = fn
	start = l.cur.next
	// The frontier holds one subtree per set bit of start, largest first.
	off, k := uint64(0), 0
	for b := 63; b >= 0; b-- {
		if start&(1<<b) == 0 {
			continue
		}
		prefix = append(prefix, Subtree{Level: b, Index: off >> b, Hash: l.cur.fr.h[k]})
		off += 1 << b
		k++
	}
	return start, prefix
}

// Dir returns the ledger's directory.
func (l *Ledger) Dir() string { return l.dir }
