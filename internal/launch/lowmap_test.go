package launch_test

import (
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/dangerous"
	"github.com/watcherhq/watcher/internal/launch"
	"github.com/watcherhq/watcher/internal/launch/ia32"
)

// lowMappingCalls place one page below vm.mmap_min_addr by each route of
// dangerous.FixedMappings ("low_*"), and the benign neighbours: mappings
// the kernel places, and fixed ones at the minimum ("ok_*"). Each unmaps
// what it mapped. With32 adds the i386 mmap2 (int 0x80: only where the
// kernel runs it).
func lowMappingCalls(with32 bool) []call {
	const page = 4096
	min, _ := dangerous.MmapMinAddr()
	atMin := uintptr((min + page - 1) &^ (page - 1))
	below := atMin - page // the highest page below the minimum
	anon := uintptr(unix.MAP_PRIVATE | unix.MAP_ANONYMOUS)
	mmap := func(addr, flags uintptr) func() syscall.Errno {
		return func() syscall.Errno {
			p, _, e := unix.Syscall6(unix.SYS_MMAP, addr, page, unix.PROT_READ, anon|flags, bad, 0)
			if e == 0 {
				unix.Syscall(unix.SYS_MUNMAP, p, page, 0)
			}
			return e
		}
	}
	mremap := func(to uintptr) func() syscall.Errno {
		return func() syscall.Errno {
			old, _, e := unix.Syscall6(unix.SYS_MMAP, 0, page, unix.PROT_READ, anon, bad, 0)
			if e != 0 {
				return e
			}
			p, _, e := unix.Syscall6(unix.SYS_MREMAP, old, page, page, unix.MREMAP_MAYMOVE|unix.MREMAP_FIXED, to, 0)
			if e != 0 {
				p = old
			}
			unix.Syscall(unix.SYS_MUNMAP, p, page, 0)
			return e
		}
	}
	shmat := func(at uintptr) func() syscall.Errno {
		return func() syscall.Errno {
			id, _, e := unix.Syscall(unix.SYS_SHMGET, unix.IPC_PRIVATE, page, unix.IPC_CREAT|0o600)
			if e != 0 {
				return e
			}
			defer unix.Syscall(unix.SYS_SHMCTL, id, unix.IPC_RMID, 0)
			p, _, e := unix.Syscall(unix.SYS_SHMAT, id, at, unix.SHM_RDONLY)
			if e == 0 {
				unix.Syscall(unix.SYS_SHMDT, p, 0, 0)
			}
			return e
		}
	}
	calls := []call{
		{"low_mmap_fixed_0", mmap(0, unix.MAP_FIXED)},
		{"low_mmap_fixed_below", mmap(below, unix.MAP_FIXED)},
		{"low_mmap_noreplace_0", mmap(0, unix.MAP_FIXED_NOREPLACE)},
		{"low_mremap_fixed_0", mremap(0)},
		{"ok_mmap_anywhere", mmap(0, 0)},
		{"ok_mmap_hint_low", mmap(page, 0)},
		{"ok_mmap_noreplace_min", mmap(atMin, unix.MAP_FIXED_NOREPLACE)},
		{"ok_mremap_min", mremap(atMin)},
		{"ok_shmat_anywhere", shmat(0)},
	}
	if with32 {
		// i386 mmap2 (192) through int 0x80: the arch guard refuses the
		// whole table under watcher exec.
		calls = append(calls, call{"guard_ia32_mmap2_0", func() syscall.Errno {
			r := ia32.Syscall6(192, 0, page, unix.PROT_READ, anon|unix.MAP_FIXED, 0xffffffff, 0)
			if r < 0 && r > -4096 {
				return syscall.Errno(-r)
			}
			unix.Syscall(unix.SYS_MUNMAP, uintptr(uint32(r)), page, 0)
			return 0
		}})
	}
	if below != 0 {
		// shmat at 0 lets the kernel choose: a low shmat needs a
		// minimum above one page (Debian's 65536; this host has 4096).
		calls = append(calls, call{"low_shmat_below", shmat(below)})
	}
	return calls
}

// TestLowMappingsRefused: with DenyLowMappings (a sandbox blocking
// CAP_SYS_RAWIO on a host without the mmap_addr hook), watcher exec's
// seccomp filter refuses a mapping placed below vm.mmap_min_addr with
// EPERM by mmap MAP_FIXED(_NOREPLACE), mremap MREMAP_FIXED and shmat;
// mappings the kernel places and fixed ones at the minimum still work.
// Without the flag, and outside, root maps below the minimum; the i386
// mmap2 is refused by the arch guard either way.
func TestLowMappingsRefused(t *testing.T) {
	e := newEnv(t)
	min, err := dangerous.MmapMinAddr()
	if err != nil {
		t.Fatal(err)
	}
	if min == 0 {
		t.Skip("vm.mmap_min_addr is 0: the kernel checks no capability for low mappings, nothing to refuse")
	}
	with32 := ia32Rows(t, "guard_ia32_mmap2_0")
	mode := withIA32("lowmap", with32)
	run := func(deny bool) map[string]syscall.Errno {
		cfg := e.config(mode)
		cfg.Restrictions.Seccomp.DenyLowMappings = deny
		v, out := e.runConfig(t, cfg)
		if v.Outcome != launch.OutcomeExited || v.ExitCode != 0 {
			t.Fatalf("verdict %v\n%s", v, out)
		}
		if deny != slices.Contains(v.Applied.SeccompDenied, fmt.Sprintf("mmap(below %#x)", min)) {
			t.Errorf("deny=%v: seccomp applied %v", deny, v.Applied.SeccompDenied)
		}
		return parseResults(t, out)
	}
	denied := run(true)
	allowed := run(false)
	out := parseResults(t, outside(t, mode))
	for _, c := range lowMappingCalls(with32) {
		kind, _, _ := strings.Cut(c.name, "_")
		want, wantAllowed := syscall.Errno(0), syscall.Errno(0)
		switch kind {
		case "low":
			want = syscall.EPERM
		case "guard": // the arch guard, with or without the flag
			want, wantAllowed = syscall.EPERM, syscall.EPERM
		}
		got, ok := denied[c.name]
		if !ok || got != want {
			t.Errorf("%s with DenyLowMappings: %v (reported %v), want %v", c.name, got, ok, want)
		}
		if got, ok := allowed[c.name]; !ok || got != wantAllowed {
			t.Errorf("%s without DenyLowMappings: %v (reported %v), want %v", c.name, got, ok, wantAllowed)
		}
		if got, ok := out[c.name]; !ok || got != 0 {
			t.Errorf("%s outside: %v (reported %v), want success (root has CAP_SYS_RAWIO)", c.name, got, ok)
		}
	}
	t.Logf("vm.mmap_min_addr %#x: with DenyLowMappings %v", min, denied)
}
