package backstop

// Mappings below vm.mmap_min_addr (bpf/include/backstop_lowmap.h): the
// backstop compares the addresses the kernel mapped with the sysctl's
// value, which the agent copies into bs_lowmap_min.

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/watcherhq/watcher/internal/dangerous"
)

// ProgExecLowmap probes a new image's mappings after every exec.
const ProgExecLowmap = "backstop_exec_lowmap"

// LowmapMaxPages is how far the exec and i386 probes look, in pages
// (LOWMAP_MAX_PAGES): a larger vm.mmap_min_addr is probed in its first
// MiB only (x86_64 mmap, mremap and shmat results are compared with all
// of it).
const LowmapMaxPages = 256

// writeMmapMinAddr copies vm.mmap_min_addr into bs_lowmap_min, at Load
// and at every SetRules (policy apply): a change of the sysctl by the
// host's root takes effect at the next apply. Until then a lowered
// minimum is judged at its old value (stricter than the kernel), a raised
// one leaves the addresses between the two unjudged. Inside a sandbox
// blocking CAP_SYS_RAWIO the sysctl cannot be written (its handler asks
// capable(CAP_SYS_RAWIO), and sysctl writes have rules of their own).
func (b *Backstop) writeMmapMinAddr() error {
	m := b.maps("bs_lowmap_min")
	if m == nil {
		return errors.New("backstop: bs_lowmap_min map missing")
	}
	v, err := dangerous.MmapMinAddr()
	if err != nil {
		return fmt.Errorf("backstop: %w", err)
	}
	if err := m.Put(uint32(0), v); err != nil {
		return fmt.Errorf("backstop: write bs_lowmap_min: %w", err)
	}
	return nil
}

// MmapMinAddr returns the minimum the backstop judges mappings against
// (bs_lowmap_min).
func (b *Backstop) MmapMinAddr() (uint64, error) {
	var v uint64
	if err := b.maps("bs_lowmap_min").Lookup(uint32(0), &v); err != nil {
		return 0, fmt.Errorf("backstop: read bs_lowmap_min: %w", err)
	}
	return v, nil
}

const mmapPageZero = 0x0100000 // MMAP_PAGE_ZERO personality

// lowMappingNote describes a low-mapping event: args are {address,
// personality, minimum} (lowmap_report).
func lowMappingNote(b []byte, e *SyscallEvent) []byte {
	b = note(b, "CAP_SYS_RAWIO: mapping at 0x")
	b = strconv.AppendUint(b, e.Args[0], 16)
	b = append(b, " below vm.mmap_min_addr (0x"...)
	b = strconv.AppendUint(b, e.Args[2], 16)
	b = append(b, ')')
	if e.Args[1]&mmapPageZero != 0 {
		b = note(b, "personality=MMAP_PAGE_ZERO")
	}
	return b
}
