package dangerous

// HostState is the part of the one list that changes host-wide state: the
// clock, the host and domain names, namespaces, quotas, the kernel log,
// network configuration. Unlike Ops, no group refuses them outright: each
// needs a capability, and a sandbox's capability rules decide
// (policy.Sandbox.CapabilityAction: block or kill refuses). Where the
// capable hook runs, it refuses them with EPERM; elsewhere the kill
// backstop kills them at sys_enter, by number or by argument (Check), and
// watcher exec's capability drop makes the kernel refuse them. swapon,
// swapoff, reboot and acct are Ops of the kernel group (refused whatever
// the capabilities say).

// Check says which calls of a HostOp the backstop kills.
type Check string

// Argument checks (entry_category in bpf/include/backstop_entry.h).
const (
	// CheckAll: every call.
	CheckAll Check = ""
	// CheckClockModes: adjtimex/clock_adjtime with modes set, read from
	// user memory at entry (a read has modes 0).
	CheckClockModes Check = "clock-modes"
	// CheckNamespaces: setns to a namespace the caller is not in (or a
	// pidfd of a process outside its subtree); unshare and clone with a
	// namespace flag that asks for CAP_SYS_ADMIN.
	CheckNamespaces Check = "namespaces"
	// CheckSyslogAction: syslog actions 4-8 (clear, console level); reads
	// stay allowed.
	CheckSyslogAction Check = "syslog-action"
	// CheckQuotaCmd: quotactl commands other than Q_SYNC and the gets.
	CheckQuotaCmd Check = "quota-command"
	// CheckNetConfigIoctl: the socket ioctls that set interfaces,
	// addresses, routes, ARP, bridges (SIOCS*, SIOCADDRT, ...).
	CheckNetConfigIoctl Check = "net-config-ioctl"
)

// Capability numbers (include/uapi/linux/capability.h).
const (
	CapNetAdmin = 12
	CapSysAdmin = 21
	CapSysTime  = 25
	CapSyslog   = 34
)

// HostOp is one syscall changing host-wide state.
type HostOp struct {
	// Name is the x86_64 name; NR64 and NR32 its numbers (None: absent).
	Name       string
	NR64, NR32 int
	// Cap is the capability the kernel asks for before the change.
	Cap int
	// Check says which calls the backstop kills.
	Check Check
}

// HostState is the list.
var HostState = []HostOp{
	{"settimeofday", 164, 79, CapSysTime, CheckAll},
	{"clock_settime", 227, 264, CapSysTime, CheckAll},
	{"stime", None, 25, CapSysTime, CheckAll},
	{"adjtimex", 159, 124, CapSysTime, CheckClockModes},
	{"clock_adjtime", 305, 343, CapSysTime, CheckClockModes},
	{"sethostname", 170, 74, CapSysAdmin, CheckAll},
	{"setdomainname", 171, 121, CapSysAdmin, CheckAll},
	{"quotactl", 179, 131, CapSysAdmin, CheckQuotaCmd},
	{"quotactl_fd", 443, 443, CapSysAdmin, CheckQuotaCmd},
	{"setns", 308, 346, CapSysAdmin, CheckNamespaces},
	{"unshare", 272, 310, CapSysAdmin, CheckNamespaces},
	{"clone", 56, 120, CapSysAdmin, CheckNamespaces},
	// A full fanotify group (mount or filesystem marks, permission
	// events) asks CAP_SYS_ADMIN: killed before any mark exists.
	{"fanotify_init", 300, 338, CapSysAdmin, CheckAll},
	{"syslog", 103, 103, CapSyslog, CheckSyslogAction},
	{"ioctl", 16, 54, CapNetAdmin, CheckNetConfigIoctl},
}

// HostStateByCap returns the entries needing capability c, in list order.
func HostStateByCap(c int) []HostOp {
	var out []HostOp
	for _, o := range HostState {
		if o.Cap == c {
			out = append(out, o)
		}
	}
	return out
}

// CapsJudgedOnUse are the capabilities the kill backstop may judge where
// the kernel checks them (the cap_capable tracepoint, Linux >= 6.14,
// after the check, the change then made): those the kernel checks only
// right before a change, so a granted check means a change. Many others
// are also probed silently (CAP_SYS_ADMIN by cap_vm_enough_memory on every
// mmap, CAP_SYS_RESOURCE by quota and memory accounting, CAP_IPC_OWNER,
// CAP_DAC_*): killing on those would kill everyday work. The value says
// where a check counts. CAP_SYSLOG is left to the syslog entry: reading
// the kernel log asks for it when dmesg_restrict is set.
var CapsJudgedOnUse = map[int]string{
	CapSysTime: "any check (settimeofday, clock_settime, adjtimex and clock_adjtime with modes set, RTC_SET_TIME)",
	// inet_diag probes CAP_NET_ADMIN for `ss`, sockets for SO_MARK and
	// SO_PRIORITY: only netlink configuration sends count.
	CapNetAdmin: "a send on a route, xfrm or netfilter netlink socket (rtnetlink RTM_NEW*/RTM_DEL*, nftables)",
}
