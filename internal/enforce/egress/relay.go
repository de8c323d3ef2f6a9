package egress

// Name binding, the kernel side (bpf/include/relay.h): TCP connects of a
// sandbox to answered addresses are redirected to a transparent relay on
// loopback, which judges the name on the wire; the original destination is
// recorded under the client's source port.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Flags of struct relay_config (RELAY_F_* in bpf/include/relay.h).
const (
	relayFlagTCP  uint32 = 1
	relayFlagQUIC uint32 = 2
)

// Reasons of the relay (enum values in bpf/include/relay.h).
const (
	ReasonRelayNone uint8 = 20
	ReasonQUIC      uint8 = 21
)

func init() {
	reasons[ReasonRelayNone] = "name binding on, but no relay listens for this address family or network namespace"
	reasons[ReasonQUIC] = "QUIC (UDP 443) to an answered address: the name inside cannot be judged; clients fall back to TCP"
}

// RelayConfig is one sandbox's name binding.
type RelayConfig struct {
	// Relay4 and Relay6 are the relay's listeners (loopback). A TCP connect
	// to an answered address of a family without one is refused.
	Relay4, Relay6 netip.AddrPort
	// NetnsCookie is the relay's network namespace (NetnsCookie()); only
	// sockets in it are redirected.
	NetnsCookie uint64
	// RefuseQUIC refuses UDP 443 to answered addresses unless a rule
	// allows it.
	RefuseQUIC bool
}

// SetRelay turns name binding on for sandbox id.
func (e *Egress) SetRelay(id uint32, rc RelayConfig) error {
	if id == 0 {
		return errors.New("set relay: sandbox id must be > 0")
	}
	v := egressRelayConfig{NetnsCookie: rc.NetnsCookie, Flags: relayFlagTCP}
	if rc.RefuseQUIC {
		v.Flags |= relayFlagQUIC
	}
	if rc.Relay4.IsValid() {
		a := rc.Relay4.Addr().Unmap()
		if !a.Is4() {
			return fmt.Errorf("set relay %d: %s is not IPv4", id, rc.Relay4)
		}
		b := a.As4()
		v.Ip4 = binary.NativeEndian.Uint32(b[:])
		v.Port4 = htons(rc.Relay4.Port())
	}
	if rc.Relay6.IsValid() {
		a := rc.Relay6.Addr()
		if !a.Is6() || a.Is4In6() {
			return fmt.Errorf("set relay %d: %s is not IPv6", id, rc.Relay6)
		}
		v.Ip6 = addrToWords(a)
		v.Port6 = htons(rc.Relay6.Port())
	}
	if err := e.objs.EgressRelayCfg.Put(id, v); err != nil {
		return fmt.Errorf("set relay %d: %w", id, err)
	}
	return nil
}

// ClearRelay turns name binding off for sandbox id.
func (e *Egress) ClearRelay(id uint32) error {
	if err := e.objs.EgressRelayCfg.Delete(id); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("clear relay %d: %w", id, err)
	}
	return nil
}

// Relayed is a connection the kernel redirected to the relay.
type Relayed struct {
	SandboxID uint32
	// Dest is where the client connected, before the redirect.
	Dest netip.AddrPort
	// PID is the process (tgid) that connected, Cgroup its cgroup.
	PID    uint32
	Cgroup uint64
	// Age is how long ago the connect happened.
	Age time.Duration
}

// LookupRelayed tells where the connection the relay accepted from src
// was going. The record is keyed by src's port; a record older than
// maxAge is ignored (a port reused by a process outside any sandbox).
func (e *Egress) LookupRelayed(src netip.AddrPort, maxAge time.Duration) (Relayed, bool) {
	return e.LookupRelayedIn(e.home, src, maxAge)
}

// LookupRelayedIn is LookupRelayed for a connection accepted by a listener
// in the network namespace whose cookie is netns.
func (e *Egress) LookupRelayedIn(netns uint64, src netip.AddrPort, maxAge time.Duration) (Relayed, bool) {
	var c egressRelayConn
	if err := e.objs.EgressRelayConnsNs.Lookup(egressRelayConnKey{Netns: netns, Port: uint32(src.Port())}, &c); err != nil {
		return Relayed{}, false
	}
	age := time.Duration(bootNanos() - c.TsNs)
	if maxAge > 0 && age > maxAge {
		return Relayed{}, false
	}
	return Relayed{
		SandboxID: c.SandboxId,
		Dest:      netip.AddrPortFrom(wordsToAddr(c.Addr), ntohs(c.Port)),
		PID:       c.Pid,
		Cgroup:    c.Cgroup,
		Age:       age,
	}, true
}

// NetnsCookie is the network namespace cookie of the calling thread's
// namespace (SO_NETNS_COOKIE, kernel 5.14+).
func NetnsCookie() (uint64, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("netns cookie: %w", err)
	}
	defer unix.Close(fd)
	c, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
	if err != nil {
		return 0, fmt.Errorf("netns cookie: %w", err)
	}
	return c, nil
}
