package recorder

import (
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/audit"
)

// TestOpenDenialSource: an EACCES seen at sys_exit may be file modes'
// (the task lacked CAP_DAC_OVERRIDE) and says so; one seen leaving a
// security_* hook (fexit) is an LSM's and does not.
func TestOpenDenialSource(t *testing.T) {
	const caveat = "file permissions may have refused it"
	for _, tc := range []struct {
		name   string
		flags  recorderDenyFlag
		caveat bool
	}{
		{"sys_exit", 0, true},
		{"sys_exit with CAP_DAC_OVERRIDE", recorderDenyFlagDENY_F_DAC_OVERRIDE, false},
		{"fexit on security_file_open", recorderDenyFlagDENY_F_LSM_HOOK, false},
	} {
		e := SyscallEvent{Nr: unix.SYS_OPENAT, Ret: -int64(unix.EACCES), Denial: uint32(recorderDenialDENIAL_OPEN), Flags: uint32(tc.flags)}
		e.Args[0] = uint64(0xffffff9c) // AT_FDCWD as the kernel passes it
		for i, c := range "/etc/shadow" {
			e.Path[i] = int8(c)
		}
		var ev audit.Event
		decodeOpenDenial(&e, &ev)
		if ev.Mechanism != MechanismLandlock || ev.File == nil || ev.File.Path != "/etc/shadow" || ev.Syscall.Name != "openat" {
			t.Errorf("%s: %+v", tc.name, ev)
		}
		if got := strings.Contains(ev.Message, caveat); got != tc.caveat {
			t.Errorf("%s: message %q: file-mode caveat %v, want %v", tc.name, ev.Message, got, tc.caveat)
		}
	}
}
