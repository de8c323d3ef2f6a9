package launch

// Default-deny privilege: the command keeps only the capabilities its
// sandbox's policy grants, in every set, bounding set included.

import (
	"errors"
	"fmt"
	"math/bits"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/policy"
)

// CapSet is a set of capabilities, bit n for capability number n (as in
// /proc/PID/status).
type CapSet uint64

// GrantedCapabilities is the set the sandbox's policy grants: every
// capability whose rule action (policy.Sandbox.CapabilityAction) is allow
// or record. In record mode nothing is refused, so every capability is
// granted.
func GrantedCapabilities(sb *policy.Sandbox) CapSet {
	var s CapSet
	for c := 0; c <= 63; c++ {
		name := policy.CapabilityName(c)
		if name == "" {
			break
		}
		a := sb.CapabilityAction(c)
		if sb.Mode == policy.ModeRecord || a == policy.ActionAllow || a == policy.ActionRecord {
			s |= 1 << c
		}
	}
	return s
}

// ExecRestrictions adds to a plan's restrictions what `watcher exec` holds
// every command to: only the capabilities the sandbox grants (unless the
// plan set them), and Landlock's IPC scope, except in record mode, where
// nothing is refused. Run the command with Isolation.Namespaces including
// SubtreeNamespaces.
func ExecRestrictions(res Restrictions, sb *policy.Sandbox) Restrictions {
	if res.Capabilities == nil {
		granted := GrantedCapabilities(sb)
		res.Capabilities = &granted
	}
	if sb.Mode == policy.ModeRecord {
		res.NoIPCScope = true
	}
	return res
}

// Names lists the set's capabilities (CAP_CHOWN, ...), "none" when empty.
func (s CapSet) Names() []string {
	if s == 0 {
		return []string{"none"}
	}
	var out []string
	for c := 0; c < 64; c++ {
		if s&(1<<c) == 0 {
			continue
		}
		if n := policy.CapabilityName(c); n != "" {
			out = append(out, n)
		} else {
			out = append(out, "cap"+strconv.Itoa(c))
		}
	}
	return out
}

// Count is the number of capabilities in the set.
func (s CapSet) Count() int { return bits.OnesCount64(uint64(s)) }

// lastCap is the kernel's highest capability number.
func lastCap() (int, error) {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		return 0, fmt.Errorf("capabilities: %w", err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("capabilities: cap_last_cap: %w", err)
	}
	return n, nil
}

// currentCaps reads the calling thread's effective, permitted and
// inheritable sets.
func currentCaps() (eff, prm, inh CapSet, err error) {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return 0, 0, 0, fmt.Errorf("capget: %w", err)
	}
	join := func(lo, hi uint32) CapSet { return CapSet(uint64(hi)<<32 | uint64(lo)) }
	return join(data[0].Effective, data[1].Effective), join(data[0].Permitted, data[1].Permitted),
		join(data[0].Inheritable, data[1].Inheritable), nil
}

// dropCapabilities reduces the calling thread's capabilities to keep:
// the bounding set first (PR_CAPBSET_DROP needs CAP_SETPCAP, which the
// capset below may remove), the ambient set cleared, then the effective,
// permitted and inheritable sets. It returns the set the thread holds
// afterwards. Root executing a program gets its bounding set as permitted
// set, so the bounding set is what holds across execve (no_new_privs also
// stops file capabilities and set-uid from adding any).
func dropCapabilities(keep CapSet) (CapSet, error) {
	last, err := lastCap()
	if err != nil {
		return 0, err
	}
	_, prm, _, err := currentCaps()
	if err != nil {
		return 0, err
	}
	for c := 0; c <= last; c++ {
		if keep&(1<<c) != 0 {
			continue
		}
		in, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(c), 0, 0, 0)
		if err != nil || in == 0 {
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
			if errors.Is(err, unix.EPERM) && prm == 0 {
				// An unprivileged launcher holds nothing to drop, and
				// no_new_privs stops execve from granting any.
				break
			}
			return 0, fmt.Errorf("drop capability %d from the bounding set: %w", c, err)
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		return 0, fmt.Errorf("clear ambient capabilities: %w", err)
	}
	held := prm & keep
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	data := [2]unix.CapUserData{
		{Effective: uint32(held), Permitted: uint32(held), Inheritable: uint32(held)},
		{Effective: uint32(held >> 32), Permitted: uint32(held >> 32), Inheritable: uint32(held >> 32)},
	}
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return 0, fmt.Errorf("capset: %w", err)
	}
	eff, prm, inh, err := currentCaps()
	if err != nil {
		return 0, err
	}
	if eff != held || prm != held || inh != held {
		return 0, fmt.Errorf("capabilities not reduced: effective %#x permitted %#x inheritable %#x, want %#x", eff, prm, inh, held)
	}
	return held, nil
}
