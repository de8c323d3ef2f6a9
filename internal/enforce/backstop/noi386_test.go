package backstop

import (
	"testing"

	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/rules/backstoprules"
)

// TestNoI386Table: a sandbox's rules on a kernel without 32-bit system
// calls write no entry keyed by i386 number, and the x86_64 entries stay;
// with them (NoI386 false, compat allowed) the same rules are keyed by
// both numbers.
func TestNoI386Table(t *testing.T) {
	kill := backstoprules.Rule{Action: enforce.ActionKill, ID: 7}
	rules := backstoprules.SandboxRules{Syscalls: []backstoprules.SyscallRule{{Name: "mount", Rule: kill}, {Name: "umount2", Rule: kill}}, IOUring: kill}
	count := func(r backstoprules.SandboxRules) (native, i386 int) {
		tab, err := sandboxTableOf(r)
		if err != nil {
			t.Fatal(err)
		}
		for what := range tab {
			switch what &^ 0xffff {
			case sbrSyscall:
				native++
			case sbrSyscall32:
				i386++
			}
		}
		return native, i386
	}
	if n, i := count(rules); n != 2 || i != 4 { // mount, umount2, umount, io_uring_setup by i386 number
		t.Errorf("32-bit on: %d x86_64 and %d i386 entries, want 2 and 4", n, i)
	}
	rules.NoI386 = true
	if n, i := count(rules); n != 2 || i != 0 {
		t.Errorf("32-bit off: %d x86_64 and %d i386 entries, want 2 and 0", n, i)
	}
}
