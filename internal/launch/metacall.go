package launch

// Decoding and performing one metadata call for the supervisor
// (metasuper.go): x86_64 argument layouts of linux/syscalls.h.

import (
	"encoding/binary"
	"fmt"
	"os"
	"path"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// xattrNameMax is the kernel's XATTR_NAME_MAX.
const xattrNameMax = 255

type metaKind int

const (
	metaChmod metaKind = iota
	metaChown
	metaSetxattr
	metaRemovexattr
	metaUtimes
	metaNotify // inotify_add_watch
)

// metaCall is one decoded call, its target opened with O_PATH.
type metaCall struct {
	kind     metaKind
	fd       int    // O_PATH descriptor of the file the kernel would change
	path     string // its path, as the policy names paths
	st       unix.Stat_t
	who      caller
	mode     uint32
	uid, gid int
	name     string // xattr name
	value    []byte
	flags    int
	times    *[2]unix.Timespec // nil: now
	notifyFd int               // inotify_add_watch: the caller's inotify descriptor
	mask     uint32            // and its mask
	result   int64             // what the call returns when performed (a watch descriptor)
}

func (c *metaCall) close() { unix.Close(c.fd) }

// target says where a call's file is: a path relative to a directory fd
// (AT_FDCWD: the cwd), or the descriptor itself.
type target struct {
	dirfd    int64
	pathPtr  uint64 // 0: no path (the descriptor itself)
	nofollow bool
	empty    bool // AT_EMPTY_PATH
}

func (s *metaSupervisor) decode(req *seccompNotif, name string) (*metaCall, error) {
	a := req.Data.Args
	tid := int(req.PID)
	c := &metaCall{fd: -1}
	var t target
	fdTarget := func(i int) target { return target{dirfd: int64(int32(a[i])), empty: true} }
	switch name {
	case "chmod":
		c.kind, t, c.mode = metaChmod, target{dirfd: unix.AT_FDCWD, pathPtr: a[0]}, uint32(a[1])
	case "fchmod":
		c.kind, t, c.mode = metaChmod, fdTarget(0), uint32(a[1])
	case "fchmodat":
		c.kind, t, c.mode = metaChmod, target{dirfd: int64(int32(a[0])), pathPtr: a[1]}, uint32(a[2])
	case "fchmodat2":
		c.kind, c.mode = metaChmod, uint32(a[2])
		t = atTarget(a[0], a[1], a[3])
	case "chown", "lchown":
		c.kind, t = metaChown, target{dirfd: unix.AT_FDCWD, pathPtr: a[0], nofollow: name == "lchown"}
		c.uid, c.gid = int(int32(a[1])), int(int32(a[2]))
	case "fchown":
		c.kind, t = metaChown, fdTarget(0)
		c.uid, c.gid = int(int32(a[1])), int(int32(a[2]))
	case "fchownat":
		c.kind, t = metaChown, atTarget(a[0], a[1], a[4])
		c.uid, c.gid = int(int32(a[2])), int(int32(a[3]))
	case "setxattr", "lsetxattr", "fsetxattr":
		c.kind = metaSetxattr
		if name == "fsetxattr" {
			t = fdTarget(0)
		} else {
			t = target{dirfd: unix.AT_FDCWD, pathPtr: a[0], nofollow: name == "lsetxattr"}
		}
		if a[3] > xattrMax {
			return nil, unix.E2BIG
		}
		var err error
		if c.name, err = readString(tid, a[1], xattrNameMax+1); err != nil {
			return nil, err
		}
		if c.value, err = readMem(tid, a[2], int(a[3])); err != nil {
			return nil, err
		}
		c.flags = int(a[4])
	case "removexattr", "lremovexattr", "fremovexattr":
		c.kind = metaRemovexattr
		if name == "fremovexattr" {
			t = fdTarget(0)
		} else {
			t = target{dirfd: unix.AT_FDCWD, pathPtr: a[0], nofollow: name == "lremovexattr"}
		}
		var err error
		if c.name, err = readString(tid, a[1], xattrNameMax+1); err != nil {
			return nil, err
		}
	case "utime", "utimes", "futimesat":
		c.kind = metaUtimes
		t = target{dirfd: unix.AT_FDCWD, pathPtr: a[0]}
		tp := a[1]
		if name == "futimesat" {
			t, tp = target{dirfd: int64(int32(a[0])), pathPtr: a[1]}, a[2]
		}
		if tp != 0 {
			var err error
			if c.times, err = readOldTimes(tid, tp, name == "utime"); err != nil {
				return nil, err
			}
		}
	case "utimensat":
		c.kind = metaUtimes
		t = atTarget(a[0], a[1], a[3])
		if a[1] == 0 {
			t.empty = true // futimens: the descriptor itself
		}
		if a[2] != 0 {
			b, err := readMem(tid, a[2], 32)
			if err != nil {
				return nil, err
			}
			var ts [2]unix.Timespec
			for i := range ts {
				ts[i].Sec = int64(binary.LittleEndian.Uint64(b[16*i:]))
				ts[i].Nsec = int64(binary.LittleEndian.Uint64(b[16*i+8:]))
			}
			c.times = &ts
		}
	case "inotify_add_watch":
		c.kind, c.notifyFd, c.mask = metaNotify, int(int32(a[0])), uint32(a[2])
		t = target{dirfd: unix.AT_FDCWD, pathPtr: a[1], nofollow: c.mask&unix.IN_DONT_FOLLOW != 0}
	default:
		// setxattrat and removexattrat (6.13): callers fall back to the
		// older calls on ENOSYS.
		return nil, unix.ENOSYS
	}
	who, err := readCaller(tid)
	if err != nil {
		return nil, unix.ESRCH
	}
	c.who = who
	if err := c.open(tid, t); err != nil {
		return nil, err
	}
	return c, nil
}

func atTarget(dirfd, pathPtr, flags uint64) target {
	return target{dirfd: int64(int32(dirfd)), pathPtr: pathPtr,
		nofollow: flags&unix.AT_SYMLINK_NOFOLLOW != 0, empty: flags&unix.AT_EMPTY_PATH != 0}
}

// open resolves t as the kernel would for thread tid: an absolute path in
// its root, a relative one from its cwd or directory descriptor, both
// inside its root (RESOLVE_IN_ROOT: ".." and absolute symlinks stop at the
// command's root, as for the command).
func (c *metaCall) open(tid int, t target) error {
	proc := "/proc/" + strconv.Itoa(tid)
	// Paths read through /proc links are built from the supervisor's
	// root: where the command's root is elsewhere (a chroot, another mount
	// namespace's root), they carry that root's path as a prefix.
	rootPrefix, err := os.Readlink(proc + "/root")
	if err != nil {
		return unix.ESRCH
	}
	rootPrefix = strings.TrimSuffix(rootPrefix, "/")
	inRoot := func(p string) (string, bool) {
		if rootPrefix == "" {
			return p, true
		}
		if p == rootPrefix {
			return "/", true
		}
		rest, ok := strings.CutPrefix(p, rootPrefix+"/")
		return "/" + rest, ok
	}
	dirLink := proc + "/cwd"
	if t.dirfd != unix.AT_FDCWD {
		dirLink = proc + "/fd/" + strconv.FormatInt(t.dirfd, 10)
	}
	var p string
	if t.pathPtr != 0 {
		var err error
		if p, err = readString(tid, t.pathPtr, unix.PathMax); err != nil {
			return err
		}
	}
	var fd int
	if p == "" {
		if !t.empty {
			return unix.ENOENT
		}
		fd, err = unix.Open(dirLink, unix.O_PATH|unix.O_CLOEXEC, 0)
	} else {
		if !strings.HasPrefix(p, "/") {
			dir, lerr := os.Readlink(dirLink)
			if lerr != nil || !strings.HasPrefix(dir, "/") {
				return unix.EPERM
			}
			if dir, ok := inRoot(dir); ok {
				p = path.Join(dir, p)
			} else {
				return unix.EPERM
			}
		}
		root, rerr := unix.Open(proc+"/root", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if rerr != nil {
			return unix.ESRCH
		}
		flags := uint64(unix.O_PATH | unix.O_CLOEXEC)
		if t.nofollow {
			flags |= unix.O_NOFOLLOW
		}
		fd, err = unix.Openat2(root, strings.TrimPrefix(p, "/"), &unix.OpenHow{Flags: flags, Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS})
		unix.Close(root)
	}
	if err != nil {
		return err
	}
	c.fd = fd
	resolved, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil || !strings.HasPrefix(resolved, "/") || strings.HasSuffix(resolved, " (deleted)") {
		// A file with no name the policy could judge.
		c.path = resolved
		return unix.EPERM
	}
	if resolved, ok := inRoot(resolved); ok {
		c.path = resolved
	} else {
		c.path = resolved
		return unix.EPERM // outside the command's root: not a file it named
	}
	if err := unix.Fstatat(fd, "", &c.st, unix.AT_EMPTY_PATH); err != nil {
		return err
	}
	return nil
}

// Capabilities the checks below need (linux/capability.h).
const (
	capChown         = 0
	capDACOverride   = 1
	capDACReadSearch = 2
	capFowner        = 3
	capFsetid        = 4
)

// perform makes the change on c.fd, after the checks the kernel would
// make with the command's credentials (the supervisor holds more).
func (c *metaCall) perform() error {
	owner := c.who.fsuid == c.st.Uid
	isLink := c.st.Mode&unix.S_IFMT == unix.S_IFLNK
	self := "/proc/self/fd/" + strconv.Itoa(c.fd)
	switch c.kind {
	case metaChmod:
		if isLink {
			return unix.EOPNOTSUPP
		}
		if !owner && !c.who.has(capFowner) {
			return fmt.Errorf("chmod of a file the caller does not own without CAP_FOWNER: %w", unix.EPERM)
		}
		mode := c.mode & 0o7777
		if !c.who.has(capFsetid) && !c.who.inGroup(c.st.Gid) {
			mode &^= unix.S_ISGID
		}
		return unix.Fchmodat(unix.AT_FDCWD, self, mode, 0)
	case metaChown:
		uidOK := c.uid == -1 || (owner && uint32(c.uid) == c.st.Uid) || c.who.has(capChown)
		gidOK := c.gid == -1 || (owner && (uint32(c.gid) == c.st.Gid || c.who.inGroup(uint32(c.gid)))) || c.who.has(capChown)
		if !uidOK || !gidOK {
			return fmt.Errorf("chown without CAP_CHOWN: %w", unix.EPERM)
		}
		return unix.Fchownat(c.fd, "", c.uid, c.gid, unix.AT_EMPTY_PATH)
	case metaSetxattr, metaRemovexattr:
		// Only the user namespace and POSIX ACLs: security.capability
		// would carry file capabilities, trusted.* and security.* need
		// privilege the command may lack.
		if ft := c.st.Mode & unix.S_IFMT; ft != unix.S_IFREG && ft != unix.S_IFDIR {
			return unix.EPERM
		}
		switch {
		case c.name == "system.posix_acl_access" || c.name == "system.posix_acl_default":
			// POSIX ACLs are permission bits (sed -i and cp -p copy
			// them): the kernel asks what chmod asks.
			if !owner && !c.who.has(capFowner) {
				return fmt.Errorf("ACL of a file the caller does not own without CAP_FOWNER: %w", unix.EPERM)
			}
		case strings.HasPrefix(c.name, "user."):
			if !(owner && c.st.Mode&0o200 != 0) && !c.who.has(capDACOverride) {
				return unix.EACCES
			}
		default:
			return fmt.Errorf("xattr %q outside user.* and POSIX ACLs: %w", c.name, unix.EPERM)
		}
		if c.kind == metaSetxattr {
			return unix.Setxattr(self, c.name, c.value, c.flags)
		}
		return unix.Removexattr(self, c.name)
	case metaUtimes:
		now := c.times == nil || (c.times[0].Nsec == unix.UTIME_NOW && c.times[1].Nsec == unix.UTIME_NOW)
		if !owner && !c.who.has(capFowner) {
			if !now {
				return fmt.Errorf("setting times of a file the caller does not own: %w", unix.EPERM)
			}
			if !c.who.has(capDACOverride) && !c.writableBy() {
				return unix.EACCES
			}
		}
		var ts []unix.Timespec
		if c.times != nil {
			ts = c.times[:]
		} else {
			ts = []unix.Timespec{{Nsec: unix.UTIME_NOW}, {Nsec: unix.UTIME_NOW}}
		}
		return unix.UtimesNanoAt(c.fd, "", ts, unix.AT_EMPTY_PATH)
	case metaNotify:
		return c.addWatch()
	}
	return unix.ENOSYS
}

// addWatch adds the watch to the caller's own inotify instance (a copy of
// its descriptor, pidfd_getfd) on the file resolved and judged, not on
// the path in the caller's memory, which another thread could change.
func (c *metaCall) addWatch() error {
	pidfd, err := unix.PidfdOpen(c.who.tgid, 0)
	if err != nil {
		return unix.ESRCH
	}
	defer unix.Close(pidfd)
	ifd, err := unix.PidfdGetfd(pidfd, c.notifyFd, 0)
	if err != nil {
		return unix.EBADF
	}
	defer unix.Close(ifd)
	// Read access, as the kernel asks of the caller (the supervisor holds
	// more): the file must be readable by it.
	if !c.who.has(capDACOverride) && !c.who.has(capDACReadSearch) && !c.readableBy() {
		return unix.EACCES
	}
	// The descriptor is the file already resolved (no-follow honoured):
	// the magic link is followed to it whatever the mask says.
	wd, err := unix.InotifyAddWatch(ifd, "/proc/self/fd/"+strconv.Itoa(c.fd), c.mask&^unix.IN_DONT_FOLLOW)
	if err != nil {
		return err
	}
	c.result = int64(wd)
	return nil
}

// readableBy reports whether the mode bits let the caller read the file.
func (c *metaCall) readableBy() bool {
	switch {
	case c.who.fsuid == c.st.Uid:
		return c.st.Mode&0o400 != 0
	case c.who.inGroup(c.st.Gid):
		return c.st.Mode&0o040 != 0
	}
	return c.st.Mode&0o004 != 0
}

// writableBy reports whether the mode bits let the caller write the file.
func (c *metaCall) writableBy() bool {
	switch {
	case c.who.fsuid == c.st.Uid:
		return c.st.Mode&0o200 != 0
	case c.who.inGroup(c.st.Gid):
		return c.st.Mode&0o020 != 0
	}
	return c.st.Mode&0o002 != 0
}

// readMem copies n bytes at addr out of thread tid's memory.
func readMem(tid int, addr uint64, n int) ([]byte, error) {
	if n == 0 {
		return nil, nil
	}
	buf := make([]byte, n)
	local := []unix.Iovec{{Base: &buf[0], Len: uint64(n)}}
	remote := []unix.RemoteIovec{{Base: uintptr(addr), Len: n}}
	got, err := unix.ProcessVMReadv(tid, local, remote, 0)
	if err != nil {
		return nil, unix.EFAULT
	}
	if got != n {
		return nil, unix.EFAULT
	}
	return buf, nil
}

// readString copies a NUL-terminated string of at most max bytes, page by
// page (the string may end just before an unmapped page).
func readString(tid int, addr uint64, max int) (string, error) {
	var out []byte
	for len(out) < max {
		chunk := 4096 - int(addr%4096)
		if chunk > max-len(out) {
			chunk = max - len(out)
		}
		b, err := readMem(tid, addr, chunk)
		if err != nil {
			return "", err
		}
		if i := indexNUL(b); i >= 0 {
			return string(append(out, b[:i]...)), nil
		}
		out = append(out, b...)
		addr += uint64(chunk)
	}
	return "", unix.ENAMETOOLONG
}

func indexNUL(b []byte) int {
	for i, c := range b {
		if c == 0 {
			return i
		}
	}
	return -1
}

// readOldTimes reads utime's struct utimbuf (two longs, seconds) or utimes'
// struct timeval[2].
func readOldTimes(tid int, addr uint64, utimbuf bool) (*[2]unix.Timespec, error) {
	size := 32
	if utimbuf {
		size = 16
	}
	b, err := readMem(tid, addr, size)
	if err != nil {
		return nil, err
	}
	var ts [2]unix.Timespec
	for i := range ts {
		if utimbuf {
			ts[i].Sec = int64(binary.LittleEndian.Uint64(b[8*i:]))
			continue
		}
		ts[i].Sec = int64(binary.LittleEndian.Uint64(b[16*i:]))
		usec := int64(binary.LittleEndian.Uint64(b[16*i+8:]))
		if usec < 0 || usec >= 1e6 {
			return nil, unix.EINVAL
		}
		ts[i].Nsec = usec * 1000
	}
	return &ts, nil
}
