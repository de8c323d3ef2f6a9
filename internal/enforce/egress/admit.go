package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/cilium/ebpf"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/rules/cgrouprules"
	"github.com/watcherhq/watcher/internal/enforce/rules/egressrules"
	"github.com/watcherhq/watcher/internal/textesc"
)

// Admissions: an allowed DNS answer admits its addresses to the sandbox's
// egress_admit entry, each for the port spans the policy allows for the
// name answered and with its own expiry, so one address answered for two
// names (a CDN's) is open for the union while each lasts. The kernel
// judges connect() and each unconnected datagram only: an established
// connection outlives its admission.

// MaxAdmitSpans is how many port spans one address can carry (struct
// admit_val in bpf/egress.c); beyond it the earliest-expiring span goes.
const MaxAdmitSpans = 8

// maxAdmitNames bounds the names remembered per address (for Revoke);
// beyond it the oldest is forgotten.
const maxAdmitNames = 8

// admission is the Go mirror of one egress_admit entry.
type admission struct {
	val   egressAdmitVal
	names []string // names whose answers admitted it, "" for Allow
}

// expires is the latest expiry of the admission's spans.
func (a *admission) expires() uint64 {
	var m uint64
	for i := range min(int(a.val.N), MaxAdmitSpans) {
		m = max(m, a.val.S[i].ExpiresNs)
	}
	return m
}

// merge opens span until exp: the same span's expiry is extended, a new
// one takes a free slot, else the earliest-expiring one's.
func (a *admission) merge(lo, hi uint16, protos uint32, exp uint64) bool {
	n := min(int(a.val.N), MaxAdmitSpans)
	for i := range n {
		s := &a.val.S[i]
		if s.Lo == lo && s.Hi == hi && s.Protos == protos {
			if s.ExpiresNs >= exp {
				return false
			}
			s.ExpiresNs = exp
			return true
		}
	}
	slot := n
	if n == MaxAdmitSpans {
		slot = 0
		for i := range n {
			if a.val.S[i].ExpiresNs < a.val.S[slot].ExpiresNs {
				slot = i
			}
		}
	} else {
		a.val.N++
	}
	a.val.S[slot] = egressAdmitSpan{ExpiresNs: exp, Lo: lo, Hi: hi, Protos: protos}
	return true
}

func (a *admission) addName(name string) {
	if slices.Contains(a.names, name) {
		return
	}
	if len(a.names) >= maxAdmitNames {
		a.names = a.names[1:]
	}
	a.names = append(a.names, name)
}

// Allow lets sandbox id reach addrs on every port and protocol until ttl
// plus the grace period from now (tests, and callers that scope nothing).
func (e *Egress) Allow(id uint32, addrs []netip.Addr, ttl time.Duration) error {
	return e.Admit(id, addrs, ttl, "", egressrules.AllPorts)
}

// Admit lets sandbox id reach addrs, answered for name, on ports until ttl
// plus the grace period from now: the proxy's hook calls it after an
// allowed answer, with the TTL already capped by the policy. When the
// sandbox's share is full, expired entries go first, then the
// earliest-expiring ones; each eviction of a live entry is counted and
// reported, and the evicted address is refused again until resolved anew.
func (e *Egress) Admit(id uint32, addrs []netip.Addr, ttl time.Duration, name string, ports []egressrules.PortSpan) error {
	if id == 0 {
		return errors.New("admit: sandbox id must be > 0")
	}
	if len(ports) == 0 {
		return nil // nothing to open
	}
	if len(ports) > MaxAdmitSpans {
		return fmt.Errorf("admit %s for sandbox %d: %d port spans, at most %d per address", name, id, len(ports), MaxAdmitSpans)
	}
	for _, p := range ports {
		if p.Lo > p.Hi {
			return fmt.Errorf("admit: port span %d-%d is empty", p.Lo, p.Hi)
		}
	}
	ttl = max(ttl, 0)
	expires := bootNanos() + uint64(ttl+e.opts.Grace)
	e.mu.Lock()
	defer e.mu.Unlock()
	st := e.state(id)
	var evicted []netip.Addr
	for _, a := range addrs {
		if !a.IsValid() {
			continue
		}
		a = a.Unmap()
		adm, ok := st.allowed[a]
		if !ok {
			for len(st.allowed) >= e.opts.MaxAddresses || e.total >= MaxAllowEntries {
				victim, live, ok := e.evictLocked(id, st)
				if !ok {
					return fmt.Errorf("admit %s for sandbox %d: answered-address map full", a, id)
				}
				if live {
					evicted = append(evicted, victim)
				}
			}
			adm = &admission{}
		}
		changed := !ok
		for _, p := range ports {
			lo, hi := p.Lo, p.Hi
			if lo == 0 && hi == 0 {
				hi = 65535
			}
			changed = adm.merge(lo, hi, protoBits(p.Protocol), expires) || changed
		}
		adm.addName(name)
		if changed {
			k := egressAllowKey{SandboxId: id, Addr: addrToWords(a)}
			if err := e.objs.EgressAdmit.Put(k, adm.val); err != nil {
				return fmt.Errorf("admit %s for sandbox %d: %w", a, id, err)
			}
		}
		if !ok {
			st.allowed[a] = adm
			e.total++
		}
	}
	if len(evicted) > 0 {
		st.overflow += uint64(len(evicted))
		e.reportOverflow(id, evicted)
	}
	return nil
}

