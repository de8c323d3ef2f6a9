// Package nslisten keeps the agent's listeners in the network namespaces
// its sandboxes' processes live in (a container on a bridge network,
// `unshare -n`): the kernel redirects a sandbox's DNS queries and
// name-bound TCP connects to loopback in the socket's own namespace
// (bpf/include/egress_netns.h), so the DNS proxy and the name relay must
// listen there too.
//
// Each namespace gets a UDP and TCP DNS listener on the proxy's loopback
// addresses, and relay listeners on the relay's, bound on a thread that
// joined the namespace (the socket belongs to the namespace it was made
// in) and served from ordinary goroutines. Their ports go into the
// kernel's map by netns cookie. The sockets keep the namespace alive, so
// Sweep closes them when no sandbox task is left in it.
package nslisten

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"

	"github.com/watcherhq/watcher/internal/enforce/egress"
	"github.com/watcherhq/watcher/internal/netnsutil"
)

// Kernel is the egress programs' per-namespace listener map
// (egress.Egress).
type Kernel interface {
	HomeNetns() uint64
	SetNetns(netns uint64, p egress.NetnsPorts) error
	ClearNetns(netns uint64) error
}

// Relay serves relay listeners opened in a namespace (namerelay.Relay).
type Relay interface {
	// ServeNetns serves lns, accepted connections coming from the
	// namespace with cookie netns, whose destinations dial dials from.
	ServeNetns(netns uint64, lns []net.Listener, dial Dialer) error
	// CloseNetns closes what ServeNetns serves for netns.
	CloseNetns(netns uint64)
}

// Dialer dials from one namespace.
type Dialer = func(ctx context.Context, network, addr string) (net.Conn, error)

// Config configures a Manager.
type Config struct {
	Kernel Kernel
	// DNS answers one query; nil: no DNS listeners.
	DNS DNSHandler
	// DNS4, DNS6 are the proxy's addresses in the agent's namespace: the
	// listeners in other namespaces bind the same addresses on ports of
	// their own, never one another's (the port tells the namespace;
	// NetnsOf). An invalid one: none for that family.
	DNS4, DNS6 netip.AddrPort
	// Relay and RelayAddrs: the name relay and its listeners' addresses
	// in the agent's namespace; nil or empty: no relay listeners.
	Relay      Relay
	RelayAddrs []netip.AddrPort
	// OnChange, when set, is told of every namespace opened or closed.
	OnChange func(Change)
}

// Change is a namespace whose listeners were opened or closed.
type Change struct {
	Opened bool
	ID     netnsutil.ID
	Cookie uint64
	Ports  egress.NetnsPorts
	// Err is why closing failed in part, or why a family's listener
	// could not be opened (the rest were).
	Err error
}

// Namespace is one namespace the manager keeps listeners in.
type Namespace struct {
	ID     netnsutil.ID
	Cookie uint64
	Ports  egress.NetnsPorts
	file   *os.File
	dns    *dnsServer
	relay  bool
}

// Manager keeps the listeners.
type Manager struct {
	cfg  Config
	home netnsutil.ID

	mu     sync.Mutex
	spaces map[netnsutil.ID]*Namespace
	// dnsPorts maps a DNS listener's port to its namespace's cookie.
	dnsPorts map[uint16]uint64
	closed   bool
}

// New returns a manager with no listeners yet.
func New(cfg Config) (*Manager, error) {
	if cfg.Kernel == nil {
		return nil, errors.New("nslisten: no kernel map")
	}
	home, err := netnsutil.Self()
	if err != nil {
		return nil, fmt.Errorf("nslisten: %w", err)
	}
	return &Manager{cfg: cfg, home: home, spaces: map[netnsutil.ID]*Namespace{}, dnsPorts: map[uint16]uint64{}}, nil
}

// NetnsOf tells the cookie of the namespace whose DNS listener received a
// query at local; 0 for the agent's own listeners.
func (m *Manager) NetnsOf(local netip.AddrPort) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.dnsPorts[local.Port()]
}

// Spaces lists the namespaces with listeners.
func (m *Manager) Spaces() []Namespace {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []Namespace
	for _, ns := range m.spaces {
		out = append(out, Namespace{ID: ns.ID, Cookie: ns.Cookie, Ports: ns.Ports})
	}
	return out
}

// Ensure opens listeners in the network namespace of the nsfs file at
// path (/proc/PID/ns/net) unless they are open already or it is the
// agent's own. It returns the namespace's id.
func (m *Manager) Ensure(path string) (netnsutil.ID, error) {
	id, err := netnsutil.Of(path)
	if err != nil {
		return id, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return id, errors.New("nslisten: closed")
	}
	if id == m.home || m.spaces[id] != nil {
		return id, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return id, fmt.Errorf("nslisten: %w", err)
	}
	// The file may name a namespace that replaced the one stat saw (the
	// task exec'd into another): judge by the file itself.
	if got, err := netnsutil.Of(fmt.Sprintf("/proc/self/fd/%d", f.Fd())); err != nil || got != id {
		f.Close()
		return id, fmt.Errorf("nslisten: %s changed namespace", path)
	}
	ns, partial, err := m.open(f, id)
	if err != nil {
		f.Close()
		return id, err
	}
	m.spaces[id] = ns
	if m.cfg.OnChange != nil {
		m.cfg.OnChange(Change{Opened: true, ID: id, Cookie: ns.Cookie, Ports: ns.Ports, Err: partial})
	}
	return id, nil
}

