package ipcobj

import (
	"errors"
	"fmt"
	"strings"

	"golang.org/x/sys/unix"
)

// POSIX message queues (mq_open) live in the mqueue filesystem of the
// creator's IPC namespace, whether or not it is mounted anywhere. The
// kernel side records a queue a sandbox process created by the
// namespace and the queue's inode number; removeMqueues, in that
// namespace, mounts its mqueue filesystem detached (fsopen and fsmount:
// no mount point, nothing other processes see, gone with the descriptor)
// and unlinks the entry with that inode: at its recorded name, else
// wherever a listing finds the inode (a name longer than the 63 bytes
// kept).

// removeMqueues removes, in the current thread's IPC namespace, the
// queues that still have the recorded inode.
func removeMqueues(objs []Object) (removed, gone []Object, err error) {
	dfd, err := mqueueRoot()
	if err != nil {
		return nil, nil, err
	}
	defer unix.Close(dfd)
	var names []string // listed once, when a recorded name does not lead to the inode
	listed := false
	var errs []error
	for _, o := range objs {
		ok, err := unlinkMqueue(dfd, strings.TrimPrefix(o.Path, "/"), o.Ino)
		if !ok && err == nil {
			if !listed {
				names, err = listDir(dfd)
				listed = true
			}
			for _, n := range names {
				if ok || err != nil {
					break
				}
				ok, err = unlinkMqueue(dfd, n, o.Ino)
			}
		}
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("remove %s: %w", o, err))
		case ok:
			removed = append(removed, o)
		default:
			gone = append(gone, o)
		}
	}
	return removed, gone, errors.Join(errs...)
}

// mqueueRoot returns a descriptor of the root of the current thread's
// IPC namespace's mqueue filesystem, mounted detached.
func mqueueRoot() (int, error) {
	fsfd, err := unix.Fsopen("mqueue", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("mqueue filesystem: fsopen: %w", err)
	}
	defer unix.Close(fsfd)
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return -1, fmt.Errorf("mqueue filesystem: create: %w", err)
	}
	mfd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC)
	if err != nil {
		return -1, fmt.Errorf("mqueue filesystem: fsmount: %w", err)
	}
	defer unix.Close(mfd)
	dfd, err := unix.Openat(mfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("mqueue filesystem: open: %w", err)
	}
	return dfd, nil
}

// unlinkMqueue removes the queue name in dfd when it has inode ino.
func unlinkMqueue(dfd int, name string, ino uint64) (bool, error) {
	if name == "" || strings.Contains(name, "/") {
		return false, nil
	}
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return false, nil
	}
	if st.Ino != ino || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return false, nil
	}
	if err := unix.Unlinkat(dfd, name, 0); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, err
	}
	return true, nil
}

func listDir(dfd int) ([]string, error) {
	fd, err := unix.Openat(dfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	var names []string
	buf := make([]byte, 8192)
	for {
		n, err := unix.ReadDirent(fd, buf)
		if err != nil {
			return nil, fmt.Errorf("list queues: %w", err)
		}
		if n == 0 {
			return names, nil
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
	}
}