// Revoke drops sandbox id's admissions none of whose names keep accepts
// (a reload that drops a name drops what its answers admitted), and
// returns how many it dropped. Admissions made by Allow are kept.
func (e *Egress) Revoke(id uint32, keep func(name string) bool) (int, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	st := e.sandboxes[id]
	if st == nil {
		return 0, nil
	}
	n := 0
	for a, adm := range st.allowed {
		if slices.ContainsFunc(adm.names, func(name string) bool { return name == "" || keep(name) }) {
			continue
		}
		if err := e.deleteLocked(id, st, a); err != nil {
			return n, fmt.Errorf("revoke %s for sandbox %d: %w", a, id, err)
		}
		n++
	}
	return n, nil
}

func (e *Egress) deleteLocked(id uint32, st *sandboxState, a netip.Addr) error {
	k := egressAllowKey{SandboxId: id, Addr: addrToWords(a)}
	if err := e.objs.EgressAdmit.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return err
	}
	delete(st.allowed, a)
	e.total--
	return nil
}

// evictLocked removes the sandbox's earliest-expiring entry. live says
// whether it had not expired yet.
func (e *Egress) evictLocked(id uint32, st *sandboxState) (netip.Addr, bool, bool) {
	var victim netip.Addr
	var least uint64
	for a, adm := range st.allowed {
		if exp := adm.expires(); !victim.IsValid() || exp < least {
			victim, least = a, exp
		}
	}
	if !victim.IsValid() {
		return victim, false, false
	}
	if err := e.deleteLocked(id, st, victim); err != nil {
		return victim, false, false
	}
	return victim, least > bootNanos(), true
}

func (e *Egress) reportOverflow(id uint32, evicted []netip.Addr) {
	if e.opts.Notify == nil {
		return
	}
	first := evicted[0]
	e.opts.Notify(audit.Event{
		Time: time.Now(), Kind: audit.KindNet, Verdict: audit.VerdictRecorded,
		Severity: audit.SeverityAlert, Mechanism: cgrouprules.Mechanism,
		Net: &audit.NetDetail{
			Op: "allowlist", Addr: first.String(),
			Reason: fmt.Sprintf("answered-address allowlist of sandbox %d full: %d unexpired address(es) evicted, earliest expiry first; they are refused until resolved again", id, len(evicted)),
		},
		Message: fmt.Sprintf("sandbox_id=%d", id),
	})
}

// Expire deletes answered addresses all of whose spans have expired (the
// kernel already refuses them; this frees their slots). It returns how
// many it removed.
func (e *Egress) Expire() (int, error) {
	now := bootNanos()
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for id, st := range e.sandboxes {
		for a, adm := range st.allowed {
			if adm.expires() > now {
				continue
			}
			if err := e.deleteLocked(id, st, a); err != nil {
				return n, fmt.Errorf("expire %s: %w", a, err)
			}
			n++
		}
	}
	return n, nil
}