// open binds the listeners in the namespace of f and records them in the
// kernel. partial is why some family has no listener.
func (m *Manager) open(f *os.File, id netnsutil.ID) (ns *Namespace, partial, err error) {
	ns = &Namespace{ID: id, file: f}
	var dnsSocks []dnsSock
	var relayLns []net.Listener
	var errs []error
	err = netnsutil.DoFile(f, func() error {
		c, err := netnsutil.Cookie()
		if err != nil {
			return err
		}
		ns.Cookie = c
		if m.cfg.DNS != nil {
			for _, ap := range []netip.AddrPort{m.cfg.DNS4, m.cfg.DNS6} {
				if !ap.IsValid() {
					continue
				}
				s, err := bindDNS(ap.Addr(), m.portTaken)
				if err != nil {
					errs = append(errs, err)
					continue
				}
				dnsSocks = append(dnsSocks, s)
			}
		}
		if m.cfg.Relay != nil {
			for _, ap := range m.cfg.RelayAddrs {
				ln, err := net.Listen("tcp", netip.AddrPortFrom(ap.Addr(), 0).String())
				if err != nil {
					errs = append(errs, fmt.Errorf("relay listener %s: %w", ap.Addr(), err))
					continue
				}
				relayLns = append(relayLns, ln)
			}
		}
		return nil
	})
	closeAll := func() {
		for _, s := range dnsSocks {
			s.close()
		}
		for _, ln := range relayLns {
			ln.Close()
		}
	}
	if err != nil {
		closeAll()
		return nil, nil, fmt.Errorf("nslisten: %s: %w", id, err)
	}
	if ns.Cookie == m.cfg.Kernel.HomeNetns() {
		closeAll()
		return nil, nil, fmt.Errorf("nslisten: %s has the agent's netns cookie", id)
	}
	if len(dnsSocks) == 0 && len(relayLns) == 0 {
		// Nothing bound (no loopback up): not kept, so the next sweep
		// tries again.
		return nil, nil, fmt.Errorf("nslisten: %s: no listener: %w", id, errors.Join(errs...))
	}
	for _, s := range dnsSocks {
		if s.port() == 0 {
			continue
		}
		if s.addr.Is4() {
			ns.Ports.DNS4 = s.port()
		} else {
			ns.Ports.DNS6 = s.port()
		}
	}
	for _, ln := range relayLns {
		ap := ln.Addr().(*net.TCPAddr).AddrPort()
		if ap.Addr().Unmap().Is4() {
			ns.Ports.Relay4 = ap.Port()
		} else {
			ns.Ports.Relay6 = ap.Port()
		}
	}
	if len(dnsSocks) > 0 {
		ns.dns = serveDNS(m.cfg.DNS, dnsSocks)
		for _, s := range dnsSocks {
			m.dnsPorts[s.port()] = ns.Cookie
		}
	}
	if len(relayLns) > 0 {
		dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
			var c net.Conn
			err := netnsutil.DoFile(f, func() error {
				var err error
				var d net.Dialer
				c, err = d.DialContext(ctx, network, addr)
				return err
			})
			return c, err
		}
		if err := m.cfg.Relay.ServeNetns(ns.Cookie, relayLns, dial); err != nil {
			errs = append(errs, err)
			for _, ln := range relayLns {
				ln.Close()
			}
			ns.Ports.Relay4, ns.Ports.Relay6 = 0, 0
		} else {
			ns.relay = true
		}
	}
	if err := m.cfg.Kernel.SetNetns(ns.Cookie, ns.Ports); err != nil {
		m.shut(ns)
		return nil, nil, fmt.Errorf("nslisten: %s: %w", id, err)
	}
	return ns, errors.Join(errs...), nil
}

// portTaken: a DNS port already used by the agent's own proxy or by
// another namespace's listener (the port tells the namespace). Called with
// m.mu held.
func (m *Manager) portTaken(p uint16) bool {
	if p == m.cfg.DNS4.Port() || p == m.cfg.DNS6.Port() {
		return true
	}
	_, ok := m.dnsPorts[p]
	return ok
}

// shut closes a namespace's listeners (the kernel entry first, so no new
// query is sent to a socket about to close). Called with m.mu held.
func (m *Manager) shut(ns *Namespace) error {
	err := m.cfg.Kernel.ClearNetns(ns.Cookie)
	if ns.dns != nil {
		ns.dns.close()
		for p, c := range m.dnsPorts {
			if c == ns.Cookie {
				delete(m.dnsPorts, p)
			}
		}
	}
	if ns.relay {
		m.cfg.Relay.CloseNetns(ns.Cookie)
	}
	ns.file.Close()
	return err
}

// Keep closes the listeners of every namespace not in live (the
// namespaces sandbox tasks are in now); the kernel then refuses DNS from
// them again, and nothing of the agent's holds them alive.
func (m *Manager) Keep(live []netnsutil.ID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for id, ns := range m.spaces {
		if slices.Contains(live, id) {
			continue
		}
		err := m.shut(ns)
		delete(m.spaces, id)
		if m.cfg.OnChange != nil {
			m.cfg.OnChange(Change{ID: id, Cookie: ns.Cookie, Ports: ns.Ports, Err: err})
		}
	}
}

// Sweep opens listeners in the namespaces of the given tasks and closes
// those of namespaces none of them is in. Tasks that exited meanwhile are
// skipped; errors opening a namespace are returned joined (the others are
// still served).
func (m *Manager) Sweep(pids []int) error {
	var live []netnsutil.ID
	var errs []error
	seen := map[netnsutil.ID]bool{}
	for _, pid := range pids {
		path := netnsutil.TaskPath(pid)
		id, err := netnsutil.Of(path)
		if err != nil {
			continue // exited
		}
		if seen[id] {
			continue
		}
		seen[id] = true
		live = append(live, id)
		if _, err := m.Ensure(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	m.Keep(live)
	return errors.Join(errs...)
}

// Close closes every listener.
func (m *Manager) Close() error {
	m.Keep(nil)
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
	return nil
}
