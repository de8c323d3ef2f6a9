package main

import (
	"fmt"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/launch/ia32"
)

// lowMapping places one page at addr by the route kind names, and unmaps
// it again: a low address gets the helper killed on the way back (the
// backstop's low-mapping category).
func lowMapping(kind string, addr uint64) error {
	const page = 4096
	anon := uintptr(unix.MAP_PRIVATE | unix.MAP_ANONYMOUS)
	a := uintptr(addr)
	placed := func(p uintptr) error {
		fmt.Printf("mapped at %#x\n", p)
		return nil
	}
	switch kind {
	case "mmap_fixed", "mmap_hint":
		flags := anon
		if kind == "mmap_fixed" {
			flags |= unix.MAP_FIXED
		}
		p, _, e := unix.Syscall6(unix.SYS_MMAP, a, page, unix.PROT_READ, flags, ^uintptr(0), 0)
		if e != 0 {
			return e
		}
		defer unix.Syscall(unix.SYS_MUNMAP, p, page, 0)
		return placed(p)
	case "mremap_fixed":
		old, _, e := unix.Syscall6(unix.SYS_MMAP, 0, page, unix.PROT_READ, anon, ^uintptr(0), 0)
		if e != 0 {
			return fmt.Errorf("mmap: %w", e)
		}
		p, _, e := unix.Syscall6(unix.SYS_MREMAP, old, page, page, unix.MREMAP_MAYMOVE|unix.MREMAP_FIXED, a, 0)
		if e != 0 {
			unix.Syscall(unix.SYS_MUNMAP, old, page, 0)
			return e
		}
		defer unix.Syscall(unix.SYS_MUNMAP, p, page, 0)
		return placed(p)
	case "shmat":
		// shmat(id, addr | 1, SHM_RND) rounds down to addr: page 0 too
		// (an address of 0 would let the kernel choose).
		id, _, e := unix.Syscall(unix.SYS_SHMGET, unix.IPC_PRIVATE, page, unix.IPC_CREAT|0o600)
		if e != 0 {
			return fmt.Errorf("shmget: %w", e)
		}
		defer unix.Syscall(unix.SYS_SHMCTL, id, unix.IPC_RMID, 0)
		p, _, e := unix.Syscall(unix.SYS_SHMAT, id, a|1, unix.SHM_RDONLY|unix.SHM_RND)
		if e != 0 {
			return e
		}
		defer unix.Syscall(unix.SYS_SHMDT, p, 0, 0)
		return placed(p)
	case "mmap2_ia32":
		r := ia32.Syscall6(192, a, page, unix.PROT_READ, anon|unix.MAP_FIXED, 0xffffffff, 0)
		if r < 0 && r > -4096 {
			return syscall.Errno(-r)
		}
		defer unix.Syscall(unix.SYS_MUNMAP, uintptr(uint32(r)), page, 0)
		return placed(uintptr(uint32(r)))
	case "ipc_shmat_ia32":
		// i386 ipc(SHMAT, id, flags, &raddr, addr): the address goes to
		// user memory (below 4 GiB), the return value is 0.
		id, _, e := unix.Syscall(unix.SYS_SHMGET, unix.IPC_PRIVATE, page, unix.IPC_CREAT|0o600)
		if e != 0 {
			return fmt.Errorf("shmget: %w", e)
		}
		defer unix.Syscall(unix.SYS_SHMCTL, id, unix.IPC_RMID, 0)
		mem, err := unix.Mmap(-1, 0, page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON|unix.MAP_32BIT)
		if err != nil {
			return err
		}
		const ipcShmat = 21
		r := ia32.Syscall6(117, ipcShmat, id, unix.SHM_RDONLY|unix.SHM_RND, uintptr(unsafe.Pointer(&mem[0])), a|1, 0)
		if r < 0 {
			return syscall.Errno(-r)
		}
		p := uintptr(*(*uint32)(unsafe.Pointer(&mem[0])))
		defer unix.Syscall(unix.SYS_SHMDT, p, 0, 0)
		return placed(p)
	}
	return fmt.Errorf("unknown lowmap kind %q", kind)
}

// mmapLoop maps and unmaps one anonymous page n times (after n/10 warm-up
// pairs) and returns ns per pair.
func mmapLoop(n int) float64 {
	anon := uintptr(unix.MAP_PRIVATE | unix.MAP_ANONYMOUS)
	pair := func() {
		p, _, e := unix.Syscall6(unix.SYS_MMAP, 0, 4096, unix.PROT_READ, anon, ^uintptr(0), 0)
		if e == 0 {
			unix.Syscall(unix.SYS_MUNMAP, p, 4096, 0)
		}
	}
	for i := 0; i < n/10; i++ {
		pair()
	}
	t0 := time.Now()
	for i := 0; i < n; i++ {
		pair()
	}
	return float64(time.Since(t0).Nanoseconds()) / float64(n)
}
