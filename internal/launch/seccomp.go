package launch

import (
	"fmt"
	"sort"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/dangerous"
)

// alwaysDenied are refused with EPERM whatever the policy: the one list of
// dangerous syscalls (internal/dangerous), io_uring aside (AllowIOUring).
var alwaysDenied = func() []string {
	var out []string
	for _, o := range dangerous.Ops {
		if o.Group != dangerous.GroupIOUring && o.NR64 != dangerous.None {
			out = append(out, o.Name)
		}
	}
	return out
}()

var ioUring = dangerous.Names(dangerous.ByGroup(dangerous.GroupIOUring))

// actionENOSYS makes clone3 look unimplemented, so libc falls back to
// clone, whose flags the filter can read.
const actionENOSYS = seccomp.Action(unix.SECCOMP_RET_ERRNO | unix.ENOSYS)

// seccompFilters builds the filters for p: the policy filter for the native
// ABI, and an arch guard that refuses syscalls of any other ABI (an amd64
// process can enter the i386 table with int 0x80, where the policy
// filter's numbers mean other syscalls). It returns the filters and the
// names of the refused syscalls.
func seccompFilters(p SeccompPolicy) ([]seccomp.Filter, []string, error) {
	native, err := arch.GetInfo("")
	if err != nil {
		return nil, nil, fmt.Errorf("seccomp: %w", err)
	}
	var names []string
	for _, n := range alwaysDenied {
		// Syscalls newer than the library's table (open_tree_attr on an
		// old table) are skipped; the arch guard refuses unknown numbers.
		if _, ok := native.SyscallNames[n]; ok {
			names = append(names, n)
		}
	}
	if !p.AllowIOUring {
		names = append(names, ioUring...)
	}
	groups := []seccomp.SyscallGroup{{Names: names, Action: seccomp.ActionErrno}}
	denied := append([]string{}, names...)

	forbidden := AllNamespaces &^ p.AllowedNamespaces
	if forbidden != 0 {
		cond := func(arg uint32) []seccomp.Condition {
			return []seccomp.Condition{{Argument: arg, Operation: seccomp.BitsSet, Value: forbidden}}
		}
		nc := []seccomp.NameWithConditions{
			{Name: "clone", Conditions: cond(0)},
			{Name: "unshare", Conditions: cond(0)},
			{Name: "setns", Conditions: cond(1)},
			// nstype 0 lets the fd decide the namespace type.
			{Name: "setns", Conditions: []seccomp.Condition{{Argument: 1, Operation: seccomp.Equal, Value: 0}}},
		}
		groups = append(groups,
			seccomp.SyscallGroup{NamesWithCondtions: nc, Action: seccomp.ActionErrno},
			seccomp.SyscallGroup{Names: []string{"clone3"}, Action: actionENOSYS})
		denied = append(denied, "clone(CLONE_NEW*)", "unshare(CLONE_NEW*)", "setns", "clone3(ENOSYS)")
	}

	// Terminal input injection, on every fd: TIOCSTI pushes a command
	// into a terminal's input (a host shell runs it), TIOCLINUX's paste
	// selection does the same on a virtual console.
	groups = append(groups, seccomp.SyscallGroup{NamesWithCondtions: []seccomp.NameWithConditions{
		{Name: "ioctl", Conditions: low32Equal(1, unix.TIOCSTI)},
		{Name: "ioctl", Conditions: low32Equal(1, unix.TIOCLINUX)},
	}, Action: seccomp.ActionErrno})
	denied = append(denied, "ioctl(TIOCSTI)", "ioctl(TIOCLINUX)")

	var sock []seccomp.NameWithConditions
	for _, fam := range p.DeniedSocketFamilies {
		sock = append(sock, seccomp.NameWithConditions{Name: "socket", Conditions: []seccomp.Condition{
			{Argument: 0, Operation: seccomp.Equal, Value: uint64(fam)}}})
		denied = append(denied, fmt.Sprintf("socket(family %d)", fam))
	}
	for _, proto := range p.DeniedNetlinkProtocols {
		sock = append(sock, seccomp.NameWithConditions{Name: "socket", Conditions: []seccomp.Condition{
			{Argument: 0, Operation: seccomp.Equal, Value: unix.AF_NETLINK},
			{Argument: 2, Operation: seccomp.Equal, Value: uint64(proto)}}})
	}
	if len(p.DeniedNetlinkProtocols) > 0 {
		denied = append(denied, fmt.Sprintf("socket(netlink, %d protocols)", len(p.DeniedNetlinkProtocols)))
	}
	if len(sock) > 0 {
		groups = append(groups, seccomp.SyscallGroup{NamesWithCondtions: sock, Action: seccomp.ActionErrno})
	}
	if p.DenyLowMappings {
		low, names, err := lowMappings()
		if err != nil {
			return nil, nil, fmt.Errorf("seccomp: %w", err)
		}
		if len(low) > 0 {
			groups = append(groups, seccomp.SyscallGroup{NamesWithCondtions: low, Action: seccomp.ActionErrno})
			denied = append(denied, names...)
		}
	}

	policy := seccomp.Filter{
		NoNewPrivs: true,
		Policy:     seccomp.Policy{DefaultAction: seccomp.ActionAllow, Syscalls: groups},
	}
	if _, err := policy.Policy.Assemble(); err != nil {
		return nil, nil, fmt.Errorf("seccomp policy: %w", err)
	}

	// The guard allows every syscall of the native table and refuses
	// everything else: other ABIs, and native numbers newer than the
	// library's table (EPERM instead of ENOSYS for those).
	all := make([]string, 0, len(native.SyscallNames))
	for n := range native.SyscallNames {
		all = append(all, n)
	}
	sort.Strings(all)
	guard := seccomp.Filter{
		NoNewPrivs: true,
		Policy: seccomp.Policy{DefaultAction: seccomp.ActionErrno,
			Syscalls: []seccomp.SyscallGroup{{Names: all, Action: seccomp.ActionAllow}}},
	}
	if _, err := guard.Policy.Assemble(); err != nil {
		return nil, nil, fmt.Errorf("seccomp arch guard: %w", err)
	}
	return []seccomp.Filter{guard, policy}, denied, nil
}

