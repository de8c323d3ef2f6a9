package ledger

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

// TestAppendWhileWriting appends from several goroutines with a small
// buffer, so buffer writes, group commits, Syncs and rotations all
// interleave; every record must be in the ledger exactly once, in a chain
// that verifies, and a Sync acknowledges everything appended before it.
func TestAppendWhileWriting(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, Options{SyncInterval: time.Millisecond, BufferBytes: 2 << 10,
		SegmentMaxBytes: 1 << 20, Compress: true})
	const writers, each = 4, 20000
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				e := testEvent(i, i%101 == 0)
				e.Message = fmt.Sprintf("w%d-%d", w, i)
				if _, _, err := l.Append(e); err != nil {
					t.Error(err)
					return
				}
				if i%997 == 0 {
					if err := l.Sync(); err != nil {
						t.Error(err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	st := l.Stats()
	if st.Durable != st.Records {
		t.Fatalf("after Sync: %d of %d records acknowledged", st.Durable, st.Records)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	requireClean(t, dir)
	seen := map[string]int{}
	for _, r := range readAll(t, dir) {
		if r.Event.Message != "" && r.Event.Message[0] == 'w' {
			seen[r.Event.Message]++
		}
	}
	for w := 0; w < writers; w++ {
		for i := 0; i < each; i++ {
			if m := fmt.Sprintf("w%d-%d", w, i); seen[m] != 1 {
				t.Fatalf("record %s is in the ledger %d times", m, seen[m])
			}
		}
	}
	if st.Segments < 2 {
		t.Fatalf("no rotation happened (%d segments): the test needs one", st.Segments)
	}
}
