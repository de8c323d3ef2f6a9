package posture

import (
	"fmt"
	"strings"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/policy"
)

// Caps describes a capability set briefly: none, all (every capability
// this kernel knows), or the count.
func Caps(set uint64) string {
	switch {
	case set == 0:
		return "none"
	case set&allCaps() == allCaps():
		return "all"
	}
	n := 0
	for s := set; s != 0; s &= s - 1 {
		n++
	}
	return fmt.Sprintf("%d", n)
}

// CapList names the capabilities in a set (lower case, no CAP_ prefix).
func CapList(set uint64) string {
	var out []string
	for i := 0; i < 64; i++ {
		if set&(1<<i) != 0 {
			n := strings.ToLower(strings.TrimPrefix(policy.CapabilityName(i), "CAP_"))
			if n == "" {
				n = fmt.Sprintf("cap%d", i)
			}
			out = append(out, n)
		}
	}
	return strings.Join(out, ",")
}

func allCaps() uint64 {
	var all uint64
	for i := 0; policy.CapabilityName(i) != ""; i++ {
		all |= 1 << i
	}
	return all
}

// MountFlags renders a mount's flags as the table shows them: ro or rw,
// then noexec and nosuid when set; "absent" for a path that is not there.
func MountFlags(m audit.MountPosture) string {
	if m.Absent {
		return "absent"
	}
	f := []string{"rw"}
	if m.ReadOnly {
		f[0] = "ro"
	}
	if m.NoExec {
		f = append(f, "noexec")
	}
	if m.NoSuid {
		f = append(f, "nosuid")
	}
	return strings.Join(f, ",")
}

// Limit renders a limit value (bytes, millicores shown as cores, or a
// count), "-" for none.
func Limit(v float64, unit string) string {
	if v <= 0 {
		return "-"
	}
	switch unit {
	case "bytes":
		return policy.FormatBytes(int64(v))
	case "millicores":
		return fmt.Sprintf("%g", v/1000)
	}
	return fmt.Sprintf("%d", int64(v))
}

// Summary is a one-line description for events and logs.
func Summary(p *audit.Posture) string {
	s := summary(p)
	if n := len(p.Errors); n > 0 {
		s += "; not read: " + strings.Join(p.Errors[:min(n, 3)], "; ")
		if n > 3 {
			s += fmt.Sprintf(" (and %d more)", n-3)
		}
	}
	return s
}

func summary(p *audit.Posture) string {
	if p.Procs == 0 {
		return fmt.Sprintf("no processes; limits memory=%s cpu=%s pids=%s", Limit(float64(p.Limits.MemoryBytes), "bytes"),
			Limit(float64(p.Limits.CPUMillis), "millicores"), Limit(float64(p.Limits.PIDs), "count"))
	}
	yn := func(b bool) string {
		if b {
			return "yes"
		}
		return "no"
	}
	return fmt.Sprintf("%d procs; cap_eff=%s cap_bnd=%s no_new_privs=%s seccomp=%s user_ns=%s root_user=%s root=%s /tmp=%s; limits memory=%s cpu=%s pids=%s",
		p.Procs, Caps(p.CapEff), Caps(p.CapBnd), yn(p.NoNewPrivs), p.Seccomp, yn(p.UserNS), yn(p.RootUser), MountFlags(p.Root), MountFlags(p.Tmp),
		Limit(float64(p.Limits.MemoryBytes), "bytes"), Limit(float64(p.Limits.CPUMillis), "millicores"), Limit(float64(p.Limits.PIDs), "count"))
}
