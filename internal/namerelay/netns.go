package namerelay

// Listeners in sandboxes' own network namespaces: the kernel sends a
// name-bound connect to the relay's port in the client's namespace
// (bpf/include/relay.h); the agent opens a listener there and hands it to
// ServeNetns. Its connections are looked up by that namespace's cookie
// (source ports are per namespace) and dialled from that namespace (the
// route to the destination exists only there).

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sync"
)

// netnsOf is one other namespace the relay serves.
type netnsOf struct {
	cookie uint64
	lns    []net.Listener
	dial   func(ctx context.Context, network, addr string) (net.Conn, error)
}

type netnsServing struct {
	mu       sync.Mutex
	lookupIn func(netns uint64, src netip.AddrPort) (Conn, bool)
	spaces   map[uint64]*netnsOf
	// conns are the connections accepted in another namespace (kept
	// aside, not wrapped: the splice paths see the plain *net.TCPConn).
	conns map[net.Conn]*netnsOf
}

func (r *Relay) noteNetns(c net.Conn, ns *netnsOf) {
	r.ns.mu.Lock()
	if r.ns.conns == nil {
		r.ns.conns = map[net.Conn]*netnsOf{}
	}
	r.ns.conns[c] = ns
	r.ns.mu.Unlock()
}

func (r *Relay) forgetNetns(c net.Conn) {
	r.ns.mu.Lock()
	delete(r.ns.conns, c)
	r.ns.mu.Unlock()
}

// netnsOfConn is the namespace a connection was accepted in, nil for the
// relay's own.
func (r *Relay) netnsOfConn(c net.Conn) *netnsOf {
	r.ns.mu.Lock()
	defer r.ns.mu.Unlock()
	return r.ns.conns[c]
}

// SetNetnsLookup sets how a connection accepted in another namespace (its
// cookie) finds where it was going (egress.LookupRelayedIn). Without it,
// such connections are unknown and closed.
func (r *Relay) SetNetnsLookup(f func(netns uint64, src netip.AddrPort) (Conn, bool)) {
	r.ns.mu.Lock()
	r.ns.lookupIn = f
	r.ns.mu.Unlock()
}

// ServeNetns serves listeners opened in the namespace with cookie netns;
// dial connects from that namespace. The relay owns the listeners from
// then on (CloseNetns, Close).
func (r *Relay) ServeNetns(netns uint64, lns []net.Listener, dial func(ctx context.Context, network, addr string) (net.Conn, error)) error {
	r.mu.Lock()
	closed := r.closed
	r.mu.Unlock()
	r.ns.mu.Lock()
	defer r.ns.mu.Unlock()
	if closed {
		return errors.New("namerelay: closed")
	}
	if r.ns.spaces == nil {
		r.ns.spaces = map[uint64]*netnsOf{}
	}
	if r.ns.spaces[netns] != nil {
		return errors.New("namerelay: namespace served already")
	}
	ns := &netnsOf{cookie: netns, lns: lns, dial: dial}
	r.ns.spaces[netns] = ns
	for _, ln := range lns {
		r.wg.Add(1)
		go r.serve(ln, ns)
	}
	return nil
}

// CloseNetns closes the namespace's listeners and its relayed
// connections: nothing of the relay's keeps the namespace alive.
func (r *Relay) CloseNetns(netns uint64) {
	r.ns.mu.Lock()
	ns := r.ns.spaces[netns]
	delete(r.ns.spaces, netns)
	r.ns.mu.Unlock()
	if ns == nil {
		return
	}
	for _, ln := range ns.lns {
		ln.Close()
	}
	r.ns.mu.Lock()
	for c, of := range r.ns.conns {
		if of == ns {
			c.Close()
		}
	}
	r.ns.mu.Unlock()
}

func (r *Relay) closeAllNetns() {
	r.ns.mu.Lock()
	var cookies []uint64
	for c := range r.ns.spaces {
		cookies = append(cookies, c)
	}
	r.ns.mu.Unlock()
	for _, c := range cookies {
		r.CloseNetns(c)
	}
}

// lookup finds where an accepted connection was going, in the namespace
// it was accepted in.
func (r *Relay) lookup(c net.Conn, src netip.AddrPort) (Conn, bool) {
	r.ns.mu.Lock()
	ns, f := r.ns.conns[c], r.ns.lookupIn
	r.ns.mu.Unlock()
	if ns == nil {
		return r.cfg.Lookup(src)
	}
	if f == nil {
		return Conn{}, false
	}
	return f(ns.cookie, src)
}
