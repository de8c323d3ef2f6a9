package egress

// Sandboxes in their own network namespace (bpf/include/egress_netns.h):
// the kernel sends their DNS and relayed connects to listeners the agent
// opened in that namespace, whose ports it finds here by netns cookie.

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// ReasonNetns: DNS or a relayed connect from a network namespace where the
// agent has no listener yet.
const ReasonNetns uint8 = 12

func init() {
	reasons[ReasonNetns] = "the sandbox's network namespace has no watcher listener yet (the agent opens one; retry)"
}

// MaxNetns is the capacity of the per-namespace listener map.
const MaxNetns = 1024

// NetnsPorts are the agent's listeners in one network namespace, on the
// same loopback addresses as in its own (the proxy's and the relay's). A
// zero port means none: DNS of that family (or relayed connects) from
// that namespace are refused.
type NetnsPorts struct {
	DNS4, DNS6     uint16
	Relay4, Relay6 uint16
}

// setHome records the loader's network namespace as the agent's. Without
// netns cookies (kernel < 5.14) none is recorded and every socket is
// treated as the agent's, as before namespaces were told apart.
func (e *Egress) setHome() error {
	c, err := NetnsCookie()
	if err != nil {
		return nil
	}
	if err := e.objs.EgressHome.Put(uint32(0), c); err != nil {
		return fmt.Errorf("set the agent's netns: %w", err)
	}
	e.home = c
	return nil
}

// HomeNetns is the cookie of the network namespace the programs were loaded
// from (the agent's), 0 when the kernel has no netns cookies.
func (e *Egress) HomeNetns() uint64 { return e.home }

// SetNetns records the agent's listeners in the namespace netns.
func (e *Egress) SetNetns(netns uint64, p NetnsPorts) error {
	if netns == 0 || netns == e.home {
		return fmt.Errorf("set netns %d: not another namespace", netns)
	}
	v := egressNetnsPorts{Dns4: htons(p.DNS4), Dns6: htons(p.DNS6), Relay4: htons(p.Relay4), Relay6: htons(p.Relay6)}
	if err := e.objs.EgressNetns.Put(netns, v); err != nil {
		return fmt.Errorf("set netns %d: %w", netns, err)
	}
	return nil
}

// ClearNetns forgets the namespace's listeners: DNS and relayed connects
// from it are refused again.
func (e *Egress) ClearNetns(netns uint64) error {
	if err := e.objs.EgressNetns.Delete(netns); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("clear netns %d: %w", netns, err)
	}
	return nil
}

// Netns lists the namespaces with listeners recorded (a restarted agent
// finds its predecessor's, whose listeners are gone with it).
func (e *Egress) Netns() ([]uint64, error) {
	var out []uint64
	var k uint64
	var v egressNetnsPorts
	it := e.objs.EgressNetns.Iterate()
	for it.Next(&k, &v) {
		out = append(out, k)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("list netns: %w", err)
	}
	return out, nil
}

// OnNetnsRefused sets f to be called, on the event reader's goroutine, for
// each refusal of DNS or a relayed connect from a namespace without
// listeners (events registered with RegisterEvents): the agent learns the
// namespace and opens them. f must not block.
func (e *Egress) OnNetnsRefused(f func()) { e.onNetns.Store(&f) }

func (e *Egress) netnsRefused() {
	if f := e.onNetns.Load(); f != nil && *f != nil {
		(*f)()
	}
}

// ReasonText is the text a refusal event carries for reason r.
func ReasonText(r uint8) string { return reasons[r] }
