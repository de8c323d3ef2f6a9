package ia32

import (
	"errors"
	"os"
	"runtime"
	"runtime/debug"
	"sync"
)

// ErrUnavailable is what Available returns on a kernel that runs 64-bit
// user code only (IA-32 emulation built out or switched off at boot).
var ErrUnavailable = errors.New("32-bit system calls: not available on this kernel (int 0x80 faults)")

var probe struct {
	once sync.Once
	err  error
}

// Available reports whether this kernel runs i386 system calls made with
// int 0x80: nil when it does, ErrUnavailable (or the reason the probe
// could not tell) when not. It makes one getpid through int 0x80 on a
// locked thread, once per process; a kernel without IA-32 emulation
// answers with a general protection fault (SIGSEGV, si_code SI_KERNEL),
// which the Go runtime turns into a panic the probe recovers. The kernel
// version and its config say nothing reliable: the emulation can be
// compiled in and switched off at boot (ia32_emulation=, or overridden by
// the hypervisor).
func Available() error {
	probe.once.Do(func() { probe.err = probeInt80() })
	return probe.err
}

func probeInt80() (err error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if recover() != nil {
			err = ErrUnavailable
		}
	}()
	const i386Getpid = 20
	switch r := Syscall(i386Getpid, 0, 0, 0); {
	case int(r) == os.Getpid():
		return nil
	case r < 0:
		// A seccomp filter or LSM refusing the i386 table is a policy of
		// the caller's, not of the kernel: say what came back.
		return errors.Join(ErrUnavailable, errnoError(-r))
	default:
		return errors.Join(ErrUnavailable, errors.New("int 0x80 getpid returned another process's id"))
	}
}
