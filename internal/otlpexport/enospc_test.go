package otlpexport

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/ledger"
	"github.com/watcherhq/watcher/internal/otlpexport/otelcoltest"
	"golang.org/x/sys/unix"
)

// TestLedgerFullDisk: the ledger's disk fills while records are exported;
// the ledger cuts its unwritten tail back and reuses those sequence
// numbers once space returns. Only durable records are sent, so none of
// the cut records reached the Collector and the copy still verifies, with
// the ledger's loss record in it.
func TestLedgerFullDisk(t *testing.T) {
	mnt := t.TempDir()
	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=256k,mode=0700"); err != nil {
		if errors.Is(err, syscall.EPERM) {
			t.Skipf("cannot mount tmpfs (needs CAP_SYS_ADMIN): %v", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
	col := otelcoltest.Start(t)
	led, err := ledger.Open(filepath.Join(mnt, "ledger"), ledger.Options{SyncInterval: 5 * time.Millisecond,
		BufferBytes: 8 << 10, SummaryInterval: time.Hour, CheckpointInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer led.Close()
	exp, err := New(Config{Name: "full", Endpoint: col.GRPC, Insecure: true, BatchInterval: 10 * time.Millisecond},
		led, func(ev audit.Event) { led.Append(ev) })
	if err != nil {
		t.Fatal(err)
	}
	exp.Begin(led.Tap(exp.Tap))
	i := 0
	for ; i < 50; i++ {
		led.Append(event(i, "sb", audit.KindExec))
	}
	waitFor(t, "the first records sent", func() bool { return exp.Stats().Sent >= 50 })
	// Fill the disk, then append until the ledger fails a write.
	f, err := os.Create(filepath.Join(mnt, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	for chunk := make([]byte, 4096); len(chunk) > 0; {
		if _, err := f.Write(chunk); err != nil {
			chunk = chunk[:len(chunk)/2]
		}
	}
	f.Close()
	for ; !led.Stats().Degraded; i++ {
		led.Append(event(i, "sb", audit.KindExec))
		if i > 100000 {
			t.Fatal("the ledger never ran out of space")
		}
	}
	cut := led.Stats().Unwritten
	os.Remove(filepath.Join(mnt, "filler"))
	waitFor(t, "the ledger recovered", func() bool { return !led.Stats().Degraded })
	for end := i + 20; i < end; i++ {
		led.Append(event(i, "sb", audit.KindExec))
	}
	if _, err := led.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	exp.Close(10 * time.Second)
	col.Stop()
	rep := verifyFile(t, col.Out)
	if !rep.OK() || rep.Proven != rep.Records || rep.Duplicates != 0 {
		t.Fatalf("verify after %d records were cut: %+v", cut, rep)
	}
	var ledgerLoss uint64
	for stage, n := range rep.Losses {
		if stage != "export:full:buffer" {
			ledgerLoss += n
		}
	}
	if cut == 0 || ledgerLoss < cut {
		t.Fatalf("%d records cut, the export holds loss records for %d (%v)", cut, ledgerLoss, rep.Losses)
	}
	t.Logf("%d records cut back and reported lost by the ledger; %d records proven", cut, rep.Proven)
}
