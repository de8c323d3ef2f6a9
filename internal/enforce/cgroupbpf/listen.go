package cgroupbpf

import (
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/enforce"
)

// MaxListenRanges is how many port ranges one sandbox's ListenRule holds
// (MAX_LISTEN_RANGES in bpf/cgroup.c).
const MaxListenRanges = len(cgroupListenCfg{}.Ranges)

// PortRange is an inclusive range of ports.
type PortRange struct{ Lo, Hi uint16 }

// ListenRule says where a sandbox may accept connections from other
// hosts. A bind to a loopback address (127.0.0.0/8, ::1, v4-mapped
// 127/8) is allowed on any port; a bind to any other address, the
// wildcards included, only on a port in Ports: cgroup/bind4 and bind6
// refuse the rest with EPERM. A bind onto an address and port where a
// socket the sandbox does not own listens (TCP) or is bound (UDP) is
// refused too (SO_REUSEPORT would share that service's traffic).
//
// listen(2) on an unbound socket (the kernel's autobind: an ephemeral port
// on the wildcard address, no bind hook) cannot be refused by a cgroup
// program: sockops records it as it happens, and cgroup_skb/ingress drops
// every packet from another host to it, so it never sees a connection from
// outside; connections to a loopback destination still reach it. UDP
// sockets bound implicitly by sendto, or explicitly to port 0, are clients
// and pass.
//
// A sandbox without a ListenRule may listen anywhere.
type ListenRule struct {
	// Sandbox is the sandbox id (there is no default rule).
	Sandbox uint32
	// Ports lists the ports binds to non-loopback addresses may use; at
	// most MaxListenRanges ranges.
	Ports []PortRange
	// Action for a refused bind or listener: ActionBlock (ActionKill is
	// enforced as block: these hooks cannot kill), ActionRecord, or
	// ActionAllow.
	Action uint32
	// RuleID is reported in events.
	RuleID uint32
}

// SetListenRules replaces the listener rule table.
func (h *Programs) SetListenRules(rules []ListenRule) error {
	want := map[uint32]cgroupListenCfg{}
	for i, r := range rules {
		if r.Sandbox == 0 {
			return fmt.Errorf("listen rule %d: no sandbox id", i)
		}
		if err := checkAction(r.Action); err != nil {
			return fmt.Errorf("listen rule %d: %w", i, err)
		}
		if len(r.Ports) > MaxListenRanges {
			return fmt.Errorf("listen rule %d: %d port ranges, at most %d fit", i, len(r.Ports), MaxListenRanges)
		}
		if _, dup := want[r.Sandbox]; dup {
			return fmt.Errorf("listen rule %d: second rule for sandbox %d", i, r.Sandbox)
		}
		cfg := cgroupListenCfg{Action: r.Action, RuleId: r.RuleID, N: uint32(len(r.Ports))}
		for j, p := range r.Ports {
			if p.Lo == 0 || p.Hi < p.Lo {
				return fmt.Errorf("listen rule %d: bad port range %d-%d", i, p.Lo, p.Hi)
			}
			cfg.Ranges[j].Lo, cfg.Ranges[j].Hi = p.Lo, p.Hi
		}
		want[r.Sandbox] = cfg
	}
	return enforce.SyncMap(h.objs.CgListenRules, want)
}

// ListenEvent is the kernel event of a refused or recorded bind or
// listener (struct listen_event in bpf/cgroup.c).
type ListenEvent = cgroupListenEvent

// Listen operations (enum listen_op in bpf/cgroup.c), as NetDetail.Op.
var listenOps = map[uint8]string{1: "bind", 2: "listen", 3: "bind_takeover"}

var listenReasons = map[uint8]string{
	1: "bind to a non-loopback address on a port listen.ports does not name",
	2: "listen(2) on an automatically bound port of a non-loopback address: connections from other hosts are dropped",
	3: "bind onto an address and port a socket outside the sandbox holds",
}

func decodeListen(raw []byte, ev *audit.Event) error {
	e, err := enforce.Cast[ListenEvent](raw)
	if err != nil {
		return err
	}
	fillPPID(ev)
	var addr netip.Addr
	if e.Family == unix.AF_INET {
		addr = netip.AddrFrom4(be4(e.Addr[0]))
	} else {
		var b [16]byte
		for i, w := range e.Addr {
			copy(b[4*i:], be4ref(w))
		}
		addr = netip.AddrFrom16(b)
	}
	op, ok := listenOps[e.Op]
	if !ok {
		op = fmt.Sprintf("listen_op_%d", e.Op)
	}
	ev.Net = &audit.NetDetail{
		Op: op, Family: uint16(e.Family), Type: uint16(e.Type), Protocol: uint16(e.Protocol),
		Addr: addr.String(), Port: e.Port, Reason: listenReasons[e.Op],
	}
	return nil
}

// be4 returns a network-order address word as read on little-endian hosts
// (the word's bytes in memory order).
func be4(w uint32) [4]byte { return [4]byte{byte(w), byte(w >> 8), byte(w >> 16), byte(w >> 24)} }

func be4ref(w uint32) []byte { b := be4(w); return b[:] }
