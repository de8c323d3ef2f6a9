package workspace

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// The real directory belongs to a user who may change it while a commit
// (running as root) writes into it: a directory swapped for a symlink to
// /etc must not send a root-owned file there. So commit reaches every
// entry below the real directory from a descriptor of its root, without
// following symlinks or leaving it (openat2 RESOLVE_BENEATH and
// RESOLVE_NO_SYMLINKS, or a component walk with O_NOFOLLOW where openat2
// is missing), and works with *at calls on the descriptor of the parent.

// errMoved wraps what the kernel said when a path below the real
// directory met a symlink or no longer led where it did.
var errMoved = errors.New("a symlink or a moved entry on the way (did the real directory change during the commit?)")

// openBeneath opens rel (a clean relative path, "." for root itself)
// below the directory root as a directory, following no symlink.
func openBeneath(root int, rel string) (int, error) {
	const flags = unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
	how := unix.OpenHow{Flags: flags, Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS}
	for {
		fd, err := unix.Openat2(root, rel, &how)
		switch {
		case err == nil:
			return fd, nil
		case errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN):
			continue // EAGAIN: a concurrent rename; try again
		case errors.Is(err, unix.ENOSYS):
			// No openat2 (before 5.6, or a seccomp filter refuses it).
			return walkBeneath(root, rel)
		case errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ENOTDIR):
			return -1, fmt.Errorf("%s: %w: %w", rel, errMoved, err)
		}
		return -1, err
	}
}

// walkBeneath is openBeneath one component at a time.
func walkBeneath(root int, rel string) (int, error) {
	fd, err := unix.Openat(root, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	if rel == "." {
		return fd, nil
	}
	for _, c := range strings.Split(rel, "/") {
		if c == "" || c == "." || c == ".." {
			unix.Close(fd)
			return -1, fmt.Errorf("%s: not a clean relative path", rel)
		}
		next, err := unix.Openat(fd, c, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		if err != nil {
			if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
				return -1, fmt.Errorf("%s: %w: %w", rel, errMoved, err)
			}
			return -1, err
		}
		fd = next
	}
	return fd, nil
}

// removeAllAt removes name in the directory dfd and everything below it,
// following no symlink. A missing name is not an error. It holds at most
// three descriptors whatever the depth: each directory met is emptied of
// its files and its subdirectories are moved up into name itself, then it
// is removed, so a tree deeper than RLIMIT_NOFILE (a sandbox can make one)
// goes too.
func removeAllAt(dfd int, name string) error {
	err := unix.Unlinkat(dfd, name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.EISDIR) {
		return fmt.Errorf("remove %s: %w", name, err)
	}
	top, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("remove %s: %w", name, err)
	}
	defer unix.Close(top)
	for {
		names, err := readNames(top)
		if err != nil {
			return fmt.Errorf("remove %s: %w", name, err)
		}
		if len(names) == 0 {
			break
		}
		for _, n := range names {
			if err := flattenInto(top, n); err != nil {
				return fmt.Errorf("remove %s: %w", name, err)
			}
		}
	}
	if err := unix.Unlinkat(dfd, name, unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("remove %s: %w", name, err)
	}
	return nil
}

// flattenInto removes the entry n of top: a file at once; a directory
// after its files are removed and its subdirectories renamed into top
// (removed by a later pass of removeAllAt).
func flattenInto(top int, n string) error {
	err := unix.Unlinkat(top, n, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.EISDIR) {
		return fmt.Errorf("%s: %w", n, err)
	}
	sub, err := unix.Openat(top, n, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("%s: %w", n, err)
	}
	names, err := readNames(sub)
	for _, c := range names {
		if err != nil {
			break
		}
		err = unix.Unlinkat(sub, c, 0)
		switch {
		case err == nil || errors.Is(err, unix.ENOENT):
			err = nil
		case errors.Is(err, unix.EISDIR):
			err = unix.Renameat(sub, c, top, flatName())
		}
	}
	unix.Close(sub)
	if err != nil {
		return fmt.Errorf("%s: %w", n, err)
	}
	if err := unix.Unlinkat(top, n, unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ENOTEMPTY) {
		return fmt.Errorf("%s: %w", n, err)
	}
	return nil // not empty: something appeared meanwhile; the next pass sees it
}

func flatName() string {
	var b [8]byte
	rand.Read(b[:])
	return ".watcher-rm-" + hex.EncodeToString(b[:])
}

// removeTree is removeAllAt for a path (its last component is not
// followed if it is a symlink).
func removeTree(path string) error {
	dir, base := filepath.Split(filepath.Clean(path))
	if dir == "" {
		dir = "."
	}
	dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return err
	}
	defer unix.Close(dfd)
	return removeAllAt(dfd, base)
}

// readNames lists the directory fd (left open), from its start: the dup
// shares the fd's offset, which an earlier listing left at the end.
func readNames(fd int) ([]string, error) {
	if _, err := unix.Seek(fd, 0, io.SeekStart); err != nil {
		return nil, err
	}
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(dup), "dir")
	defer f.Close()
	return f.Readdirnames(-1)
}

// tempName is a name for an entry being built in a real directory before
// it is renamed into place (short: the final name may be NAME_MAX long).
func tempName() string {
	var b [8]byte
	rand.Read(b[:])
	return ".watcher-commit-" + hex.EncodeToString(b[:])
}

// setTimesFd sets the access and modification times of the open fd.
func setTimesFd(fd int, st *unix.Stat_t) error {
	return unix.UtimesNanoAt(fd, "", []unix.Timespec{st.Atim, st.Mtim}, unix.AT_EMPTY_PATH)
}