// Allowed lists sandbox id's answered addresses with their latest expiry.
func (e *Egress) Allowed(id uint32) map[netip.Addr]time.Time {
	now := bootNanos()
	wall := time.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	out := map[netip.Addr]time.Time{}
	if st := e.sandboxes[id]; st != nil {
		for a, adm := range st.allowed {
			out[a] = wall.Add(time.Duration(int64(adm.expires()) - int64(now)))
		}
	}
	return out
}

// AdmittedSpan is one span of an admission as the kernel holds it.
type AdmittedSpan struct {
	egressrules.PortSpan
	// Expires is when the span closes (wall clock, from CLOCK_BOOTTIME).
	Expires time.Time
}

// Admitted reads sandbox id's admission of addr from the kernel map.
func (e *Egress) Admitted(id uint32, addr netip.Addr) ([]AdmittedSpan, error) {
	var v egressAdmitVal
	k := egressAllowKey{SandboxId: id, Addr: addrToWords(addr.Unmap())}
	if err := e.objs.EgressAdmit.Lookup(k, &v); err != nil {
		return nil, fmt.Errorf("admission of %s for sandbox %d: %w", addr, id, err)
	}
	now, wall := bootNanos(), time.Now()
	var out []AdmittedSpan
	for i := range min(int(v.N), MaxAdmitSpans) {
		s := v.S[i]
		p := egressrules.ProtoAny
		switch s.Protos {
		case protoBitTCP:
			p = egressrules.ProtoTCP
		case protoBitUDP:
			p = egressrules.ProtoUDP
		}
		out = append(out, AdmittedSpan{PortSpan: egressrules.PortSpan{Lo: s.Lo, Hi: s.Hi, Protocol: p},
			Expires: wall.Add(time.Duration(int64(s.ExpiresNs) - int64(now)))})
	}
	return out, nil
}

// RegisterEvents registers the decoder of the egress programs' events, as
// Register does, and completes a refusal for a port (ReasonPort): its
// message names what the address was admitted for ("admitted for
// <names> on tcp/80, tcp/443"), so the refusal says which name needs an
// egress.name_ports entry. A refusal for a namespace without listeners
// (ReasonNetns) calls the OnNetnsRefused hook.
func (e *Egress) RegisterEvents(r *enforce.Reader) {
	r.Register(enforce.EvNet, audit.KindNet, cgrouprules.Mechanism, func(raw []byte, ev *audit.Event) error {
		if err := decodeNet(raw, ev); err != nil {
			return err
		}
		if ev.Net != nil && ev.Net.Reason == reasons[ReasonPort] {
			ev.Message = e.describe(ev.Sandbox.ID, ev.Net.Addr)
		}
		if ev.Net != nil && ev.Net.Reason == reasons[ReasonNetns] {
			e.netnsRefused()
		}
		return nil
	})
}

// AdmittedPrefix starts the message of a refusal for a port; the names
// follow, comma-separated, then " on " and the spans.
const AdmittedPrefix = "admitted for "

// describe says what sandbox id's admission of addr opens.
func (e *Egress) describe(id uint32, addr string) string {
	a, err := netip.ParseAddr(addr)
	if err != nil {
		return ""
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	st := e.sandboxes[id]
	if st == nil || st.allowed[a.Unmap()] == nil {
		return ""
	}
	adm := st.allowed[a.Unmap()]
	var names, spans []string
	for _, n := range adm.names {
		if n != "" {
			names = append(names, textesc.String(strings.TrimSuffix(n, ".")))
		}
	}
	if len(names) == 0 {
		names = []string{"(unknown)"}
	}
	now := bootNanos()
	for i := range min(int(adm.val.N), MaxAdmitSpans) {
		s := adm.val.S[i]
		if s.ExpiresNs <= now {
			continue
		}
		proto := map[uint32]string{protoBitTCP: "tcp", protoBitUDP: "udp"}[s.Protos]
		if proto == "" {
			proto = "any"
		}
		if s.Lo == s.Hi {
			spans = append(spans, fmt.Sprintf("%s/%d", proto, s.Lo))
		} else {
			spans = append(spans, fmt.Sprintf("%s/%d-%d", proto, s.Lo, s.Hi))
		}
	}
	return AdmittedPrefix + strings.Join(names, ", ") + " on " + strings.Join(spans, ", ")
}
