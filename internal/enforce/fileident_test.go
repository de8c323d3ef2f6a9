package enforce

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// fsIocGetversion is FS_IOC_GETVERSION (_IOR('v', 1, long)): ext2/3/4,
// xfs and f2fs answer it with i_generation.
const fsIocGetversion = 0x80087601

func getversion(t *testing.T, p string) (uint32, bool) {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var g uint32
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), fsIocGetversion, uintptr(unsafe.Pointer(&g))); e != 0 {
		return 0, false
	}
	return g, true
}

// TestIdentifyFileGeneration: the generation read from the file handle is
// the inode's i_generation (FS_IOC_GETVERSION where the filesystem answers
// it), and a file given a freed inode number again has another one.
func TestIdentifyFileGeneration(t *testing.T) {
	dir := t.TempDir()
	var sfs unix.Statfs_t
	if err := unix.Statfs(dir, &sfs); err != nil {
		t.Fatal(err)
	}
	a := filepath.Join(dir, "a")
	if err := os.WriteFile(a, []byte("a\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	id, err := IdentifyFile(a, true)
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(a, &st); err != nil {
		t.Fatal(err)
	}
	if id.Ino != st.Ino || id.Dev != st.Dev {
		t.Fatalf("identified ino %d dev %d, stat says %d %d", id.Ino, id.Dev, st.Ino, st.Dev)
	}
	switch uint32(sfs.Type) {
	case ext4Magic, xfsMagic, f2fsMagic, tmpfsMagic:
		if id.Generation == GenerationAny {
			t.Fatalf("no generation read on filesystem %#x", sfs.Type)
		}
	default:
		t.Logf("filesystem %#x: generation %#x", sfs.Type, id.Generation)
	}
	if g, ok := getversion(t, a); ok && g != id.Generation {
		t.Errorf("generation %#x from the handle, FS_IOC_GETVERSION says %#x", id.Generation, g)
	} else if ok {
		t.Logf("generation %#x agrees with FS_IOC_GETVERSION", g)
	}

	// The number again, for another file (ext4, xfs: the next file
	// created in the directory's group).
	if err := os.Remove(a); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 1000; i++ {
		p := filepath.Join(dir, fmt.Sprintf("n%d", i))
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		again, err := IdentifyFile(p, true)
		if err != nil {
			t.Fatal(err)
		}
		if again.Ino != id.Ino {
			continue
		}
		if again.Generation == id.Generation && id.Generation != GenerationAny {
			t.Fatalf("inode %d given again with the same generation %#x", id.Ino, id.Generation)
		}
		t.Logf("inode %d given again: generation %#x, was %#x", id.Ino, again.Generation, id.Generation)
		return
	}
	t.Logf("inode %d not given again here (filesystem %#x)", id.Ino, sfs.Type)
}

// TestIdentifyFileTmpfs: tmpfs (and devtmpfs, /dev/shm) encode handles of
// their own layout; a mount of its own for the test.
func TestIdentifyFileTmpfs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (mount)")
	}
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Skipf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	seen := map[uint32]bool{}
	for _, n := range []string{"a", "b", "c"} {
		p := filepath.Join(dir, n)
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		id, err := IdentifyFile(p, true)
		if err != nil {
			t.Fatal(err)
		}
		if id.Generation == GenerationAny {
			t.Fatalf("%s: no generation on tmpfs", p)
		}
		seen[id.Generation] = true
	}
	if len(seen) != 3 {
		t.Errorf("three tmpfs files, generations %v: not drawn per file", seen)
	}
}

// TestIdentifyFileKinds: symlinks (followed or not), FIFOs and sockets
// are identified without opening them; missing files say so; a
// filesystem without file handles gives GenerationAny.
func TestIdentifyFileKinds(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "target")
	if err := os.WriteFile(target, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "sock")
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: sock}); err != nil {
		t.Fatal(err)
	}
	ti, err := IdentifyFile(target, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path   string
		follow bool
		mode   uint32
	}{
		{link, true, unix.S_IFREG}, {link, false, unix.S_IFLNK},
		{fifo, true, unix.S_IFIFO}, {sock, true, unix.S_IFSOCK},
	} {
		id, err := IdentifyFile(c.path, c.follow)
		if err != nil {
			t.Errorf("%s: %v", c.path, err)
			continue
		}
		if id.Mode&unix.S_IFMT != c.mode {
			t.Errorf("%s (follow %v): mode %#o, want %#o", c.path, c.follow, id.Mode&unix.S_IFMT, c.mode)
		}
		if c.follow && c.path == link && (id.Ino != ti.Ino || id.Generation != ti.Generation) {
			t.Errorf("%s followed: %+v, want the target's %+v", c.path, id, ti)
		}
	}
	if _, err := IdentifyFile(filepath.Join(dir, "missing"), true); !errors.Is(err, fs.ErrNotExist) || !errors.Is(err, unix.ENOENT) {
		t.Errorf("missing file: %v, want ENOENT", err)
	}
	if id, err := IdentifyFile("/proc/self/status", true); err != nil || id.Generation != GenerationAny {
		t.Errorf("/proc/self/status: %+v %v, want GenerationAny (procfs has no file handles)", id.Generation, err)
	}
}

// TestParseHandle checks the layouts, and that anything else reads as
// unknown rather than as a wrong generation.
func TestParseHandle(t *testing.T) {
	for _, c := range []struct {
		name  string
		magic uint32
		typ   int32
		b     []byte
		gen   uint32
		ino   uint64
		ok    bool
	}{
		{"ext4", ext4Magic, 1, []byte{0x6c, 0x40, 0x98, 0x00, 0x55, 0xf5, 0xf1, 0x63}, 0x63f1f555, 9977964, true},
		{"tmpfs", tmpfsMagic, 1, []byte{0x5f, 0xd2, 0x45, 0xb6, 2, 0, 0, 0, 1, 0, 0, 0}, 0xb645d25f, 1<<32 | 2, true},
		{"xfs32", xfsMagic, 1, []byte{0x80, 0, 0, 0, 7, 0, 0, 0}, 7, 128, true},
		{"xfs64", xfsMagic, 0x81, []byte{0x80, 0, 0, 0, 1, 0, 0, 0, 9, 0, 0, 0}, 9, 1<<32 | 128, true},
		{"ext4 with parent", ext4Magic, 2, make([]byte, 16), 0, 0, false},
		{"ext4 short", ext4Magic, 1, make([]byte, 4), 0, 0, false},
		{"tmpfs with ext4 length", tmpfsMagic, 1, make([]byte, 8), 0, 0, false},
		{"fuse 0x81", 0x65735546, 0x81, make([]byte, 12), 0, 0, false},
		{"btrfs", 0x9123683e, 0x4d, make([]byte, 20), 0, 0, false},
		{"overlayfs", 0x794c7630, 0xf8, make([]byte, 40), 0, 0, false},
	} {
		gen, ino, ok := parseHandle(c.magic, c.typ, c.b)
		if ok != c.ok || (ok && (gen != c.gen || ino != c.ino)) {
			t.Errorf("%s: gen %#x ino %d ok %v, want %#x %d %v", c.name, gen, ino, ok, c.gen, c.ino, c.ok)
		}
	}
}
