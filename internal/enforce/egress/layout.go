package egress

import (
	"encoding/binary"
	"net/netip"

	"golang.org/x/sys/unix"
)

// Kernel layouts: addresses as the maps key them, network byte order,
// and the clock of the programs' timestamps.

// addrToWords lays an address out as the kernel keys it: 16 bytes in
// network order, IPv4 as IPv4-mapped.
func addrToWords(a netip.Addr) [4]uint32 {
	b := a.As16()
	var w [4]uint32
	for i := range w {
		w[i] = binary.NativeEndian.Uint32(b[4*i:])
	}
	return w
}

func wordsToAddr(w [4]uint32) netip.Addr {
	var b [16]byte
	for i := range w {
		binary.NativeEndian.PutUint32(b[4*i:], w[i])
	}
	a := netip.AddrFrom16(b)
	if a.Is4In6() {
		return a.Unmap()
	}
	return a
}

func htons(p uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], p)
	return binary.NativeEndian.Uint16(b[:])
}

func ntohs(p uint16) uint16 { return htons(p) }

// bootNanos is CLOCK_BOOTTIME, the clock of bpf_ktime_get_boot_ns.
func bootNanos() uint64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts)
	return uint64(ts.Nano())
}
