package backstop_test

import (
	"testing"

	"github.com/cilium/ebpf/asm"

	"github.com/watcherhq/watcher/internal/enforce/backstop"
	"github.com/watcherhq/watcher/internal/enforce/enforcetest"
)

// maxFastPath bounds the programs every syscall of the host enters: the
// instructions (as the kernel runs them, after inlining) before the
// subprogram that judges. The unruled syscall of any task runs a part of
// them; the floor (an empty tp_btf pair) runs 2. A failure here means
// judging code moved back into the path every task pays.
const maxFastPath = 128 // 54 and 102 slots at this commit (sys_exit: an open's outside check too)

func TestSyscallFastPathSize(t *testing.T) {
	eng := enforcetest.Engine(t)
	bs, err := backstop.Load(eng)
	if err != nil {
		t.Fatal(err)
	}
	defer bs.Close()
	for _, name := range []string{backstop.ProgSysEnter, backstop.ProgSysExit} {
		info, err := bs.Program(name).Info()
		if err != nil {
			t.Fatal(err)
		}
		insns, err := info.Instructions()
		if err != nil {
			t.Skipf("xlated instructions of %s: %v", name, err)
		}
		// The main function ends where the first subprogram begins
		// (offsets in instruction slots: a 64-bit load takes two).
		total := 0
		for _, ins := range insns {
			total += int(ins.Size() / asm.InstructionSize)
		}
		main, off := total, 0
		for _, ins := range insns {
			if ins.IsFunctionCall() && ins.Src == asm.PseudoCall {
				// The kernel's copy of a JITed program keeps the
				// call's relative target in the offset field.
				if target := off + 1 + int(ins.Offset); target < main {
					main = target
				}
			}
			off += int(ins.Size() / asm.InstructionSize)
		}
		t.Logf("%s: %d of %d instruction slots before the judging subprogram", name, main, total)
		if main == total {
			t.Errorf("%s: no subprogram: the whole judging runs in the program every syscall enters", name)
		}
		if main > maxFastPath {
			t.Errorf("%s: %d instruction slots before the judging subprogram, at most %d", name, main, maxFastPath)
		}
	}
}
