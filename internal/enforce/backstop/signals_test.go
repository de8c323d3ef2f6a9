package backstop_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/testkit/poll"
	"golang.org/x/sys/unix"
)

// TestOperatorSignals: the agent stops on a termination signal only when
// its operator's count moved. A sandboxed process that makes the kernel
// signal the agent twice through a file owner (the write, then the close
// at its exit) never moves it, so neither delivery can pass for the
// operator's (the race that made fsetown-sigio-agent flaky: the first
// delivery's handler read both sandbox counts, the second then looked
// unaccounted); a file owner's signal set up outside every sandbox does
// not move it either; kill(2) from outside does, once per signal.
func TestOperatorSignals(t *testing.T) {
	f := newFixture(t, nil)
	agent := decoy(t)
	if err := f.eng.SetAgentPID(agent); err != nil {
		t.Fatal(err)
	}
	sig := unix.SIGWINCH // ignored by sleep: the decoy stays up
	count := func() (op, sb uint64) {
		t.Helper()
		var err error
		if op, err = f.bs.OperatorSignals(sig); err != nil {
			t.Fatal(err)
		}
		if sb, err = f.bs.AgentSignals(sig); err != nil {
			t.Fatal(err)
		}
		return op, sb
	}
	op0, sb0 := count()
	r := f.run(t, f.sandbox, "sigio", strconv.Itoa(agent), strconv.Itoa(int(sig)))
	// The sender is killed at the first delivery; its exit's close sends
	// the second. Both are the sandbox's.
	poll.Within(5*time.Second, func() bool { _, sb := count(); return sb >= sb0+2 })
	op1, sb1 := count()
	if sb1 < sb0+1 {
		t.Fatalf("sandbox SIGIO to the agent not counted (%d -> %d; helper %v: %s)", sb0, sb1, r.err, r.out)
	}
	if op1 != op0 {
		t.Errorf("sandbox SIGIO counted as the operator's: %d -> %d", op0, op1)
	}
	t.Logf("sandbox deliveries counted: %d", sb1-sb0)

	// A file owner's signal from outside every sandbox: the kernel's, not
	// the operator's.
	r = f.run(t, "", "sigio", strconv.Itoa(agent), strconv.Itoa(int(sig)))
	if r.err != nil {
		t.Fatalf("sigio outside: %v: %s", r.err, r.out)
	}
	if op2, _ := count(); op2 != op0 {
		t.Errorf("file owner's signal from outside counted as the operator's: %d -> %d", op0, op2)
	}

	// The operator: kill(2) from outside.
	if err := unix.Kill(agent, sig); err != nil {
		t.Fatal(err)
	}
	if op3, _ := count(); op3 != op0+1 {
		t.Errorf("kill from outside: operator count %d -> %d, want +1", op0, op3)
	}
}
