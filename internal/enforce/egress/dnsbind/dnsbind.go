// Package dnsbind connects the DNS proxy (internal/dnsproxy) to the kernel
// egress hooks (internal/enforce/egress): the proxy learns which sandbox sent a
// query from the kernel's record of the client socket, and every allowed
// answer's addresses are admitted to that sandbox's connect allowlist
// before the answer is sent.
package dnsbind

import (
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/watcherhq/watcher/internal/dnsproxy"
	"github.com/watcherhq/watcher/internal/enforce/egress"
	"github.com/watcherhq/watcher/internal/enforce/rules/egressrules"
)

// Directory maps sandbox names (the proxy's policy keys) to sandbox ids
// (the kernel's). Safe for concurrent use.
type Directory struct {
	mu     sync.RWMutex
	byName map[string]uint32
	byID   map[uint32]string
}

// NewDirectory returns an empty directory.
func NewDirectory() *Directory {
	return &Directory{byName: map[string]uint32{}, byID: map[uint32]string{}}
}

// Set maps name to id (and back), replacing earlier mappings of either.
func (d *Directory) Set(name string, id uint32) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if old, ok := d.byName[name]; ok {
		delete(d.byID, old)
	}
	if old, ok := d.byID[id]; ok {
		delete(d.byName, old)
	}
	d.byName[name] = id
	d.byID[id] = name
}

// Delete removes name.
func (d *Directory) Delete(name string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if id, ok := d.byName[name]; ok {
		delete(d.byID, id)
	}
	delete(d.byName, name)
}

// ID returns the sandbox id of name.
func (d *Directory) ID(name string) (uint32, bool) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	id, ok := d.byName[name]
	return id, ok
}

// Name returns the sandbox name of id.
func (d *Directory) Name(id uint32) (string, bool) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	n, ok := d.byID[id]
	return n, ok
}

// Resolver is a dnsproxy.SandboxResolver backed by the kernel's record of
// DNS client sockets (egress.LookupClient).
type Resolver struct {
	Egress    *egress.Egress
	Directory *Directory
	// Netns, when set, tells the netns cookie of the listener that
	// received a query at local (nslisten.Manager.NetnsOf): 0 for the
	// agent's own. Source ports are per namespace.
	Netns func(local netip.AddrPort) uint64
}

// Sandbox names the sandbox that sent the query from src.
func (r Resolver) Sandbox(src dnsproxy.QuerySource) (string, bool) {
	var c egress.Client
	var ok bool
	if ns := r.netns(src.Local); ns != 0 {
		c, ok = r.Egress.LookupClientIn(ns, src.Proto, src.Remote)
	} else {
		c, ok = r.Egress.LookupClient(src.Proto, src.Remote)
	}
	if !ok {
		return "", false
	}
	return r.Directory.Name(c.SandboxID)
}

// Admitter feeds allowed answers to the egress allowlist.
type Admitter struct {
	Egress    *egress.Egress
	Directory *Directory
	// Scopes, when set, returns the admission scope of a sandbox; nil (or
	// a nil scope) means the defaults: TCP 80 and 443, TTL capped at
	// egress.DefaultAdmissionCap.
	Scopes func(sandbox string) *egressrules.Scope
	// Errors counts answers whose addresses could not be admitted (unknown
	// sandbox, map full): the client's connection is then refused, never
	// silently allowed.
	Errors atomic.Uint64
	// LastError is the most recent such error.
	LastError atomic.Pointer[error]
}

// OnAnswer is the proxy's dnsproxy.Config.OnAnswer hook.
func (a *Admitter) OnAnswer(ans dnsproxy.Answer) {
	id, ok := a.Directory.ID(ans.Sandbox)
	if !ok {
		a.Errors.Add(1)
		return
	}
	var scope *egressrules.Scope
	if a.Scopes != nil {
		scope = a.Scopes(ans.Sandbox)
	}
	if err := Admit(a.Egress, id, ans, scope); err != nil {
		a.Errors.Add(1)
		a.LastError.Store(&err)
	}
}

// Admit lets sandbox id reach the public addresses of an allowed answer
// for its TTL, capped by the scope (plus the egress grace), on the ports
// the scope opens for the name. Local addresses (loopback, private,
// link-local, cloud metadata: dnsproxy.LocalKind) are never admitted, even
// when the proxy answered them under an explicit local allowance: the
// policy's own egress rules (egress.allow, loopback services) decide those
// connections, port by port, and an answer must not widen them.
func Admit(e *egress.Egress, id uint32, ans dnsproxy.Answer, scope *egressrules.Scope) error {
	addrs := ans.Addrs
	for i, a := range ans.Addrs {
		if dnsproxy.LocalKind(a) == "" {
			continue
		}
		// Copy on the first local address only: the common answer has none.
		addrs = append([]netip.Addr(nil), ans.Addrs[:i]...)
		for _, b := range ans.Addrs[i+1:] {
			if dnsproxy.LocalKind(b) == "" {
				addrs = append(addrs, b)
			}
		}
		break
	}
	if len(addrs) == 0 {
		return nil
	}
	ttl := scope.TTL(time.Duration(ans.TTL) * time.Second)
	return e.Admit(id, addrs, ttl, ans.Name, scope.Spans(ans.Name))
}

func (r Resolver) netns(local netip.AddrPort) uint64 {
	if r.Netns == nil {
		return 0
	}
	return r.Netns(local)
}
