package posture

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/cgroupfs"
)

// mountAgg collects, over the mount namespaces of the processes read, the
// mount holding each path of interest: /, /tmp, then the workspaces.
type mountAgg struct {
	paths []string
	out   []audit.MountPosture
	seen  map[[3]uint64]bool // mount ns, root dev, root inode
}

func newMountAgg(workspace []string) *mountAgg {
	paths := append([]string{"/", "/tmp"}, workspace...)
	out := make([]audit.MountPosture, len(paths))
	for i, p := range paths {
		out[i] = audit.MountPosture{Path: p, ReadOnly: true, NoExec: true, NoSuid: true, NoDev: true}
	}
	return &mountAgg{paths: paths, out: out, seen: map[[3]uint64]bool{}}
}

// add reads the mounts as pid sees them, once per mount namespace and root.
// Paths are resolved inside the process's root (RESOLVE_IN_ROOT), so a
// symlink such as /tmp -> / in a container is followed as the container
// would follow it, never into the host's tree.
func (m *mountAgg) add(r *Reader, pid int) error {
	base := filepath.Join(r.Proc, strconv.Itoa(pid))
	var ns, root unix.Stat_t
	if err := unix.Stat(filepath.Join(base, "ns", "mnt"), &ns); err != nil {
		return fmt.Errorf("mount namespace of %d: %w", pid, err)
	}
	rootFD, err := unix.Open(filepath.Join(base, "root"), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("root of %d: %w", pid, err)
	}
	defer unix.Close(rootFD)
	if err := unix.Fstat(rootFD, &root); err != nil {
		return fmt.Errorf("root of %d: %w", pid, err)
	}
	key := [3]uint64{ns.Ino, root.Dev, root.Ino}
	if m.seen[key] {
		return nil
	}
	mounts, err := readMountinfo(filepath.Join(base, "mountinfo"))
	if err != nil {
		return fmt.Errorf("mounts of %d: %w", pid, err)
	}
	first := len(m.seen) == 0
	for i, p := range m.paths {
		mp, err := mountOf(rootFD, p, mounts)
		if err != nil {
			return fmt.Errorf("%s of %d: %w", p, pid, err)
		}
		o := &m.out[i]
		if first {
			o.Mount, o.FSType = mp.Mount, mp.FSType
		}
		o.ReadOnly = o.ReadOnly && mp.ReadOnly
		o.NoExec = o.NoExec && mp.NoExec
		o.NoSuid = o.NoSuid && mp.NoSuid
		o.NoDev = o.NoDev && mp.NoDev
		o.Absent = o.Absent || mp.Absent
	}
	m.seen[key] = true
	return nil
}

func (m *mountAgg) result() (root, tmp audit.MountPosture, workspace []audit.MountPosture) {
	return m.out[0], m.out[1], m.out[2:]
}

// mountOf finds the mount holding path below the root dirfd: the flags
// from statfs (the per-mount flags and the superblock's), the mount point
// and type from mountinfo through the mount id statx reports.
func mountOf(rootFD int, path string, mounts map[uint64]cgroupfs.Mount) (audit.MountPosture, error) {
	mp := audit.MountPosture{Path: path}
	rel := strings.TrimPrefix(filepath.Clean(path), "/")
	if rel == "" {
		rel = "."
	}
	fd, err := unix.Openat2(rootFD, rel, &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS})
	if err == unix.ENOENT {
		mp.Absent = true
		return mp, nil
	}
	if err != nil {
		return mp, fmt.Errorf("open: %w", err)
	}
	defer unix.Close(fd)
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(fd, &sfs); err != nil {
		return mp, fmt.Errorf("statfs: %w", err)
	}
	mp.ReadOnly = sfs.Flags&unix.ST_RDONLY != 0
	mp.NoExec = sfs.Flags&unix.ST_NOEXEC != 0
	mp.NoSuid = sfs.Flags&unix.ST_NOSUID != 0
	mp.NoDev = sfs.Flags&unix.ST_NODEV != 0
	var stx unix.Statx_t
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_MNT_ID, &stx); err == nil && stx.Mask&unix.STATX_MNT_ID != 0 {
		if e, ok := mounts[stx.Mnt_id]; ok {
			mp.Mount, mp.FSType = e.Point, e.FSType
		}
	}
	return mp, nil
}

// readMountinfo indexes a /proc/PID/mountinfo file by mount id.
func readMountinfo(path string) (map[uint64]cgroupfs.Mount, error) {
	mounts, err := cgroupfs.ReadMountinfo(path)
	if err != nil {
		return nil, err
	}
	out := make(map[uint64]cgroupfs.Mount, len(mounts))
	for _, m := range mounts {
		out[m.ID] = m
	}
	return out, nil
}
