package plan

// Sockets on the LSM layer: the families and netlink protocols watcher
// exec's seccomp filter refuses (socket_create sees every family, from
// every entry), and unix peers judged on the socket the kernel found.

import (
	"fmt"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/enforce/rules"
	"github.com/watcherhq/watcher/internal/enforce/rules/backstoprules"
	"github.com/watcherhq/watcher/internal/enforce/rules/lsmrules"
	"github.com/watcherhq/watcher/internal/launch"
	"github.com/watcherhq/watcher/internal/policy"
)

// lsmSockets gives the kernel-hook path watcher exec's socket refusals
// (one list: launch.DefaultSeccomp's families and netlink protocols) where
// lsm socket_create runs, and judges unix peers on the socket the kernel
// found where the lsm unix hooks run and the sandbox's egress restricts
// unix sockets. Record mode is the sandbox flag's business.
func (c *compiler) lsmSockets(sb *policy.Sandbox, sid uint32, lr *lsmrules.Rules) {
	if c.hook("socket_create") {
		id := c.rules.ID("socket-families")
		def := launch.DefaultSeccomp()
		var what []string
		for _, f := range def.DeniedSocketFamilies {
			if f == unix.AF_PACKET {
				continue // raw_sockets decides it (rawSockets)
			}
			lr.Sockets = append(lr.Sockets, lsmrules.SocketRule{Family: f, Type: lsmrules.AnySocket, Protocol: lsmrules.AnySocket,
				Decision: lsmrules.Decision{Action: rules.ActionBlock, RuleID: id}})
			what = append(what, fmt.Sprintf("family %d", f))
		}
		for _, p := range def.DeniedNetlinkProtocols {
			lr.Sockets = append(lr.Sockets, lsmrules.SocketRule{Family: unix.AF_NETLINK, Type: lsmrules.AnySocket, Protocol: p,
				Decision: lsmrules.Decision{Action: rules.ActionBlock, RuleID: id}})
		}
		what = append(what, fmt.Sprintf("%d netlink protocols (all but route and sock_diag)", len(def.DeniedNetlinkProtocols)))
		c.add(sb, "socket families", policy.ActionBlock, layer{mech: MechLSM, notes: []string{
			"lsm socket_create, from every entry: " + strings.Join(what, ", "), "watcher exec: seccomp refuses the same list"}})
	}
	cfg := c.plan.Egress[sid]
	if !cfg.RestrictUnix {
		return
	}
	if !c.hook("unix_stream_connect") || !c.hook("unix_may_send") {
		c.backstopUnixPeers(sb, sid, cfg.UnixPaths)
		return
	}
	lr.Ops[lsmrules.OpUnixConnect] = lsmrules.Decision{Action: rules.ActionBlock, RuleID: c.rules.ID("unix-sockets")}
	lr.UnixPaths = slices.Clone(cfg.UnixPaths)
	c.add(sb, "egress: unix peers", policy.ActionBlock, layer{mech: MechLSM, notes: []string{
		fmt.Sprintf("lsm unix_stream_connect and unix_may_send: the peer the kernel found must be bound in one of %d workspace and egress.unix paths (symlinks resolved); abstract peers refused", len(cfg.UnixPaths))}})
}

// backstopUnixPeers judges unix peers after the fact where no LSM unix hook
// runs: the cgroup hooks see the path as passed, so a symlink in the
// workspace to a host socket passes them; the backstop checks the socket
// connect(2) reached and kills the process before it returns.
func (c *compiler) backstopUnixPeers(sb *policy.Sandbox, sid uint32, paths []string) {
	id := c.rules.ID("unix-peers")
	c.bsCategory(func(r *backstoprules.SandboxRules) *backstoprules.Rule { return &r.UnixPeer }, rules.ActionKill, id)
	c.plan.Backstop.UnixPaths = append(c.plan.Backstop.UnixPaths, backstoprules.UnixPaths{SandboxID: sid, Paths: slices.Clone(paths), Rule: id})
	c.add(sb, "egress: unix peers", policy.ActionKill, layer{mech: MechKill, notes: []string{
		fmt.Sprintf("backstop at connect(2)'s return: the peer the kernel found must be bound in one of %d workspace and egress.unix paths (symlinks resolved), else the process is killed before it returns", len(paths)),
		"after the fact: the connection exists for that moment, so another thread of the process could write to it first; datagrams sent by name (sendto) are delivered unjudged"}})
}
