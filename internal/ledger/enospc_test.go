package ledger

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"golang.org/x/sys/unix"
)

// mountTmpfs mounts a tmpfs of size bytes on a fresh directory and
// unmounts it when the test ends.
func mountTmpfs(t *testing.T, size string) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size="+size+",mode=0700"); err != nil {
		if errors.Is(err, syscall.EPERM) {
			t.Skipf("cannot mount tmpfs (needs CAP_SYS_ADMIN): %v", err)
		}
		t.Fatalf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// fillDisk writes a file in mnt until the file system has no free block
// left, and checks that a new file cannot get one.
func fillDisk(t *testing.T, mnt string) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(mnt, "filler"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 4096)
	for len(chunk) > 0 {
		if _, err := f.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("fill %s: %v", mnt, err)
			}
			chunk = chunk[:len(chunk)/2]
		}
	}
	probe := filepath.Join(mnt, "probe")
	err = os.WriteFile(probe, []byte{1}, 0o600)
	os.Remove(probe)
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("%s not full after filling: writing a new file gave %v", mnt, err)
	}
}

// segmentSlack is how many bytes can still be appended to the active
// segment without allocating a block: the unused tail of its last block.
// Writes into it succeed on a full file system.
func segmentSlack(t *testing.T, l *Ledger) int64 {
	t.Helper()
	l.mu.Lock()
	path := filepath.Join(l.dir, l.segName)
	l.mu.Unlock()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks*512 - st.Size
}

// recordSize is the encoded size of e as the ledger's next record.
func recordSize(l *Ledger, e audit.Event) int64 {
	audit.Redact(&e)
	l.mu.Lock()
	defer l.mu.Unlock()
	rec, _ := appendRecord(nil, newLeafHasher(), l.cur.next, l.cur.prev, &e)
	return int64(len(rec))
}

// padEvent is the smallest kind of event, with a message of n bytes.
func padEvent(n int) audit.Event {
	return audit.Event{Time: time.Unix(1_700_000_000, 0).UTC(), Kind: audit.KindFileOpen,
		Verdict: audit.VerdictAllowed, Severity: audit.SeverityRoutine, Mechanism: "tracepoint",
		Message: strings.Repeat("p", n)}
}

// fillLastBlock appends and commits a record that fills the tail of the
// active segment's last block up to one byte (or completely, when the tail
// is just the size of the smallest record), so that on a full file system
// nothing the ledger writes next can fit, and the next write is cut short.
// It says whether it appended a record. Call it with no appends running
// and nothing buffered.
func fillLastBlock(t *testing.T, l *Ledger) bool {
	t.Helper()
	minRecord := recordSize(l, padEvent(1))
	slack := segmentSlack(t, l)
	if slack < minRecord {
		return false
	}
	pad := slack - 1
	if pad < minRecord {
		pad = slack
	}
	e := padEvent(int(1 + pad - minRecord))
	if n := recordSize(l, e); n != pad {
		t.Fatalf("pad record is %d bytes, want %d", n, pad)
	}
	if _, _, err := l.Append(e); err != nil {
		t.Fatal(err)
	}
	if err := l.Sync(); err != nil {
		t.Fatalf("sync of a record that fits the last block: %v", err)
	}
	left := segmentSlack(t, l)
	if left >= minRecord {
		t.Fatalf("%d bytes left in the last block after padding", left)
	}
	t.Logf("filled %d of the %d bytes left in the last block", pad, slack)
	return true
}

