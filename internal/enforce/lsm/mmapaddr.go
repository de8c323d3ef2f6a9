package lsm

// The mmap_addr hook's minimum (decide_mmap_addr in bpf/include/lsm_task.h): mappings
// below vm.mmap_min_addr are judged as uses of CAP_SYS_RAWIO, which the
// kernel checks there without asking the capable hook.

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"

	"github.com/watcherhq/watcher/internal/dangerous"
)

const (
	// mmapAddrMode tags a capability event's mode as a mapping below the
	// minimum (MMAP_ADDR_MODE); the low bits are the page number.
	mmapAddrMode    = 0x40000000
	mmapAddrPageMax = 0x3fffffff
)

// writeMmapMinAddr copies vm.mmap_min_addr into lsm_mmap_min_addr. The
// agent calls it at Load and at every SetRules (policy apply), so a
// change of the sysctl by the host's root takes effect at the next apply:
// until then a lowered minimum is judged at its old value (stricter than
// the kernel, which no longer asks for the capability), a raised one
// leaves the addresses between the two unjudged. Inside a sandbox whose
// rules block CAP_SYS_RAWIO the sysctl cannot be written at all (its
// handler asks capable(CAP_SYS_RAWIO), which the capable hook judges).
func writeMmapMinAddr(coll *ebpf.Collection) error {
	m := coll.Maps["lsm_mmap_min_addr"]
	if m == nil {
		return errors.New("lsm_mmap_min_addr map missing")
	}
	v, err := dangerous.MmapMinAddr()
	if err != nil {
		return err
	}
	if err := m.Put(uint32(0), v); err != nil {
		return fmt.Errorf("write lsm_mmap_min_addr: %w", err)
	}
	return nil
}

// mmapAddrMessage describes a capability event of the mmap_addr hook.
func mmapAddrMessage(mode uint32) string {
	page := uint64(mode &^ mmapAddrMode)
	at := fmt.Sprintf("at %#x", page<<12)
	if page == mmapAddrPageMax {
		at = fmt.Sprintf("at or above %#x", page<<12)
	}
	return "CAP_SYS_RAWIO: mapping " + at + " below vm.mmap_min_addr"
}
