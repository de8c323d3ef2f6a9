package pipeline

import (
	"fmt"
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
)

// TestBurstFold: identical refusals fold into one record with the exact
// count and first/last times; a different operation (other port, other
// process, other verdict) is delivered at once; the table stays bounded
// when every refusal differs.
func TestBurstFold(t *testing.T) {
	b := NewFold(time.Second)
	t0 := time.Unix(1000, 0)
	refused := func(port uint16, tgid uint32, at time.Duration) *audit.Event {
		return &audit.Event{Time: t0.Add(at), Kind: audit.KindNet, Verdict: audit.VerdictDenied, Severity: audit.SeverityAlert,
			Process: audit.Process{TGID: tgid, PID: tgid + uint32(at%3), Comm: "flood"},
			Net:     &audit.NetDetail{Op: "connect", Addr: "127.0.0.1", Port: port}}
	}
	var delivered []audit.Event
	deliver := func(e *audit.Event) { delivered = append(delivered, *e) }
	const n = 100000
	for i := range n {
		ev := refused(80, 7, time.Duration(i)*time.Microsecond)
		if !b.Fold(ev) {
			deliver(ev)
		}
	}
	// Distinct operations are never folded into it.
	for _, ev := range []*audit.Event{refused(81, 7, time.Second), refused(80, 8, time.Second)} {
		if b.Fold(ev) {
			t.Fatalf("distinct operation %+v folded", ev.Net)
		}
		deliver(ev)
	}
	b.Flush(t0.Add(500*time.Millisecond), false, deliver) // not quiet yet
	if len(delivered) != 3 {
		t.Fatalf("%d records before the burst went quiet, want 3 (first, two distinct)", len(delivered))
	}
	b.Flush(t0.Add(3*time.Second), false, deliver)
	var total uint64
	for _, e := range delivered {
		if e.Net.Port == 80 && e.Process.TGID == 7 {
			total += e.Count()
		}
	}
	if total != n || len(delivered) != 4 {
		t.Fatalf("%d records counting %d refusals, want 4 records and %d", len(delivered), total, n)
	}
	r := delivered[3].Repeat
	if r == nil || r.Count != n-1 || !r.First.Equal(t0.Add(time.Microsecond)) || !r.Last.Equal(t0.Add((n-1)*time.Microsecond)) {
		t.Fatalf("burst record %+v", r)
	}
	if len(b.open) != 0 {
		t.Fatalf("%d bursts still open after they went quiet", len(b.open))
	}

	// A long burst gets a record per maxAge, counts still exact.
	delivered = nil
	for i := range 30 {
		at := time.Duration(i) * time.Second
		if ev := refused(80, 9, at); !b.Fold(ev) {
			deliver(ev)
		}
		b.Flush(t0.Add(at), false, deliver)
	}
	b.Flush(t0.Add(time.Hour), true, deliver)
	total = 0
	for _, e := range delivered {
		total += e.Count()
	}
	if total != 30 || len(delivered) < 3 || len(delivered) > 5 {
		t.Fatalf("30 refusals over 30s in %d records counting %d", len(delivered), total)
	}

	// Every refusal different: the table never exceeds maxBursts.
	for i := range 3 * maxBursts {
		ev := refused(uint16(i), uint32(i), 0)
		ev.Net.Addr = fmt.Sprint(i)
		b.Fold(ev)
		b.Flush(t0, false, deliver)
		if len(b.open) > maxBursts {
			t.Fatalf("%d open bursts", len(b.open))
		}
	}
}
