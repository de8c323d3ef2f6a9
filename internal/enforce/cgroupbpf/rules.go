package cgroupbpf

import (
	"fmt"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/rules/cgrouprules"
)

func field(v int, what string) (uint32, error) {
	if v == cgrouprules.Any {
		return anyKey, nil
	}
	if v < 0 || v >= int(anyKey) {
		return 0, fmt.Errorf("%s %d out of range", what, v)
	}
	return uint32(v), nil
}

func checkAction(a uint32) error {
	if a > enforce.ActionKill {
		return fmt.Errorf("unknown action %d", a)
	}
	return nil
}

// SetDeviceRules replaces the device rule table.
func (h *Programs) SetDeviceRules(rules []cgrouprules.DeviceRule) error {
	want := map[cgroupDevKey]cgroupRule{}
	for i, r := range rules {
		if r.Type != cgrouprules.BlockDevice && r.Type != cgrouprules.CharDevice {
			return fmt.Errorf("device rule %d: unknown device type %d", i, r.Type)
		}
		maj, err := field(r.Major, "major")
		if err != nil {
			return fmt.Errorf("device rule %d: %w", i, err)
		}
		minor, err := field(r.Minor, "minor")
		if err != nil {
			return fmt.Errorf("device rule %d: %w", i, err)
		}
		if maj == anyKey && minor != anyKey {
			return fmt.Errorf("device rule %d: a minor number needs a major number", i)
		}
		if err := checkAction(r.Action); err != nil {
			return fmt.Errorf("device rule %d: %w", i, err)
		}
		acc := r.Access
		if acc == 0 {
			acc = cgrouprules.AccessAll
		}
		if acc&^cgrouprules.AccessAll != 0 {
			return fmt.Errorf("device rule %d: unknown access bits %#x", i, acc)
		}
		k := cgroupDevKey{SandboxId: r.Sandbox, Type: uint32(r.Type), Major: maj, Minor: minor}
		if _, dup := want[k]; dup {
			return fmt.Errorf("device rule %d: duplicate of an earlier rule", i)
		}
		want[k] = cgroupRule{Action: r.Action, RuleId: r.RuleID, Access: uint32(acc)}
	}
	return enforce.SyncMap(h.objs.CgDevRules, want)
}

// SetSysctlRules replaces the sysctl rule table.
func (h *Programs) SetSysctlRules(rules []cgrouprules.SysctlRule) error {
	want := map[cgroupSysctlKey]cgroupRule{}
	for i, r := range rules {
		var k cgroupSysctlKey
		name := strings.Trim(strings.TrimPrefix(r.Name, "/proc/sys/"), "/")
		if !strings.Contains(name, "/") {
			name = strings.ReplaceAll(name, ".", "/") // sysctl(8) notation
		}
		if len(name) >= len(k.Name) {
			return fmt.Errorf("sysctl rule %d: name %q longer than %d bytes", i, r.Name, len(k.Name)-1)
		}
		if err := checkAction(r.Action); err != nil {
			return fmt.Errorf("sysctl rule %d: %w", i, err)
		}
		k.SandboxId = r.Sandbox
		if r.Write {
			k.Write = 1
		}
		for j := 0; j < len(name); j++ {
			k.Name[j] = int8(name[j])
		}
		if _, dup := want[k]; dup {
			return fmt.Errorf("sysctl rule %d: duplicate of an earlier rule", i)
		}
		want[k] = cgroupRule{Action: r.Action, RuleId: r.RuleID}
	}
	return enforce.SyncMap(h.objs.CgSysctlRules, want)
}

// SetSocketRules replaces the socket rule table.
func (h *Programs) SetSocketRules(rules []cgrouprules.SocketRule) error {
	want := map[cgroupSockKey]cgroupRule{}
	for i, r := range rules {
		fam, err := field(r.Family, "family")
		if err != nil {
			return fmt.Errorf("socket rule %d: %w", i, err)
		}
		typ, err := field(r.Type, "type")
		if err != nil {
			return fmt.Errorf("socket rule %d: %w", i, err)
		}
		proto, err := field(r.Protocol, "protocol")
		if err != nil {
			return fmt.Errorf("socket rule %d: %w", i, err)
		}
		if fam == anyKey && (typ == anyKey || proto != anyKey) {
			return fmt.Errorf("socket rule %d: a rule for any family must name a type and no protocol", i)
		}
		if err := checkAction(r.Action); err != nil {
			return fmt.Errorf("socket rule %d: %w", i, err)
		}
		k := cgroupSockKey{SandboxId: r.Sandbox, Family: fam, Type: typ, Protocol: proto}
		if _, dup := want[k]; dup {
			return fmt.Errorf("socket rule %d: duplicate of an earlier rule", i)
		}
		want[k] = cgroupRule{Action: r.Action, RuleId: r.RuleID}
	}
	return enforce.SyncMap(h.objs.CgSockRules, want)
}

// DefaultDeviceRules refuses every block device and every character device
// except the ones ordinary programs need: null, zero, full, random,
// urandom, tty, ptmx and the pseudo-terminals. So raw disks, /dev/mem,
// /dev/kmem, /dev/port, /dev/kmsg, /dev/console, tun, fuse, kvm and the rest
// are refused. The rules are sandbox defaults (Sandbox 0).
func DefaultDeviceRules(ruleID uint32) []cgrouprules.DeviceRule {
	rules := []cgrouprules.DeviceRule{
		{Type: cgrouprules.BlockDevice, Major: cgrouprules.Any, Minor: cgrouprules.Any, Action: enforce.ActionBlock, RuleID: ruleID},
		{Type: cgrouprules.CharDevice, Major: cgrouprules.Any, Minor: cgrouprules.Any, Action: enforce.ActionBlock, RuleID: ruleID},
	}
	allow := func(major, minor int) {
		rules = append(rules, cgrouprules.DeviceRule{Type: cgrouprules.CharDevice, Major: major, Minor: minor,
			Action: enforce.ActionAllow, RuleID: ruleID})
	}
	for _, minor := range []int{3, 5, 7, 8, 9} { // null zero full random urandom
		allow(1, minor)
	}
	allow(5, 0)                               // /dev/tty
	allow(5, 2)                               // /dev/ptmx
	for major := 136; major <= 143; major++ { // /dev/pts/*
		allow(major, cgrouprules.Any)
	}
	return rules
}

// DefaultSysctlRules refuses writes to /proc/sys and allows reads.
func DefaultSysctlRules(ruleID uint32) []cgrouprules.SysctlRule {
	return []cgrouprules.SysctlRule{{Write: true, Action: enforce.ActionBlock, RuleID: ruleID}}
}

// DefaultSocketRules refuses raw IPv4 and IPv6 sockets (forged packets,
// ping sweeps and sniffing of ICMP); ping sockets (SOCK_DGRAM,
// IPPROTO_ICMP) stay allowed here: PingSocketRules refuses them per sandbox.
//
// cgroup/sock_create only runs for AF_INET and AF_INET6 sockets (the kernel
// calls it from inet_create and inet6_create), so packet, netlink and vsock
// sockets cannot be refused here: the launcher's seccomp filter refuses
// them for commands watcher starts (see internal/launch), and the kill
// backstop or BPF LSM covers other processes.
func DefaultSocketRules(ruleID uint32) []cgrouprules.SocketRule {
	return []cgrouprules.SocketRule{
		{Family: cgrouprules.Any, Type: unix.SOCK_RAW, Protocol: cgrouprules.Any, Action: enforce.ActionBlock, RuleID: ruleID},
	}
}
