// Package cgrouprules is the cgroup BPF layer's rules
// (internal/enforce/cgroupbpf loads them): devices, /proc/sys, socket
// creation and listeners. No BPF here, so the planner can build them.
package cgrouprules

import (
	"strings"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/enforce/rules"
)

// Mechanism is the audit mechanism name of this layer's events.
const Mechanism = "cgroup_bpf"

// Any matches every value of a rule field (ANY in bpf/cgroup.c).
const Any = -1

// DeviceType is a device node type.
type DeviceType uint32

// Device types (BPF_DEVCG_DEV_*).
const (
	BlockDevice DeviceType = 1
	CharDevice  DeviceType = 2
)

// DeviceAccess is a set of device accesses (BPF_DEVCG_ACC_*).
type DeviceAccess uint32

// Device accesses.
const (
	AccessMknod DeviceAccess = 1
	AccessRead  DeviceAccess = 2
	AccessWrite DeviceAccess = 4
	AccessAll                = AccessMknod | AccessRead | AccessWrite
)

// String names the accesses, e.g. "read,write".
func (a DeviceAccess) String() string {
	var parts []string
	if a&AccessRead != 0 {
		parts = append(parts, "read")
	}
	if a&AccessWrite != 0 {
		parts = append(parts, "write")
	}
	if a&AccessMknod != 0 {
		parts = append(parts, "mknod")
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ",")
}

// DeviceRule decides access to device nodes from a sandbox.
type DeviceRule struct {
	// Sandbox is the sandbox id the rule applies to; 0 makes it a default
	// for every sandbox without a matching rule of its own.
	Sandbox uint32
	// Type is BlockDevice or CharDevice.
	Type DeviceType
	// Major and Minor select the device; Any matches every number. A rule
	// with Major Any must have Minor Any.
	Major, Minor int
	// Access is the set of accesses the action applies to; other accesses
	// are allowed. Zero means all.
	Access DeviceAccess
	// Action is rules.ActionAllow, ActionRecord, ActionBlock or
	// ActionKill (enforced as block: these hooks refuse, they cannot kill).
	Action uint32
	// RuleID is reported in events.
	RuleID uint32
}

// SysctlRule decides reads or writes of /proc/sys entries from a sandbox.
type SysctlRule struct {
	// Sandbox is the sandbox id; 0 for the default of every sandbox.
	Sandbox uint32
	// Name is the entry below /proc/sys with slashes ("kernel/sysrq"), or
	// empty for every entry. Names longer than 95 bytes cannot be named.
	Name string
	// Write selects writes (true) or reads (false).
	Write bool
	// Action as in DeviceRule.
	Action uint32
	// RuleID is reported in events.
	RuleID uint32
}

// SocketRule decides socket creation from a sandbox.
type SocketRule struct {
	// Sandbox is the sandbox id; 0 for the default of every sandbox.
	Sandbox uint32
	// Family (AF_*), Type (SOCK_*) and Protocol select sockets; Any
	// matches every value. Lookups go from the most specific pattern to
	// the least: (family, type, protocol), (family, any, protocol),
	// (family, type, any), (family, any, any), (any, type, any). Other
	// combinations of Any are not looked up and are rejected.
	Family, Type, Protocol int
	// Action as in DeviceRule.
	Action uint32
	// RuleID is reported in events.
	RuleID uint32
}

// MaxListenRanges is how many port ranges one sandbox's ListenRule holds
// (MAX_LISTEN_RANGES in bpf/cgroup.c).
const MaxListenRanges = 16

// PortRange is an inclusive range of ports.
type PortRange struct{ Lo, Hi uint16 }

// ListenRule says where a sandbox may accept connections from other
// hosts. A bind to a loopback address (127.0.0.0/8, ::1, v4-mapped
// 127/8) is allowed on any port; a bind to any other address, the
// wildcards included, only on a port in Ports: cgroup/bind4 and bind6
// refuse the rest with EPERM. A bind onto an address and port where a
// socket the sandbox does not own listens (TCP) or is bound (UDP) is
// refused too (SO_REUSEPORT would share that service's traffic).
//
// listen(2) on an unbound socket (the kernel's autobind: an ephemeral port
// on the wildcard address, no bind hook) cannot be refused by a cgroup
// program: sockops records it as it happens, and cgroup_skb/ingress drops
// every packet from another host to it, so it never sees a connection from
// outside; connections to a loopback destination still reach it. UDP
// sockets bound implicitly by sendto, or explicitly to port 0, are clients
// and pass.
//
// A sandbox without a ListenRule may listen anywhere.
type ListenRule struct {
	// Sandbox is the sandbox id (there is no default rule).
	Sandbox uint32
	// Ports lists the ports binds to non-loopback addresses may use; at
	// most MaxListenRanges ranges.
	Ports []PortRange
	// Action for a refused bind or listener: ActionBlock (ActionKill is
	// enforced as block: these hooks cannot kill), ActionRecord, or
	// ActionAllow.
	Action uint32
	// RuleID is reported in events.
	RuleID uint32
}

// PingSocketRules refuses ICMP and ICMPv6 ping sockets (SOCK_DGRAM) in
// sandbox: where net.ipv4.ping_group_range admits the caller (systemd hosts
// open it to every group), an unconnected ping socket's sendto reaches any
// address without passing a connect or sendmsg hook.
func PingSocketRules(sandbox, ruleID uint32) []SocketRule {
	return []SocketRule{
		{Sandbox: sandbox, Family: unix.AF_INET, Type: unix.SOCK_DGRAM, Protocol: unix.IPPROTO_ICMP, Action: rules.ActionBlock, RuleID: ruleID},
		{Sandbox: sandbox, Family: unix.AF_INET6, Type: unix.SOCK_DGRAM, Protocol: unix.IPPROTO_ICMPV6, Action: rules.ActionBlock, RuleID: ruleID},
	}
}
