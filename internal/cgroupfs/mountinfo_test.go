package cgroupfs

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// The real mountinfo of this process: /proc is a proc mount, and the mount
// id statx reports for a file is a line of the file with the same point.
func TestReadMountinfo(t *testing.T) {
	mounts, err := ReadMountinfo("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	byID := map[uint64]Mount{}
	for _, m := range mounts {
		byID[m.ID] = m
	}
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, "/proc/self", 0, unix.STATX_MNT_ID, &stx); err != nil {
		t.Fatal(err)
	}
	if m := byID[stx.Mnt_id]; m.FSType != "proc" || m.Point != "/proc" {
		t.Fatalf("mount %d of /proc/self: %+v", stx.Mnt_id, m)
	}
	// The device is the one stat reports for the mount point.
	if m := byID[stx.Mnt_id]; m.Major != stx.Dev_major || m.Minor != stx.Dev_minor {
		t.Errorf("mount %d device %d:%d, statx says %d:%d", stx.Mnt_id, m.Major, m.Minor, stx.Dev_major, stx.Dev_minor)
	}
	// A mount point with a space is unescaped.
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	dir := filepath.Join(t.TempDir(), "a b")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("cgroupfs-test", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "size=1m"); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(dir, unix.MNT_DETACH)
	mounts, err = ReadMountinfo("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, m := range mounts {
		if m.Point == dir {
			found = m.FSType == "tmpfs" && m.Source == "cgroupfs-test" && m.Options == "rw,nosuid,noexec,relatime"
			if !found {
				t.Errorf("%+v", m)
			}
		}
	}
	if !found {
		t.Fatalf("no mount at %q", dir)
	}
}
