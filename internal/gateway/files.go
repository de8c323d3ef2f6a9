package gateway

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/watcherhq/watcher/pkg/toolproto"
	"golang.org/x/sys/unix"
)

// Root is a directory the file tools are confined to. Every path is
// resolved by the kernel (openat2) relative to a descriptor of the root
// with RESOLVE_BENEATH (no "..", absolute path or absolute symlink may
// leave it), RESOLVE_NO_MAGICLINKS (no /proc/PID/fd or /proc/PID/root
// jumps), RESOLVE_NO_XDEV (no mount inside the root leads elsewhere) and,
// unless symlinks are followed, RESOLVE_NO_SYMLINKS. Nothing is decided by
// comparing strings.
type Root struct {
	// Dir is the absolute path of the root (a workspace, the exchange).
	Dir string
	// FollowSymlinks follows symbolic links that stay beneath Dir.
	FollowSymlinks bool
	// Check, when set, judges the resolved path (as the kernel names the
	// opened file) before it is read or written: the sandbox's file rules
	// apply to the gateway's opens as to the sandbox's own.
	Check func(resolved string, write bool) error
}

// PathError is a path the kernel refused or could not find.
type PathError struct {
	Path  string
	Errno unix.Errno
	Type  string // toolproto.TypeOutside, toolproto.TypeSymlink, toolproto.TypeHardlink, toolproto.TypeNotRegular, toolproto.TypeNotFound, toolproto.TypeDenied
	Msg   string
	Rule  string // the file rule, for toolproto.TypeDenied
}

func (e *PathError) Error() string { return fmt.Sprintf("%s: %s", e.Path, e.Msg) }

func (r Root) resolve() uint64 {
	how := uint64(unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV)
	if !r.FollowSymlinks {
		how |= unix.RESOLVE_NO_SYMLINKS
	}
	return how
}

// rel turns the caller's path into one relative to the root: a path that
// starts with the root's own absolute path is taken relative to it (only to
// pick the starting point; the kernel still resolves every component).
// Anything else absolute is passed as is, and the kernel refuses it.
func (r Root) rel(p string) string {
	if p == r.Dir {
		return "."
	}
	if strings.HasPrefix(p, r.Dir+"/") {
		return strings.TrimLeft(p[len(r.Dir):], "/")
	}
	return p
}

func (r Root) openDir() (int, error) {
	fd, err := unix.Open(r.Dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open root %s: %w", r.Dir, err)
	}
	return fd, nil
}

// open resolves p beneath the root with flags.
func (r Root) open(p string, flags int, mode uint32) (int, error) {
	if p == "" {
		return -1, &PathError{Path: p, Type: toolproto.TypeNotFound, Errno: unix.ENOENT, Msg: "empty path"}
	}
	root, err := r.openDir()
	if err != nil {
		return -1, err
	}
	defer unix.Close(root)
	return r.openAt(root, p, flags, mode)
}

func (r Root) openAt(dirfd int, p string, flags int, mode uint32) (int, error) {
	rel := r.rel(p)
	for {
		fd, err := unix.Openat2(dirfd, rel, &unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Mode: uint64(mode), Resolve: r.resolve()})
		if err == unix.EINTR || err == unix.EAGAIN {
			continue // EAGAIN: a rename raced the walk; retry
		}
		if err != nil {
			return -1, pathError(p, err)
		}
		return fd, nil
	}
}

