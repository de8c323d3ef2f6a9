package cgroupbpf

import (
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/rules/cgrouprules"
)

// cgrouprules.MaxListenRanges must be MAX_LISTEN_RANGES in bpf/cgroup.c: a constant overflow fails the
// build when they differ.
const _ = uint(len(cgroupListenCfg{}.Ranges)-cgrouprules.MaxListenRanges) + uint(cgrouprules.MaxListenRanges-len(cgroupListenCfg{}.Ranges))

// SetListenRules replaces the listener rule table.
func (h *Programs) SetListenRules(rules []cgrouprules.ListenRule) error {
	want := map[uint32]cgroupListenCfg{}
	for i, r := range rules {
		if r.Sandbox == 0 {
			return fmt.Errorf("listen rule %d: no sandbox id", i)
		}
		if err := checkAction(r.Action); err != nil {
			return fmt.Errorf("listen rule %d: %w", i, err)
		}
		if len(r.Ports) > cgrouprules.MaxListenRanges {
			return fmt.Errorf("listen rule %d: %d port ranges, at most %d fit", i, len(r.Ports), cgrouprules.MaxListenRanges)
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
