package lsm

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A minimal io_uring client over raw syscalls (no cgo: the test binary is
// static), enough to submit one IORING_OP_OPENAT and read its completion.

type uringSQOffsets struct {
	Head, Tail, RingMask, RingEntries, Flags, Dropped, Array, Resv1 uint32
	UserAddr                                                        uint64
}

type uringCQOffsets struct {
	Head, Tail, RingMask, RingEntries, Overflow, Cqes, Flags, Resv1 uint32
	UserAddr                                                        uint64
}

type uringParams struct {
	SqEntries, CqEntries, Flags, SqThreadCPU, SqThreadIdle, Features, WqFd uint32
	Resv                                                                   [3]uint32
	SqOff                                                                  uringSQOffsets
	CqOff                                                                  uringCQOffsets
}

const (
	uringSetupSQPoll    = 1 << 1
	uringOpOpenat       = 18
	uringSqeAsync       = 1 << 4
	uringEnterGetEvents = 1
	uringEnterSQWakeup  = 2
	uringRegisterFiles  = 2
	uringOffSQRing      = 0
	uringOffCQRing      = 0x8000000
	uringOffSQEs        = 0x10000000
)

// Submission modes for uringOpenat.
const (
	uringPlain  = iota // inline submission from io_uring_enter
	uringAsync         // IOSQE_ASYNC: punted to an io-wq worker thread
	uringSQPoll        // IORING_SETUP_SQPOLL: the kernel's submission thread
	uringFixed         // openat_direct: into the registered file table
)

// uringOpenat opens path read-only through io_uring and returns the
// completion's errno (0 on success).
func uringOpenat(path string, mode int) (unix.Errno, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var p uringParams
	if mode == uringSQPoll {
		p.Flags = uringSetupSQPoll
		p.SqThreadIdle = 1000
	}
	fdr, _, e := unix.Syscall(unix.SYS_IO_URING_SETUP, 4, uintptr(unsafe.Pointer(&p)), 0)
	if e != 0 {
		return 0, fmt.Errorf("io_uring_setup: %w", e)
	}
	fd := int(fdr)
	defer unix.Close(fd)

	sqLen := int(p.SqOff.Array + p.SqEntries*4)
	sq, err := unix.Mmap(fd, uringOffSQRing, sqLen, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return 0, fmt.Errorf("mmap sq ring: %w", err)
	}
	defer unix.Munmap(sq)
	cqLen := int(p.CqOff.Cqes + p.CqEntries*16)
	cq, err := unix.Mmap(fd, uringOffCQRing, cqLen, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return 0, fmt.Errorf("mmap cq ring: %w", err)
	}
	defer unix.Munmap(cq)
	sqes, err := unix.Mmap(fd, uringOffSQEs, int(p.SqEntries*64), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return 0, fmt.Errorf("mmap sqes: %w", err)
	}
	defer unix.Munmap(sqes)

	if mode == uringFixed {
		slots := []int32{-1} // one sparse slot
		_, _, e := unix.Syscall6(unix.SYS_IO_URING_REGISTER, uintptr(fd), uringRegisterFiles,
			uintptr(unsafe.Pointer(&slots[0])), 1, 0, 0)
		if e != 0 {
			return 0, fmt.Errorf("io_uring_register files: %w", e)
		}
	}

	u32 := func(b []byte, off uint32) *uint32 { return (*uint32)(unsafe.Pointer(&b[off])) }
	pathBytes, err := unix.BytePtrFromString(path)
	if err != nil {
		return 0, err
	}
	tail := atomic.LoadUint32(u32(sq, p.SqOff.Tail))
	idx := tail & atomic.LoadUint32(u32(sq, p.SqOff.RingMask))
	sqe := sqes[idx*64 : idx*64+64]
	clear(sqe)
	sqe[0] = uringOpOpenat
	if mode == uringAsync {
		sqe[1] = uringSqeAsync
	}
	dirfd := int32(unix.AT_FDCWD)
	*(*int32)(unsafe.Pointer(&sqe[4])) = dirfd
	*(*uint64)(unsafe.Pointer(&sqe[16])) = uint64(uintptr(unsafe.Pointer(pathBytes)))
	openFlags := uint32(unix.O_RDONLY | unix.O_CLOEXEC)
	if mode == uringFixed {
		openFlags = unix.O_RDONLY // a fixed-table slot has no close-on-exec
	}
	*(*uint32)(unsafe.Pointer(&sqe[28])) = openFlags
	*(*uint64)(unsafe.Pointer(&sqe[32])) = 0x5741
	if mode == uringFixed {
		*(*uint32)(unsafe.Pointer(&sqe[44])) = 1 // slot 0, plus one
	}
	*(*uint32)(unsafe.Pointer(&sq[p.SqOff.Array+idx*4])) = idx
	atomic.StoreUint32(u32(sq, p.SqOff.Tail), tail+1)

	toSubmit, flags := uintptr(1), uintptr(uringEnterGetEvents)
	if mode == uringSQPoll {
		toSubmit, flags = 0, uringEnterGetEvents|uringEnterSQWakeup
	}
	for {
		_, _, e = unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(fd), toSubmit, 1, flags, 0, 0)
		if e == unix.EINTR {
			toSubmit = 0
			continue
		}
		break
	}
	runtime.KeepAlive(pathBytes)
	if e != 0 {
		return 0, fmt.Errorf("io_uring_enter: %w", e)
	}
	head := atomic.LoadUint32(u32(cq, p.CqOff.Head))
	if head == atomic.LoadUint32(u32(cq, p.CqOff.Tail)) {
		return 0, fmt.Errorf("io_uring: no completion")
	}
	cqe := cq[p.CqOff.Cqes+(head&atomic.LoadUint32(u32(cq, p.CqOff.RingMask)))*16:]
	res := *(*int32)(unsafe.Pointer(&cqe[8]))
	atomic.StoreUint32(u32(cq, p.CqOff.Head), head+1)
	if res < 0 {
		return unix.Errno(-res), nil
	}
	if mode != uringFixed {
		unix.Close(int(res))
	}
	return 0, nil
}