func pathError(p string, err error) error {
	var errno unix.Errno
	if !errors.As(err, &errno) {
		return fmt.Errorf("%s: %w", p, err)
	}
	pe := &PathError{Path: p, Errno: errno}
	switch errno {
	case unix.EXDEV:
		pe.Type, pe.Msg = toolproto.TypeOutside, "refused by the kernel: the path resolves outside the workspace (EXDEV)"
	case unix.ELOOP:
		pe.Type, pe.Msg = toolproto.TypeSymlink, "refused by the kernel: the path goes through a symbolic link, which this sandbox's file tools do not follow (ELOOP)"
	case unix.ENOENT:
		pe.Type, pe.Msg = toolproto.TypeNotFound, "no such file or directory"
	case unix.ENOTDIR:
		pe.Type, pe.Msg = toolproto.TypeNotFound, "a component of the path is not a directory"
	case unix.EISDIR:
		pe.Type, pe.Msg = toolproto.TypeNotRegular, "is a directory"
	default:
		pe.Type, pe.Msg = toolproto.TypeToolFailed, errno.Error()
	}
	return pe
}

// resolved is the kernel's name of an open descriptor.
func resolved(fd int) (string, error) {
	p, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil {
		return "", fmt.Errorf("name of the opened file: %w", err)
	}
	return p, nil
}

func (r Root) check(p string, fd int, base string, write bool) error {
	if r.Check == nil {
		return nil
	}
	name, err := resolved(fd)
	if err != nil {
		return err
	}
	if base != "" {
		name = filepath.Join(name, base)
	}
	if err := r.Check(name, write); err != nil {
		if pe, ok := err.(*PathError); ok {
			pe.Path = p
		}
		return err
	}
	return nil
}

// openRegular opens an existing regular file for reading: resolved as
// O_PATH first (no open side effects on devices or FIFOs), checked, then
// reopened through its own descriptor.
func (r Root) openRegular(p string) (*os.File, unix.Stat_t, error) {
	var st unix.Stat_t
	pfd, err := r.open(p, unix.O_PATH, 0)
	if err != nil {
		return nil, st, err
	}
	defer unix.Close(pfd)
	if err := unix.Fstat(pfd, &st); err != nil {
		return nil, st, fmt.Errorf("%s: fstat: %w", p, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, st, &PathError{Path: p, Type: toolproto.TypeNotRegular, Msg: "not a regular file (" + fileType(st.Mode) + ")"}
	}
	// A hard link names the inode of a file that may live anywhere on the
	// file system; the walk cannot tell where else it is linked.
	if st.Nlink > 1 {
		return nil, st, &PathError{Path: p, Type: toolproto.TypeHardlink, Msg: fmt.Sprintf("refused: the file has %d hard links and may be a file outside the workspace", st.Nlink)}
	}
	if err := r.check(p, pfd, "", false); err != nil {
		return nil, st, err
	}
	fd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(pfd), unix.O_RDONLY|unix.O_NOCTTY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, st, fmt.Errorf("%s: reopen: %w", p, err)
	}
	var st2 unix.Stat_t
	if err := unix.Fstat(fd, &st2); err != nil || st2.Ino != st.Ino || st2.Dev != st.Dev {
		unix.Close(fd)
		return nil, st, fmt.Errorf("%s: the file changed while it was opened", p)
	}
	return os.NewFile(uintptr(fd), p), st, nil
}

func fileType(m uint32) string {
	switch m & unix.S_IFMT {
	case unix.S_IFDIR:
		return "directory"
	case unix.S_IFLNK:
		return "symlink"
	case unix.S_IFIFO:
		return "fifo"
	case unix.S_IFSOCK:
		return "socket"
	case unix.S_IFCHR:
		return "character device"
	case unix.S_IFBLK:
		return "block device"
	case unix.S_IFREG:
		return "file"
	}
	return "unknown"
}

// ReadFile reads at most max bytes of p from offset.
func (r Root) ReadFile(p string, offset int64, max int) (*toolproto.FileContent, error) {
	f, st, err := r.openRegular(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if offset < 0 {
		offset = 0
	}
	buf := make([]byte, max+1)
	n, err := f.ReadAt(buf, offset)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s: read: %w", p, err)
	}
	out := &toolproto.FileContent{Path: p, Size: st.Size, Offset: offset, Truncated: n > max}
	buf = buf[:min(n, max)]
	sum := sha256.Sum256(buf)
	out.SHA256 = hex.EncodeToString(sum[:])
	if utf8.Valid(buf) {
		out.Content, out.Encoding = string(buf), "utf-8"
	} else {
		out.Content, out.Encoding = base64.StdEncoding.EncodeToString(buf), "base64"
	}
	return out, nil
}

