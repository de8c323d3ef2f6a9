package enforce

import (
	"testing"
	"unsafe"

	"github.com/watcherhq/watcher/internal/audit"
)

// TestBatchQueue: events reach the consumer in batches, in order; routine
// events fill the queue up to its alert reserve, counted in events, and
// are dropped (counted) beyond; an alert is handed over at once with the
// routine events before it, and is never dropped; released batches make
// room again.
func TestBatchQueue(t *testing.T) {
	r := (*Engine)(nil).NewReader(ReaderOptions{QueueSize: 8, AlertReserve: 2})
	const kind = 3
	r.Register(kind, audit.KindFileOpen, "kill", func(raw []byte, ev *audit.Event) error { return nil })
	pid := uint32(0)
	send := func(verdict uint32) {
		pid++
		h := EventHeader{Kind: kind, Tgid: pid, Pid: pid, Verdict: verdict}
		r.handle(unsafe.Slice((*byte)(unsafe.Pointer(&h)), EventHeaderSize))
	}
	for range 10 {
		send(0) // routine: 6 fit (8 minus the reserve of 2)
	}
	if len(r.out) != 0 || r.queueDrops.Load() != 4 {
		t.Fatalf("after 10 routine events: %d batches handed over, %d dropped; want 0 and 4", len(r.out), r.queueDrops.Load())
	}
	send(2) // an alert: handed over at once with the 6 before it
	send(2)
	send(2)
	send(0) // routine, the queue is full: dropped
	if len(r.out) != 3 || r.queueDrops.Load() != 5 || r.alertDrops.Load() != 0 {
		t.Fatalf("%d batches, %d routine and %d alerts dropped; want 3, 5, 0", len(r.out), r.queueDrops.Load(), r.alertDrops.Load())
	}
	var got []uint32
	for range 3 {
		b := <-r.out
		for _, ev := range b {
			got = append(got, ev.Process.PID)
		}
		r.Release(b)
	}
	want := []uint32{1, 2, 3, 4, 5, 6, 11, 12, 13}
	if len(got) != len(want) {
		t.Fatalf("delivered pids %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("delivered pids %v, want %v", got, want)
		}
	}
	if d := r.delivered.Load(); d != 9 {
		t.Fatalf("delivered %d, want 9", d)
	}
	send(0) // room again after Release
	r.handOver()
	if b := <-r.out; len(b) != 1 || b[0].Process.PID != 15 || r.queueDrops.Load() != 5 {
		t.Fatalf("after release: batch %v, %d dropped", b, r.queueDrops.Load())
	}
}