// low32Equal matches an argument whose low 32 bits equal v, whatever the
// high bits: the kernel truncates ioctl's cmd to unsigned int, so an
// exact 64-bit comparison would let v|1<<32 through. The library's
// BitsSet means "any of", hence one condition per set bit (all ANDed)
// and BitsNotSet for the other low bits.
func low32Equal(arg uint32, v uint32) []seccomp.Condition {
	var cs []seccomp.Condition
	for b := 0; b < 32; b++ {
		if v&(1<<b) != 0 {
			cs = append(cs, seccomp.Condition{Argument: arg, Operation: seccomp.BitsSet, Value: 1 << b})
		}
	}
	return append(cs, seccomp.Condition{Argument: arg, Operation: seccomp.BitsNotSet, Value: uint64(^v)})
}

// lowMappings are the conditions refusing a mapping placed below
// vm.mmap_min_addr, read now (the kernel's own check there asks
// CAP_SYS_RAWIO without the capable hook): the fixed-address syscalls of
// the one dangerous list. None when the sysctl is 0.
func lowMappings() ([]seccomp.NameWithConditions, []string, error) {
	min, err := dangerous.MmapMinAddr()
	if err != nil || min == 0 {
		return nil, nil, err
	}
	// shmat and SHM_RND round the address down to a page: every address
	// below the minimum rounded up lands below it.
	const page = 4096
	shmLimit := (min + page - 1) &^ (page - 1)
	var out []seccomp.NameWithConditions
	var names []string
	for _, m := range dangerous.FixedMappings {
		if m.Flags == 0 {
			out = append(out, seccomp.NameWithConditions{Name: m.Name, Conditions: []seccomp.Condition{
				{Argument: m.AddrArg, Operation: seccomp.NotEqual, Value: 0},
				{Argument: m.AddrArg, Operation: seccomp.LessThan, Value: shmLimit}}})
		} else {
			out = append(out, seccomp.NameWithConditions{Name: m.Name, Conditions: []seccomp.Condition{
				{Argument: m.FlagsArg, Operation: seccomp.BitsSet, Value: m.Flags},
				{Argument: m.AddrArg, Operation: seccomp.LessThan, Value: min}}})
		}
		names = append(names, fmt.Sprintf("%s(below %#x)", m.Name, min))
	}
	return out, names, nil
}

// loadSeccomp installs the filters on the calling thread (which then
// execs: the filters pass to the new program and all its descendants).
func loadSeccomp(filters []seccomp.Filter) error {
	for _, f := range filters {
		if err := seccomp.LoadFilter(f); err != nil {
			return fmt.Errorf("load seccomp filter: %w", err)
		}
	}
	return nil
}
