package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/control"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/launch"
	"github.com/watcherhq/watcher/internal/policy"
)

// pseudoFS is a filesystem the agent needs mounted.
type pseudoFS struct {
	dir, fstype string
	magic       int64
}

var needed = []pseudoFS{
	{"/sys/fs/bpf", "bpf", unix.BPF_FS_MAGIC},
	{"/sys/kernel/security", "securityfs", unix.SECURITYFS_MAGIC},
	{"/sys/kernel/tracing", "tracefs", unix.TRACEFS_MAGIC},
}

// MountPseudoFS mounts bpffs, securityfs and tracefs where missing. It
// returns what it mounted.
func MountPseudoFS() ([]string, error) {
	var mounted []string
	for _, p := range needed {
		var st unix.Statfs_t
		if err := unix.Statfs(p.dir, &st); err == nil && int64(st.Type) == p.magic {
			continue
		}
		if err := os.MkdirAll(p.dir, 0o700); err != nil {
			return mounted, fmt.Errorf("mount %s: %w", p.fstype, err)
		}
		if err := unix.Mount(p.fstype, p.dir, p.fstype, 0, ""); err != nil {
			return mounted, fmt.Errorf("mount %s at %s: %w", p.fstype, p.dir, err)
		}
		mounted = append(mounted, p.dir)
	}
	return mounted, nil
}

// CheckCapabilities fails unless the process has what loading BPF and
// managing cgroups takes.
func CheckCapabilities() error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("read capabilities: %w", err)
	}
	has := func(c uint) bool { return data[c/32].Effective&(1<<(c%32)) != 0 }
	var missing []string
	for _, c := range []struct {
		n    uint
		name string
	}{{unix.CAP_SYS_ADMIN, "CAP_SYS_ADMIN"}, {unix.CAP_BPF, "CAP_BPF"}, {unix.CAP_PERFMON, "CAP_PERFMON"}, {unix.CAP_NET_ADMIN, "CAP_NET_ADMIN"}} {
		if !has(c.n) {
			missing = append(missing, c.name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("watcher needs %s (run as root or grant them)", strings.Join(missing, ", "))
	}
	return nil
}

// Kernel reports the kernel features watcher depends on.
func Kernel() control.KernelStatus {
	var ks control.KernelStatus
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		ks.Release = unix.ByteSliceToString(u.Release[:])
	}
	if b, err := os.ReadFile("/sys/kernel/security/lsm"); err == nil {
		ks.LSMList = strings.TrimSpace(string(b))
	}
	ks.Cgroup2, _ = cgroupfs.Mountpoint()
	if ks.Cgroup2 == "" {
		ks.Cgroup2 = "missing"
	}
	ks.BPFFS = "/sys/fs/bpf"
	if abi, _, _ := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, 1); int(abi) > 0 {
		ks.LandlockABI = int(abi)
	}
	ks.BPFLSMWhy = "not probed"
	return ks
}

// bpfLSMReason explains why BPF LSM programs cannot run, from the LSM list
// and the load probe's error.
func bpfLSMReason(lsmList string, probeErr error) string {
	if lsmList != "" && !strings.Contains(","+lsmList+",", ",bpf,") {
		return fmt.Sprintf("bpf is not in the active LSM list (%s): boot with lsm=%s,bpf", lsmList, lsmList)
	}
	if errors.Is(probeErr, unix.EPERM) || errors.Is(probeErr, os.ErrPermission) {
		return "the kernel refuses BPF trampolines (lsm programs fail to load with EPERM)"
	}
	if probeErr != nil {
		return probeErr.Error()
	}
	return ""
}

var _ = enforce.DefaultPinDir

// probeSockets are the unix sockets the C library connects to on its own:
// glibc tries nscd before every passwd, group and hosts lookup, as the
// path is written in the library (through the /var/run symlink or not).
var probeSockets = []string{"/var/run/nscd/socket", "/run/nscd/socket"}

// AbsentProbeSockets returns the probeSockets that no socket answers on
// this host: nothing listens there, so a sandbox's connect reaches nothing
// (Env.AbsentProbeSockets).
func AbsentProbeSockets() []string {
	return absentSockets(probeSockets)
}

func absentSockets(paths []string) []string {
	var out []string
	for _, p := range paths {
		if st, err := os.Stat(p); err == nil && st.Mode()&os.ModeSocket != 0 {
			// A host nscd: it resolves any name, so it stays refused.
			return nil
		}
		out = append(out, p)
	}
	return out
}

// prepareToolDirs creates, in every home on the host (/root and the
// directories under /home), the missing directories of the write-allowed
// rules below a home (tool caches such as ~/.config/go/telemetry/ where the
// tool never ran). The kill backstop and Landlock grant writable places by
// the inodes that exist when the policy is applied: a writable directory
// made later by the sandbox itself would be judged by its parent, which the
// policy does not let it write, and the tool would be killed (backstop) or
// refused (Landlock) for doing what the policy allows.
func prepareToolDirs(pol *policy.Policy) {
	homes := []string{"/root"}
	if ents, err := os.ReadDir("/home"); err == nil {
		for _, e := range ents {
			if e.IsDir() {
				homes = append(homes, filepath.Join("/home", e.Name()))
			}
		}
	}
	for i := range pol.Sandboxes {
		rules := pol.FileRules(&pol.Sandboxes[i])
		for _, h := range homes {
			launch.PrecreateWritable(rules, h)
		}
	}
}
