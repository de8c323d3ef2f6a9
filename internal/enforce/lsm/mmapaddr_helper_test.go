package lsm

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/dangerous"
	"github.com/watcherhq/watcher/internal/launch/ia32"
)

// doMmapOp places one page at address op.Num by every route that reaches
// the kernel's mmap_addr check (TestMmapBelowMinAddr), and unmaps it
// again; the benign kinds map without asking for an address.
func doMmapOp(op opSpec) (string, bool) {
	const page = 4096
	anon := uintptr(unix.MAP_PRIVATE | unix.MAP_ANONYMOUS)
	mmap := func(addr, flags uintptr) string {
		p, _, e := unix.Syscall6(unix.SYS_MMAP, addr, page, unix.PROT_READ, flags, ^uintptr(0), 0)
		if e != 0 {
			return errnoResult(e)
		}
		unix.Syscall(unix.SYS_MUNMAP, p, page, 0)
		if flags&(unix.MAP_FIXED|unix.MAP_FIXED_NOREPLACE) != 0 && p != addr {
			return "ERR: mapped at " + strconv.FormatUint(uint64(p), 16)
		}
		return "OK"
	}
	addr := uintptr(op.Num)
	switch op.Kind {
	case "mmap_fixed":
		return mmap(addr, anon|unix.MAP_FIXED), true
	case "mmap_fixed_noreplace":
		return mmap(addr, anon|unix.MAP_FIXED_NOREPLACE), true
	case "mmap_hint":
		// A hint below the minimum is moved above it: no check.
		p, _, e := unix.Syscall6(unix.SYS_MMAP, addr, page, unix.PROT_READ, anon, ^uintptr(0), 0)
		if e != 0 {
			return errnoResult(e), true
		}
		unix.Syscall(unix.SYS_MUNMAP, p, page, 0)
		if min, err := dangerous.MmapMinAddr(); err != nil || uint64(p) < min {
			return "ERR: hint placed below vm.mmap_min_addr", true
		}
		return "OK", true
	case "mremap_fixed":
		old, _, e := unix.Syscall6(unix.SYS_MMAP, 0, page, unix.PROT_READ, anon, ^uintptr(0), 0)
		if e != 0 {
			return "ERR: mmap: " + errnoResult(e), true
		}
		p, _, e := unix.Syscall6(unix.SYS_MREMAP, old, page, page, unix.MREMAP_MAYMOVE|unix.MREMAP_FIXED, addr, 0)
		if e != 0 {
			unix.Syscall(unix.SYS_MUNMAP, old, page, 0)
			return errnoResult(e), true
		}
		unix.Syscall(unix.SYS_MUNMAP, p, page, 0)
		return "OK", true
	case "shmat_at":
		id, _, e := unix.Syscall(unix.SYS_SHMGET, unix.IPC_PRIVATE, page, unix.IPC_CREAT|0o600)
		if e != 0 {
			return "ERR: shmget: " + errnoResult(e), true
		}
		defer unix.Syscall(unix.SYS_SHMCTL, id, unix.IPC_RMID, 0)
		p, _, e := unix.Syscall(unix.SYS_SHMAT, id, addr, unix.SHM_RDONLY)
		if e != 0 {
			return errnoResult(e), true
		}
		unix.Syscall(unix.SYS_SHMDT, p, 0, 0)
		return "OK", true
	case "mmap2_ia32":
		// The test asks for it only where ia32.Available; should this
		// process see otherwise, say so rather than fault.
		if err := ia32.Available(); err != nil {
			return "ERR: " + err.Error(), true
		}
		const mmap2 = 192 // i386 table
		r := ia32.Syscall6(mmap2, addr, page, unix.PROT_READ, anon|unix.MAP_FIXED, 0xffffffff, 0)
		if r < 0 && r > -4096 {
			return errnoResult(unix.Errno(-r)), true
		}
		unix.Syscall(unix.SYS_MUNMAP, uintptr(uint32(r)), page, 0)
		return "OK", true
	}
	return "", false
}

// TestPageZeroHelper is the child side of TestMmapBelowMinAddrPersonality
// (mode "pagezero"): set the MMAP_PAGE_ZERO personality (SVr4's page 0,
// which the ELF loader maps at every exec), join the cgroup in
// WATCHER_PAGEZERO_CG (none: stay) and exec WATCHER_PAGEZERO_BIN. (Not
// this binary: Go's nil checks rely on page 0 faulting.)
func TestPageZeroHelper(t *testing.T) {
	if os.Getenv("WATCHER_TEST_HELPER") != "pagezero" {
		t.Skip("helper process for TestMmapBelowMinAddrPersonality")
	}
	// personality(2) sets the calling thread's flags and execve reads the
	// exec'ing thread's: both must run on one thread (without this the
	// goroutine moved between them now and then, and the exec ran without
	// the flag).
	runtime.LockOSThread()
	const mmapPageZero = 0x0100000
	if _, _, e := unix.RawSyscall(unix.SYS_PERSONALITY, mmapPageZero, 0, 0); e != 0 {
		fmt.Printf("ERR personality: %v\n", e)
		os.Exit(1)
	}
	if cg := os.Getenv("WATCHER_PAGEZERO_CG"); cg != "" {
		if err := os.WriteFile(filepath.Join(cg, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0); err != nil {
			fmt.Printf("ERR join %s: %v\n", cg, err)
			os.Exit(1)
		}
	}
	bin := os.Getenv("WATCHER_PAGEZERO_BIN")
	err := syscall.Exec(bin, []string{bin}, nil)
	fmt.Printf("ERR exec: %v\n", err)
	os.Exit(1)
}