// WriteFile replaces p with data atomically: the parent directory is
// resolved beneath the root, a new file is created in it (O_EXCL, owned
// like the directory) and renamed over the name. The rename replaces the
// name, so a hard link or symlink at p is replaced, never written through.
func (r Root) WriteFile(p string, data []byte) (*toolproto.WriteResult, error) {
	rel := r.rel(p)
	dir, base := filepath.Split(rel)
	if base == "" || base == "." || base == ".." {
		return nil, &PathError{Path: p, Type: toolproto.TypeNotRegular, Msg: "not a file name"}
	}
	if dir == "" {
		dir = "."
	}
	dfd, err := r.open(dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		if pe, ok := err.(*PathError); ok {
			pe.Path = p
		}
		return nil, err
	}
	defer unix.Close(dfd)
	if err := r.check(p, dfd, base, true); err != nil {
		return nil, err
	}
	var dst unix.Stat_t
	if err := unix.Fstat(dfd, &dst); err != nil {
		return nil, fmt.Errorf("%s: fstat parent: %w", p, err)
	}
	mode := uint32(0o644)
	created := true
	var old unix.Stat_t
	if err := unix.Fstatat(dfd, base, &old, unix.AT_SYMLINK_NOFOLLOW); err == nil {
		if old.Mode&unix.S_IFMT == unix.S_IFDIR {
			return nil, &PathError{Path: p, Type: toolproto.TypeNotRegular, Msg: "is a directory"}
		}
		if old.Mode&unix.S_IFMT == unix.S_IFREG {
			mode = old.Mode & 0o777
		}
		created = false
	}
	rb := make([]byte, 6)
	rand.Read(rb)
	tmp := ".watcher-tmp-" + hex.EncodeToString(rb)
	fd, err := unix.Openat(dfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
	if err != nil {
		return nil, fmt.Errorf("%s: create: %w", p, err)
	}
	f := os.NewFile(uintptr(fd), tmp)
	fail := func(err error) (*toolproto.WriteResult, error) {
		f.Close()
		unix.Unlinkat(dfd, tmp, 0)
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	if _, err := f.Write(data); err != nil {
		return fail(err)
	}
	// Owned like its directory: the sandboxed agent can edit what it asked
	// the gateway to write.
	if err := unix.Fchown(fd, int(dst.Uid), int(dst.Gid)); err != nil {
		return fail(err)
	}
	if err := unix.Fchmod(fd, mode); err != nil {
		return fail(err)
	}
	if err := f.Sync(); err != nil {
		return fail(err)
	}
	if err := unix.Renameat(dfd, tmp, dfd, base); err != nil {
		return fail(err)
	}
	f.Close()
	sum := sha256.Sum256(data)
	return &toolproto.WriteResult{Path: p, Bytes: len(data), Created: created, SHA256: hex.EncodeToString(sum[:])}, nil
}

// ListDir lists at most max entries of directory p.
func (r Root) ListDir(p string, max int) (*toolproto.Listing, error) {
	if p == "" {
		p = "."
	}
	fd, err := r.open(p, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	if err := r.check(p, fd, "", false); err != nil {
		return nil, err
	}
	names, err := f.Readdirnames(max + 1)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	out := &toolproto.Listing{Path: p, Entries: []toolproto.DirEntry{}}
	if len(names) > max {
		names, out.Truncated = names[:max], true
	}
	sort.Strings(names)
	for _, n := range names {
		var st unix.Stat_t
		e := toolproto.DirEntry{Name: n, Type: "unknown"}
		if unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
			e.Type, e.Size = fileType(st.Mode), st.Size
		}
		out.Entries = append(out.Entries, e)
	}
	return out, nil
}
