package ia32

import (
	"errors"
	"os"
	"testing"
)

// TestAvailableAgreesWithSyscall: where the probe says yes, an int 0x80
// getpid returns this process's id; where it says no, the error names
// why, and asking again gives the same answer without faulting.
func TestAvailableAgreesWithSyscall(t *testing.T) {
	err := Available()
	if err != nil {
		if !errors.Is(err, ErrUnavailable) {
			t.Fatalf("Available() = %v, want ErrUnavailable", err)
		}
		if again := Available(); again != err {
			t.Fatalf("second Available() = %v, want the cached %v", again, err)
		}
		if e := probeInt80(); !errors.Is(e, ErrUnavailable) {
			t.Fatalf("second probe = %v, want ErrUnavailable", e)
		}
		t.Logf("this kernel: %v", err)
		return
	}
	if got := Syscall(20, 0, 0, 0); int(got) != os.Getpid() {
		t.Fatalf("int 0x80 getpid = %d, want %d", got, os.Getpid())
	}
}
