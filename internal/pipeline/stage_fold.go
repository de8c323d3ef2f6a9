package pipeline

import (
	"hash/maphash"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
)

// maxBursts bounds the open bursts; when full, all are flushed (their
// counts are delivered), so memory stays bounded whatever the attacker
// varies.
const maxBursts = 4096

// Fold is the fold stage: it folds identical alerts that follow each
// other into one record per burst with an exact count and first/last
// times: a loop of refused connects becomes two records (the first
// refusal, then the repeats), not a million, and cannot push a later
// distinct alert out of the queue. The kernel reader runs it right after
// decode, before its queue (enforce.Reader), since that queue is what a
// flood must not fill; it is not safe for concurrent use.
type Fold struct {
	quiet, maxAge time.Duration
	hash          maphash.Hash
	open          map[uint64]*burst
	lastFlush     time.Time
}

type burst struct {
	ev          audit.Event // the burst's first operation, as delivered
	seen        time.Time   // of the last operation (delivered or folded)
	n           uint64      // folded since the last record
	first, last time.Time   // of the folded ones
}

// NewFold returns a fold stage that closes a burst once no repeat came
// for quiet, or after 10*quiet at most; quiet < 0 folds nothing.
func NewFold(quiet time.Duration) *Fold {
	return &Fold{quiet: quiet, maxAge: 10 * quiet, open: map[uint64]*burst{}}
}

// Fold reports whether ev repeats an open burst and was counted there
// (the caller then does not deliver it); otherwise it opens a burst with
// ev as its first operation and the caller delivers ev.
func (b *Fold) Fold(ev *audit.Event) bool {
	if b.quiet < 0 || ev.Kind == audit.KindLoss || len(ev.Process.Args) > 0 {
		return false
	}
	h := audit.OperationHash(&b.hash, ev)
	if o := b.open[h]; o != nil {
		if !audit.SameOperation(&o.ev, ev) {
			return false // a hash collision: deliver it alone
		}
		if o.n == 0 {
			o.first = ev.Time
		}
		o.n++
		o.last, o.seen = ev.Time, ev.Time
		return true
	}
	if len(b.open) >= maxBursts {
		return false // flushed at the next check; until then, delivered alone
	}
	cp := *ev
	b.open[h] = &burst{ev: cp, seen: ev.Time}
	return false
}

// Flush delivers the record of every burst that went quiet (none for
// quiet) or has lasted maxAge, and forgets quiet ones; all, when final or
// when the table is full. It checks at most every quiet/10.
func (b *Fold) Flush(now time.Time, all bool, deliver func(*audit.Event)) {
	if len(b.open) == 0 || (!all && len(b.open) < maxBursts && now.Sub(b.lastFlush) < b.quiet/10) {
		return
	}
	b.lastFlush = now
	all = all || len(b.open) >= maxBursts
	for h, o := range b.open {
		quiet := all || now.Sub(o.seen) >= b.quiet
		if o.n > 0 && (quiet || now.Sub(o.first) >= b.maxAge) {
			rec := o.ev
			rec.Time = o.last
			rec.Repeat = &audit.RepeatDetail{Count: o.n, First: o.first, Last: o.last}
			deliver(&rec)
			o.n = 0
		}
		if quiet {
			delete(b.open, h)
		}
	}
}
