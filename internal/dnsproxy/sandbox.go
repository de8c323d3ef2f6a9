package dnsproxy

import (
	"net/netip"
	"sync"
	"sync/atomic"
)

// QuerySource describes where a query came from.
type QuerySource struct {
	// Proto is "udp" or "tcp".
	Proto string
	// Local is the address the query was received on.
	Local netip.AddrPort
	// Remote is the client's address and port (after any kernel-side
	// redirection, the client socket's own address and port).
	Remote netip.AddrPort
	// ListenerSandbox is the Sandbox of the Listener that received the
	// query, "" when that listener serves several sandboxes.
	ListenerSandbox string
}

// SandboxResolver maps a query's source to the name of the sandbox whose
// policy applies. ok is false when the source belongs to no sandbox; such
// queries are refused.
//
// Implementations must be safe for concurrent use and fast: the resolver
// runs on every query. The kernel-side egress work plugs in here with a
// resolver backed by a BPF map that records, per client socket, the sandbox
// cgroup that sent the query.
type SandboxResolver interface {
	Sandbox(src QuerySource) (name string, ok bool)
}

// SandboxResolverFunc adapts a function to SandboxResolver.
type SandboxResolverFunc func(src QuerySource) (string, bool)

// Sandbox calls f.
func (f SandboxResolverFunc) Sandbox(src QuerySource) (string, bool) { return f(src) }

// ListenerSandboxes resolves a query to the sandbox of the listener that
// received it: the listener-per-sandbox mode.
type ListenerSandboxes struct{}

// Sandbox returns the listener's sandbox.
func (ListenerSandboxes) Sandbox(src QuerySource) (string, bool) {
	return src.ListenerSandbox, src.ListenerSandbox != ""
}

// AddrTable maps client addresses to sandboxes: exact address-and-port
// entries first (filled by whoever knows which socket belongs to which
// sandbox), then the longest matching prefix. It is safe for concurrent use;
// lookups take no lock.
type AddrTable struct {
	mu    sync.Mutex // serialises writers
	table atomic.Pointer[addrTableData]
}

type addrTableData struct {
	ports    map[netip.AddrPort]string
	prefixes map[netip.Prefix]string
	bits     []int // prefix lengths present, longest first
}

// NewAddrTable returns an empty table.
func NewAddrTable() *AddrTable {
	t := &AddrTable{}
	t.table.Store(&addrTableData{ports: map[netip.AddrPort]string{}, prefixes: map[netip.Prefix]string{}})
	return t
}

func (t *AddrTable) update(f func(d *addrTableData)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	old := t.table.Load()
	d := &addrTableData{ports: make(map[netip.AddrPort]string, len(old.ports)), prefixes: make(map[netip.Prefix]string, len(old.prefixes))}
	for k, v := range old.ports {
		d.ports[k] = v
	}
	for k, v := range old.prefixes {
		d.prefixes[k] = v
	}
	f(d)
	seen := map[int]bool{}
	d.bits = d.bits[:0]
	for p := range d.prefixes {
		if !seen[p.Bits()] {
			seen[p.Bits()] = true
			d.bits = append(d.bits, p.Bits())
		}
	}
	// Longest first, so the most specific prefix wins.
	for i := 1; i < len(d.bits); i++ {
		for j := i; j > 0 && d.bits[j] > d.bits[j-1]; j-- {
			d.bits[j], d.bits[j-1] = d.bits[j-1], d.bits[j]
		}
	}
	t.table.Store(d)
}

// SetPrefix maps every client address in p to sandbox.
func (t *AddrTable) SetPrefix(p netip.Prefix, sandbox string) {
	p = p.Masked()
	t.update(func(d *addrTableData) { d.prefixes[p] = sandbox })
}

// SetAddrPort maps one client socket address to sandbox.
func (t *AddrTable) SetAddrPort(ap netip.AddrPort, sandbox string) {
	ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	t.update(func(d *addrTableData) { d.ports[ap] = sandbox })
}

// DeleteAddrPort removes an address-and-port entry.
func (t *AddrTable) DeleteAddrPort(ap netip.AddrPort) {
	ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	t.update(func(d *addrTableData) { delete(d.ports, ap) })
}

// DeletePrefix removes a prefix entry.
func (t *AddrTable) DeletePrefix(p netip.Prefix) {
	p = p.Masked()
	t.update(func(d *addrTableData) { delete(d.prefixes, p) })
}

// Sandbox looks the client up.
func (t *AddrTable) Sandbox(src QuerySource) (string, bool) {
	d := t.table.Load()
	ap := netip.AddrPortFrom(src.Remote.Addr().Unmap(), src.Remote.Port())
	if name, ok := d.ports[ap]; ok {
		return name, true
	}
	for _, bits := range d.bits {
		p, err := ap.Addr().Prefix(bits)
		if err != nil {
			continue
		}
		if name, ok := d.prefixes[p]; ok {
			return name, true
		}
	}
	return "", false
}

// FirstOf tries resolvers in order and returns the first answer.
func FirstOf(rs ...SandboxResolver) SandboxResolver {
	return SandboxResolverFunc(func(src QuerySource) (string, bool) {
		for _, r := range rs {
			if name, ok := r.Sandbox(src); ok {
				return name, true
			}
		}
		return "", false
	})
}
