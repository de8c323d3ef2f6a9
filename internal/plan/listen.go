package plan

// Inbound servers (policy listen): the cgroup bind hooks refuse binds to
// non-loopback addresses on unlisted ports; listeners the kernel binds by
// itself are kept from other hosts' connections.

import (
	"fmt"
	"strings"

	"github.com/watcherhq/watcher/internal/enforce/rules/cgrouprules"
	"github.com/watcherhq/watcher/internal/policy"
)

const listenRule = "listen: inbound ports"

func (c *compiler) listen(sb *policy.Sandbox, sid uint32) error {
	l := sb.Listen
	action := l.Action
	if action == "" {
		action = policy.ActionBlock
	}
	ports := "no ports"
	if len(l.Ports) > 0 {
		var s []string
		for _, p := range l.Ports {
			s = append(s, string(p))
		}
		ports = "ports " + strings.Join(s, ", ")
	}
	if action == policy.ActionAllow {
		c.add(sb, listenRule, action, layer{mech: MechCgroupBPF, notes: []string{"any address and port"}})
		return nil
	}
	if !c.cgroupOK {
		c.add(sb, listenRule, action, layer{mech: MechNone, notes: []string{"cgroup BPF unavailable: " + c.env.CgroupBPF.Error()}})
		return nil
	}
	rule := cgrouprules.ListenRule{Sandbox: sid, Action: kernelAction(action), RuleID: c.rules.ID("listen-ports")}
	for _, p := range l.Ports {
		lo, hi, err := p.Bounds()
		if err != nil {
			return fmt.Errorf("listen: %w", err)
		}
		rule.Ports = append(rule.Ports, cgrouprules.PortRange{Lo: lo, Hi: hi})
	}
	if len(rule.Ports) > cgrouprules.MaxListenRanges {
		return fmt.Errorf("listen: %d port entries, at most %d fit", len(rule.Ports), cgrouprules.MaxListenRanges)
	}
	c.plan.Listen = append(c.plan.Listen, rule)
	c.add(sb, listenRule, action, layer{mech: MechCgroupBPF, notes: []string{
		"cgroup/bind4 and bind6, EPERM before the bind: non-loopback addresses (0.0.0.0, ::, v4-mapped included) only on " + ports +
			"; loopback on any port; TCP and UDP; port 0 and UDP autobind (clients) pass",
		"a bind onto an address and port a socket outside the sandbox listens or is bound on is refused (SO_REUSEPORT takeover of host services)",
		"listen(2) on an unbound socket (kernel autobind, no bind hook; TCP and MPTCP): not refused, recorded by sockops after the fact; cgroup_skb ingress drops every packet from another host to it, so it never gets a connection from outside (loopback clients still connect)",
		"judged on sockets created in the sandbox: a socket passed in from outside (SCM_RIGHTS, inherited) is not judged"}})
	return nil
}
