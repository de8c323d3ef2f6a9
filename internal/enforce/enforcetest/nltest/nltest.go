// Package nltest builds rtnetlink requests for tests of the host-state
// rules. It imports nothing but x/sys: the kill backstop's helper binaries
// link it, and they must not call bpf(2) at init.
package nltest

import (
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// NewAddrNoInterface sends RTM_NEWADDR for an interface index that does
// not exist: rtnetlink checks CAP_NET_ADMIN first, then fails ENODEV, so
// nothing on the host changes.
func NewAddrNoInterface() error {
	s, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_ROUTE)
	if err != nil {
		return err
	}
	defer unix.Close(s)
	// nlmsghdr(16) + ifaddrmsg(8) + IFA_LOCAL rtattr(4+4)
	msg := make([]byte, 32)
	put32 := func(off int, v uint32) { *(*uint32)(unsafe.Pointer(&msg[off])) = v }
	put16 := func(off int, v uint16) { *(*uint16)(unsafe.Pointer(&msg[off])) = v }
	put32(0, 32)
	put16(4, unix.RTM_NEWADDR)
	put16(6, unix.NLM_F_REQUEST|unix.NLM_F_ACK|unix.NLM_F_CREATE)
	msg[16], msg[17] = unix.AF_INET, 32
	put32(20, 0x7ffffff0) // ifa_index: no such interface
	put16(24, 8)
	put16(26, unix.IFA_LOCAL)
	copy(msg[28:], []byte{198, 18, 0, 1})
	if err := unix.Sendto(s, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	buf := make([]byte, 4096)
	n, _, err := unix.Recvfrom(s, buf, 0)
	if err != nil {
		return err
	}
	if n >= 20 {
		if e := int32(*(*uint32)(unsafe.Pointer(&buf[16]))); e != 0 {
			return syscall.Errno(-e)
		}
	}
	return nil
}