func TestENOSPC(t *testing.T) {
	mnt := mountTmpfs(t, "256k")
	dir := filepath.Join(mnt, "ledger")
	// Long summary and checkpoint intervals: while the disk is full, the
	// only writes are the ledger's event records and its loss-record
	// retries, so the counts below are exact.
	l := openT(t, dir, Options{SyncInterval: time.Millisecond, BufferBytes: 8 << 10,
		SummaryInterval: time.Hour, CheckpointInterval: time.Hour})
	closed := false
	t.Cleanup(func() {
		if !closed {
			l.Close()
		}
	})
	offered := 0
	for ; offered < 200; offered++ {
		if _, _, err := l.Append(testEvent(offered, offered%10 == 0)); err != nil {
			t.Fatalf("append %d: %v", offered, err)
		}
	}
	if _, err := l.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	acked := l.Durable()

	// Fill the disk. Only the tail of the segment's last block is left;
	// fill that with a record too, to one byte, so that the next write
	// is cut short by ENOSPC and nothing the ledger writes can fit
	// (every record is longer than the smallest event).
	fillDisk(t, mnt)
	if fillLastBlock(t, l) {
		offered++
	}
	full := l.Stats()
	if full.Degraded || full.PendingLoss != 0 || full.Unwritten != 0 || full.Durable != full.Records {
		t.Fatalf("stats before the first failing write: %+v", full)
	}

	// The ledger runs into ENOSPC on its own write.
	lost, lostAlerts := 0, 0
	for {
		alert := offered%10 == 0
		_, _, err := l.Append(testEvent(offered, alert))
		offered++
		lost++
		if alert {
			lostAlerts++
		}
		if err != nil {
			if !errors.Is(err, ErrNotWritten) || !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("append %d: %v", offered-1, err)
			}
			break
		}
		if lost > 10000 {
			t.Fatal("appends on a full disk never failed")
		}
	}
	// Keep going while the disk is full: nothing blocks, everything counts.
	const more = 500
	for i := 0; i < more; i++ {
		alert := i%10 == 0
		if err := l.Notify(testEvent(offered, alert)); err != nil {
			t.Fatalf("Notify must not fail on ENOSPC: %v", err)
		}
		offered++
		lost++
		if alert {
			lostAlerts++
		}
	}
	if err := l.Sync(); !errors.Is(err, ErrNotWritten) || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Sync on a full disk: %v", err)
	}
	st := l.Stats()
	// Every record since the disk filled was cut back (the segment still
	// ends where it did) and is counted, none reported yet.
	if !st.Degraded || st.WriteFailures == 0 || !strings.Contains(st.LastError, "no space left") ||
		st.Unwritten != uint64(lost) || st.UnwrittenAlerts != uint64(lostAlerts) || st.PendingLoss != st.Unwritten ||
		st.Records != full.Records || st.Durable != full.Durable || st.Bytes != full.Bytes ||
		st.Offered != full.Offered+uint64(lost) || st.Kept != full.Kept+uint64(lost) {
		t.Fatalf("stats while full (%d records, %d alerts lost since %+v): %+v", lost, lostAlerts, full, st)
	}
	t.Logf("full after %d records: %d acknowledged, %d unwritten (%d alerts)", full.Records, acked, st.Unwritten, st.UnwrittenAlerts)

	// Space returns.
	if err := unix.Mount("tmpfs", mnt, "tmpfs", unix.MS_REMOUNT, "size=8m"); err != nil {
		t.Fatalf("grow tmpfs: %v", err)
	}
	for l.Stats().Degraded {
		// The committer retries every SyncInterval; go test's timeout
		// catches a ledger that never recovers.
		time.Sleep(5 * time.Millisecond)
	}
	for i := 0; i < 100; i++ {
		if _, _, err := l.Append(testEvent(offered, false)); err != nil {
			t.Fatal(err)
		}
		offered++
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	closed = true
	final := l.Stats()
	if final.PendingLoss != 0 || final.Unwritten != uint64(lost) {
		t.Fatalf("stats after recovery: %+v", final)
	}
	rep := requireClean(t, dir)
	if rep.LossRecords != 1 || rep.Lost != uint64(lost) {
		t.Fatalf("%d loss records say %d lost, want 1 saying %d", rep.LossRecords, rep.Lost, lost)
	}
	// Everything acknowledged before the disk filled is still there, and
	// every event is either in the ledger or counted as lost.
	recs := readAll(t, dir)
	events := 0
	for _, r := range recs {
		if r.Event.Mechanism != "ledger" {
			events++
		}
		if r.Event.Kind == audit.KindLoss && (r.Event.Loss == nil || r.Event.Loss.Stage != "ledger_write" || r.Event.Loss.Count != uint64(lost)) {
			t.Errorf("loss record %d: %+v", r.Seq, r.Event.Loss)
		}
	}
	if uint64(len(recs)) < acked || recs[acked-1].Seq != acked-1 {
		t.Fatalf("%d records, %d had been acknowledged", len(recs), acked)
	}
	if uint64(events)+final.Unwritten != uint64(offered) {
		t.Fatalf("%d events written + %d unwritten != %d offered", events, final.Unwritten, offered)
	}
	// Failed checkpoint and segment writes left nothing behind.
	layout, err := scanDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(layout.temps) > 0 || len(layout.foreign) > 0 {
		t.Fatalf("left behind: %v %v", layout.temps, layout.foreign)
	}
}

// TestENOSPCClose closes a ledger while the disk is still full: Close must
// return (an agent stopping on a full disk must not hang) with an error
// saying how many records were not written, and leave a ledger that opens
// and verifies once space returns.
func TestENOSPCClose(t *testing.T) {
	mnt := mountTmpfs(t, "64k")
	dir := filepath.Join(mnt, "ledger")
	l := openT(t, dir, Options{SyncInterval: time.Millisecond, BufferBytes: 1 << 10,
		SummaryInterval: time.Hour, CheckpointInterval: time.Hour})
	for i := 0; i < 20; i++ {
		if _, _, err := l.Append(testEvent(i, i%10 == 0)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := l.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	acked := l.Durable()
	fillDisk(t, mnt)
	fillLastBlock(t, l)
	var err error
	for i := 20; err == nil; i++ {
		_, _, err = l.Append(testEvent(i, i%10 == 0))
		if i > 10000 {
			t.Fatal("appends on a full disk never failed")
		}
	}
	if !errors.Is(err, ErrNotWritten) || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("append on a full disk: %v", err)
	}
	st := l.Stats()
	err = l.Close()
	if err == nil || !errors.Is(err, syscall.ENOSPC) ||
		!strings.Contains(err.Error(), fmt.Sprintf("%d records not written", st.PendingLoss)) {
		t.Fatalf("Close on a full disk with %d records pending: %v", st.PendingLoss, err)
	}
	if _, _, err := l.Append(testEvent(0, false)); !errors.Is(err, ErrClosed) {
		t.Fatalf("append after Close: %v", err)
	}
	if err := unix.Mount("tmpfs", mnt, "tmpfs", unix.MS_REMOUNT, "size=8m"); err != nil {
		t.Fatalf("grow tmpfs: %v", err)
	}
	l = openT(t, dir, Options{})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	requireClean(t, dir)
	if n := uint64(len(readAll(t, dir))); n < acked {
		t.Fatalf("%d records after reopening, %d had been acknowledged", n, acked)
	}
}
