package agent

// Sandboxes in their own network namespace: the DNS proxy's (and the name
// relay's) listeners opened inside each namespace sandbox tasks live in
// (internal/nslisten), found at start, every netnsSweep, and at once after
// the kernel refused a query from a namespace without listeners.

import (
	"fmt"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/nslisten"
)

// RuleNetnsListeners marks the records of listeners opened or closed in a
// sandbox's network namespace (the command logs them at debug level).
const RuleNetnsListeners = "netns_listeners"

// netnsSweep is how often the sandboxes' namespaces are read again: a
// namespace's listeners close this long after its last task at most.
const netnsSweep = 2 * time.Second

type netnsState struct {
	mgr     atomic.Pointer[nslisten.Manager]
	kick    chan struct{}
	lastErr string
}

// startNetns starts the manager (after the proxy and the relay). Entries
// a previous agent left in the kernel map name listeners that died with
// it: they are cleared, so those namespaces are refused (and learnt
// again) rather than sent to a closed port.
func (a *Agent) startNetns() {
	eg := a.egress.Egress
	if eg == nil || a.dns == nil || eg.HomeNetns() == 0 {
		return
	}
	if stale, err := eg.Netns(); err == nil {
		for _, c := range stale {
			eg.ClearNetns(c)
		}
	}
	cfg := nslisten.Config{Kernel: eg, DNS: a.dns.HandlePacket, DNS4: a.dnsAddr, DNS6: a.dnsAddr6, OnChange: a.netnsChanged}
	a.netnsRelay(&cfg)
	m, err := nslisten.New(cfg)
	if err != nil {
		a.emit(audit.Event{Kind: audit.KindAgent, Verdict: audit.VerdictRecorded, Severity: audit.SeverityAlert,
			Message: fmt.Sprintf("no listeners in sandboxes' own network namespaces (%v): their DNS is refused", err)})
		return
	}
	a.netns.kick = make(chan struct{}, 1)
	a.netns.mgr.Store(m)
	eg.OnNetnsRefused(a.kickNetns)
	a.sweepNetns()
}

// kickNetns asks for a sweep now (the kernel refused a namespace without
// listeners); it never blocks the event reader.
func (a *Agent) kickNetns() {
	select {
	case a.netns.kick <- struct{}{}:
	default:
	}
}

// netnsOf is dnsbind.Resolver.Netns.
func (a *Agent) netnsOf(local netip.AddrPort) uint64 {
	if m := a.netns.mgr.Load(); m != nil {
		return m.NetnsOf(local)
	}
	return 0
}

// sweepNetns opens listeners in the namespaces of the sandboxes' tasks and
// closes those of namespaces none is left in.
func (a *Agent) sweepNetns() {
	m := a.netns.mgr.Load()
	if m == nil {
		return
	}
	a.mu.Lock()
	paths := make([]string, 0, len(a.roots))
	for _, r := range a.roots {
		paths = append(paths, r.path)
	}
	a.mu.Unlock()
	var pids []int
	for _, p := range paths {
		if got, err := nslisten.CgroupTasks(p); err == nil {
			pids = append(pids, got...)
		}
	}
	err := m.Sweep(pids)
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	if msg != "" && msg != a.netns.lastErr {
		a.emit(audit.Event{Kind: audit.KindAgent, Verdict: audit.VerdictRecorded, Severity: audit.SeverityAlert,
			Rule: RuleNetnsListeners, Message: "listeners in a sandbox's network namespace: " + msg})
	}
	a.netns.lastErr = msg
}

// closeNetns closes every namespace's listeners (agent stop).
func (a *Agent) closeNetns() {
	if m := a.netns.mgr.Swap(nil); m != nil {
		m.Close()
	}
}

func (a *Agent) netnsChanged(c nslisten.Change) {
	msg := fmt.Sprintf("listeners closed in network namespace %s (cookie %d): no sandbox task left there", c.ID, c.Cookie)
	if c.Opened {
		msg = fmt.Sprintf("listeners opened in network namespace %s (cookie %d): dns udp+tcp/%d, %d; relay %d, %d",
			c.ID, c.Cookie, c.Ports.DNS4, c.Ports.DNS6, c.Ports.Relay4, c.Ports.Relay6)
	}
	if c.Err != nil {
		msg += " (" + c.Err.Error() + ")"
	}
	a.emit(audit.Event{Kind: audit.KindAgent, Verdict: audit.VerdictRecorded, Severity: audit.SeverityRoutine,
		Rule: RuleNetnsListeners, Message: msg})
}

// netnsRelay adds the name relay's listeners, when the relay serves other
// namespaces.
func (a *Agent) netnsRelay(cfg *nslisten.Config) {
	if a.relay == nil {
		return
	}
	a.relay.SetNetnsLookup(a.relayLookupIn)
	cfg.Relay = a.relay
	cfg.RelayAddrs = a.relay.Addrs()
}
