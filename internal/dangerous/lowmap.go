package dangerous

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Mappings below vm.mmap_min_addr (page 0, where a kernel NULL
// dereference lands) need CAP_SYS_RAWIO, and the kernel's cap_mmap_addr
// asks cap_capable() directly, not through the capable hook: a sandbox
// whose policy blocks CAP_SYS_RAWIO is judged there by the mmap_addr hook
// (security_mmap_addr, every route and both tables, execve's ELF segments
// included), and watcher exec's seccomp filter refuses the syscalls below
// with an address under the minimum (its arch guard refuses the i386
// table whole: mmap2, old_mmap, mremap, shmat, ipc).

// FixedMapping is a syscall that places a mapping at an address the
// caller chooses.
type FixedMapping struct {
	// Name is the x86_64 syscall.
	Name string
	// AddrArg is the argument holding the address.
	AddrArg uint32
	// FlagsArg and Flags: the address is used only when one of Flags is
	// set in argument FlagsArg; Flags 0: whenever the address is not 0
	// (shmat).
	FlagsArg uint32
	Flags    uint64
}

// FixedMappings lists them: mmap with MAP_FIXED or MAP_FIXED_NOREPLACE
// (without, an address below the minimum is only a hint the kernel moves
// above it), mremap with MREMAP_FIXED, shmat at a non-null address.
var FixedMappings = []FixedMapping{
	{Name: "mmap", AddrArg: 0, FlagsArg: 3, Flags: unix.MAP_FIXED | unix.MAP_FIXED_NOREPLACE},
	{Name: "mremap", AddrArg: 4, FlagsArg: 3, Flags: unix.MREMAP_FIXED},
	{Name: "shmat", AddrArg: 1},
}

// MmapMinAddrFile is the sysctl the kernel compares a mapping's address
// with before it asks for CAP_SYS_RAWIO (dac_mmap_min_addr).
const MmapMinAddrFile = "/proc/sys/vm/mmap_min_addr"

// MmapMinAddr returns vm.mmap_min_addr (0: the kernel checks nothing).
func MmapMinAddr() (uint64, error) {
	b, err := os.ReadFile(MmapMinAddrFile)
	if err != nil {
		return 0, fmt.Errorf("read mmap_min_addr: %w", err)
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse %s: %w", MmapMinAddrFile, err)
	}
	return v, nil
}
