package egress

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/rules/cgrouprules"
)

// NetEvent is a refused (or recorded) connection or datagram, struct
// net_event in bpf/egress.c.
type NetEvent = egressNetEvent

// Reasons of struct net_event (enum net_reason in bpf/egress.c).
var reasons = map[uint8]string{
	1:  "not resolved through the DNS proxy and no rule allows it",
	2:  "DNS answer expired (TTL + grace)",
	3:  "no egress policy for this cgroup",
	4:  "DNS over this address family has no proxy",
	5:  "no free source port to attribute the DNS query",
	6:  "another resolver's port (DNS over TLS/QUIC, mDNS, LLMNR, NetBIOS): only the DNS proxy resolves",
	7:  "abstract unix socket (the host's namespace)",
	8:  "relative unix socket path (cannot be judged)",
	9:  `".." in a unix socket path`,
	10: "unix socket outside the sandbox's paths",
	11: "answered address, but not on a port or protocol its name allows",
	13: "socket made outside the sandbox (inherited, or passed in by another process): a sandbox connects only sockets it made; no policy line allows it",
}

// Reason codes, for callers that compare.
const (
	ReasonNotResolved uint8 = 1
	ReasonExpired     uint8 = 2
	ReasonNoPolicy    uint8 = 3
	ReasonDNSNoProxy  uint8 = 4
	ReasonDNSBind     uint8 = 5
	ReasonResolver    uint8 = 6
	ReasonUnixAbs     uint8 = 7
	ReasonUnixRel     uint8 = 8
	ReasonUnixDotDot  uint8 = 9
	ReasonUnixPath    uint8 = 10
	ReasonPort        uint8 = 11
	ReasonForeignSock uint8 = 13 // foreign.go
)

// UnixEvent is a refused (or recorded) unix socket connect or sendmsg,
// struct unix_event in bpf/egress.c.
type UnixEvent = egressUnixEvent

var ops = map[uint8]string{1: "connect", 2: "sendmsg"}

// Register registers the decoder of the egress programs' events.
func Register(r *enforce.Reader) {
	r.Register(enforce.EvNet, audit.KindNet, cgrouprules.Mechanism, decodeNet)
}

func decodeNet(raw []byte, ev *audit.Event) error {
	e, err := enforce.Cast[NetEvent](raw)
	if err != nil {
		return fmt.Errorf("net event: %w", err)
	}
	reason, ok := reasons[e.Reason]
	if !ok {
		reason = fmt.Sprintf("reason %d", e.Reason)
	}
	op, ok := ops[e.Op]
	if !ok {
		op = fmt.Sprintf("op %d", e.Op)
	}
	ev.Net = &audit.NetDetail{
		Op:       op,
		Family:   e.Family,
		Type:     uint16(e.SockType),
		Protocol: e.Protocol,
		Addr:     wordsToAddr(e.Addr).String(),
		Port:     e.Port,
		Reason:   reason,
	}
	if e.Family == unix.AF_UNIX {
		u, err := enforce.Cast[UnixEvent](raw)
		if err != nil {
			return fmt.Errorf("unix event: %w", err)
		}
		ev.Net.Addr = unixPath(u.Path[:], int(u.PathLen))
	}
	return nil
}

// unixPath renders a socket path as passed; abstract names as "@name".
func unixPath(p []int8, n int) string {
	n = min(max(n, 0), len(p))
	b := make([]byte, 0, n)
	for i := 0; i < n; i++ {
		b = append(b, byte(p[i]))
	}
	if len(b) > 0 && b[0] == 0 {
		return "@" + strings.TrimRight(string(b[1:]), "\x00")
	}
	// The kernel ends a path at its first NUL.
	if i := strings.IndexByte(string(b), 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

// Run deletes expired answered addresses every interval until ctx ends.
func (e *Egress) Run(ctx context.Context, interval time.Duration) error {
	if interval <= 0 {
		interval = 10 * time.Second
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if _, err := e.Expire(); err != nil {
				return err
			}
		}
	}
}

// Probe loads each egress program alone, with private maps, and reports
// whether this kernel accepts it (nil) or the error: the agent prints which
// mechanism enforces network rules.
func Probe() map[string]error {
	out := map[string]error{}
	spec, err := loadEgress()
	if err != nil {
		out["spec"] = err
		return out
	}
	for _, m := range spec.Maps {
		m.Pinning = ebpf.PinNone
	}
	for name, err := range enforce.ProbeEach(spec, ebpf.CollectionOptions{}) {
		out[spec.Programs[name].SectionName] = err
	}
	return out
}
