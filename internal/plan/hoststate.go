package plan

// Host-wide state (issue 25 §3): the clock, host and domain names,
// namespaces, quotas, the kernel log and network configuration, decided
// by the sandbox's capability rules. The capable hook refuses them where it
// runs (capabilities); where it does not, the kill backstop kills the
// entries of dangerous.HostState whose capability the sandbox refuses.

import (
	"sort"
	"strings"

	"github.com/watcherhq/watcher/internal/dangerous"
	"github.com/watcherhq/watcher/internal/enforce/rules/backstoprules"
	"github.com/watcherhq/watcher/internal/policy"
)

// hostStateCategory selects the backstop category of an argument check.
var hostStateCategory = map[dangerous.Check]func(*backstoprules.SandboxRules) *backstoprules.Rule{
	dangerous.CheckClockModes:     func(r *backstoprules.SandboxRules) *backstoprules.Rule { return &r.ClockAdjust },
	dangerous.CheckNamespaces:     func(r *backstoprules.SandboxRules) *backstoprules.Rule { return &r.Namespaces },
	dangerous.CheckSyslogAction:   func(r *backstoprules.SandboxRules) *backstoprules.Rule { return &r.Syslog },
	dangerous.CheckQuotaCmd:       func(r *backstoprules.SandboxRules) *backstoprules.Rule { return &r.Quota },
	dangerous.CheckNetConfigIoctl: func(r *backstoprules.SandboxRules) *backstoprules.Rule { return &r.NetConfig },
}

// hostStateNote says which calls of an entry the backstop kills.
var hostStateNote = map[dangerous.Check]string{
	dangerous.CheckAll:            " (every call)",
	dangerous.CheckClockModes:     " with modes set (read from user memory at entry: another thread may set them after the check)",
	dangerous.CheckNamespaces:     " (setns to a namespace it is not in, or by a pidfd outside its subtree; unshare and clone with CLONE_NEW* other than NEWUSER; clone3's flags are in user memory and not judged)",
	dangerous.CheckSyslogAction:   " (clear, console on/off/level; reads allowed)",
	dangerous.CheckQuotaCmd:       " (every command but Q_SYNC and the gets)",
	dangerous.CheckNetConfigIoctl: " SIOCS*, SIOCADDRT/DELRT, ARP, bridge, bond, VLAN and wireless set requests (reads such as SIOCGIFCONF allowed; SIOCETHTOOL not judged)",
}

func (c *compiler) hostState(sb *policy.Sandbox) {
	byCap := map[int][]dangerous.HostOp{}
	for _, o := range dangerous.HostState {
		byCap[o.Cap] = append(byCap[o.Cap], o)
	}
	caps := make([]int, 0, len(byCap))
	for n := range byCap {
		caps = append(caps, n)
	}
	sort.Ints(caps)
	for _, n := range caps {
		a := orAllow(sb.CapabilityAction(n))
		name := policy.CapabilityName(n)
		rule := "host state (" + name + ")"
		if a == policy.ActionAllow {
			c.add(sb, rule, a, layer{mech: MechNone, notes: []string{name + " granted"}})
			continue
		}
		id := c.rules.ID("cap:" + name)
		if c.hook("capable") {
			// lr.Caps (capabilities) already refuses the capability.
			c.add(sb, rule, a, layer{mech: MechLSM, notes: []string{"lsm capable refuses " + name + " before the change"}})
			continue
		}
		var groups []string
		byCheck := map[dangerous.Check][]string{}
		var checks []dangerous.Check
		for _, o := range byCap[n] {
			if o.NR64 == dangerous.None {
				continue // i386 only: the compat rule or its number
			}
			if sel, ok := hostStateCategory[o.Check]; ok {
				c.bsCategory(sel, backstopAction(a), id)
			} else {
				c.bsSyscall(o.Name, backstopAction(a), id)
			}
			if _, seen := byCheck[o.Check]; !seen {
				checks = append(checks, o.Check)
			}
			byCheck[o.Check] = append(byCheck[o.Check], o.Name)
		}
		for _, ch := range checks {
			groups = append(groups, strings.Join(byCheck[ch], ", ")+hostStateNote[ch])
		}
		notes := []string{"backstop, judged at entry when the caller holds " + name + " over the initial user namespace (without it the kernel refuses with EPERM) " +
			"(the call itself completes before the process dies): " + strings.Join(groups, "; ")}
		if where, ok := dangerous.CapsJudgedOnUse[n]; ok {
			if c.bs.CapUse == nil {
				c.bs.CapUse = map[int]backstoprules.Rule{}
			}
			if cur := c.bs.CapUse[n]; backstopAction(a) > cur.Action {
				c.bs.CapUse[n] = backstoprules.Rule{Action: backstopAction(a), ID: id}
			}
			notes = append(notes, "backstop cap_capable (Linux >= 6.14): "+name+" granted in "+where+": the caller killed after the fact (the change is made)")
		}
		if n == dangerous.CapNetAdmin {
			if _, ok := dangerous.CapsJudgedOnUse[n]; !ok {
				notes = append(notes, "rtnetlink and netfilter writes (netlink sendmsg) not judged: the message is in user memory")
			}
		}
		c.add(sb, rule, a, layer{mech: MechKill, notes: notes, lsmMissing: []string{"capable"}, lsmOnly: true})
	}
}
