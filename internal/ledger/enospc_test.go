package ledger

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

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

func TestENOSPC(t *testing.T) {
	mnt := mountTmpfs(t, "256k")
	dir := filepath.Join(mnt, "ledger")
	l := openT(t, dir, Options{SyncInterval: time.Millisecond, BufferBytes: 8 << 10})
	acked := uint64(0)
	var failedAt int
	for i := 0; ; i++ {
		_, _, err := l.Append(testEvent(i, i%10 == 0))
		if err != nil {
			if !errors.Is(err, ErrNotWritten) || !strings.Contains(err.Error(), "no space left") {
				t.Fatalf("append %d: %v", i, err)
			}
			failedAt = i
			break
		}
		if i%50 == 0 {
			if err := l.Sync(); err == nil {
				acked = l.Durable()
			}
		}
		if i > 100000 {
			t.Fatal("tmpfs never filled")
		}
	}
	// Keep going while the disk is full: nothing blocks, everything counts.
	const more = 500
	for i := 0; i < more; i++ {
		if err := l.Notify(testEvent(failedAt+1+i, i%10 == 0)); err != nil {
			t.Fatalf("Notify must not fail on ENOSPC: %v", err)
		}
	}
	st := l.Stats()
	// A loss record may already have squeezed into the last free bytes
	// (PendingLoss then restarts), so Unwritten is the total to check.
	if !st.Degraded || st.WriteFailures == 0 || st.Unwritten < more || st.PendingLoss == 0 || st.UnwrittenAlerts == 0 {
		t.Fatalf("stats while full: %+v", st)
	}
	t.Logf("full after %d events: %d acknowledged, %d unwritten (%d alerts)", failedAt, acked, st.Unwritten, st.UnwrittenAlerts)

	// Space returns.
	if err := unix.Mount("tmpfs", mnt, "tmpfs", unix.MS_REMOUNT, "size=8m"); err != nil {
		t.Fatalf("grow tmpfs: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for l.Stats().Degraded {
		if time.Now().After(deadline) {
			t.Fatalf("did not recover: %+v", l.Stats())
		}
		time.Sleep(5 * time.Millisecond)
	}
	for i := 0; i < 100; i++ {
		if _, _, err := l.Append(testEvent(100000+i, false)); err != nil {
			t.Fatal(err)
		}
	}
	final := l.Stats()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	rep := requireClean(t, dir)
	if rep.LossRecords == 0 || rep.Lost != final.Unwritten || final.PendingLoss != 0 {
		t.Fatalf("loss records %d say %d lost, want %d", rep.LossRecords, rep.Lost, final.Unwritten)
	}
	// Everything acknowledged before the disk filled is still there, and
	// every event is either in the ledger or counted as lost.
	recs := readAll(t, dir)
	events := 0
	for _, r := range recs {
		if r.Event.Mechanism != "ledger" {
			events++
		}
	}
	if uint64(len(recs)) < acked {
		t.Fatalf("%d records, %d had been acknowledged", len(recs), acked)
	}
	offered := failedAt + 1 + more + 100
	if uint64(events)+final.Unwritten != uint64(offered) {
		t.Fatalf("%d events written + %d unwritten != %d offered", events, final.Unwritten, offered)
	}
	// Nothing is left behind on the mount.
	if _, err := os.Stat(filepath.Join(dir, "LOCK")); err != nil {
		t.Fatal(err)
	}
}
