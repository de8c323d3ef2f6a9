package enforcetest

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// OverlayTwin is an overlayfs over two filesystems (two tmpfs, no xino)
// holding a directory and a file that share the overlay's device and one
// inode number: overlayfs numbers a directory inode from its own counter
// (1, 2, ...), and a file keeps its layer's number.
type OverlayTwin struct {
	Dir  string // a directory of the lower layer: the one to protect
	Key  string // a file in Dir
	Twin string // a file of the upper layer with Dir's inode number
}

// NewOverlayTwin mounts it under a temporary directory (unmounted at the
// end), or skips the test where overlayfs is missing or numbers
// differently.
func NewOverlayTwin(t *testing.T) OverlayTwin {
	t.Helper()
	RequireRoot(t)
	base := t.TempDir()
	lower, layer, merged := filepath.Join(base, "lower"), filepath.Join(base, "layer"), filepath.Join(base, "merged")
	for _, d := range []string{lower, layer, merged} {
		mustDo(t, os.Mkdir(d, 0o755))
	}
	mustDo(t, unix.Mount("tmpfs", lower, "tmpfs", 0, "mode=0755"))
	t.Cleanup(func() { unix.Unmount(lower, unix.MNT_DETACH) })
	mustDo(t, unix.Mount("tmpfs", layer, "tmpfs", 0, "mode=0755"))
	t.Cleanup(func() { unix.Unmount(layer, unix.MNT_DETACH) })
	// Directories of the lower layer take overlayfs's numbers up to those
	// the upper layer's files will get next.
	const dirs = 200
	for i := range dirs {
		mustDo(t, os.Mkdir(filepath.Join(lower, fmt.Sprintf("d%03d", i)), 0o755))
	}
	last := fmt.Sprintf("d%03d", dirs-1)
	mustDo(t, os.WriteFile(filepath.Join(lower, last, "key"), []byte("secret\n"), 0o644))
	upper, work := filepath.Join(layer, "upper"), filepath.Join(layer, "work")
	mustDo(t, os.Mkdir(upper, 0o755))
	mustDo(t, os.Mkdir(work, 0o755))
	if err := unix.Mount("overlay", merged, "overlay", 0, fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,xino=off", lower, upper, work)); err != nil {
		t.Skipf("no overlayfs here: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(merged, unix.MNT_DETACH) })
	for i := range dirs {
		var st unix.Stat_t
		mustDo(t, unix.Stat(filepath.Join(merged, fmt.Sprintf("d%03d", i)), &st))
	}
	o := OverlayTwin{Dir: filepath.Join(merged, last)}
	o.Key = filepath.Join(o.Dir, "key")
	var dirSt, keySt unix.Stat_t
	mustDo(t, unix.Stat(o.Dir, &dirSt))
	mustDo(t, unix.Stat(o.Key, &keySt))
	if dirSt.Dev == keySt.Dev {
		t.Skipf("overlayfs reports one device for directories and files here (dev %d)", dirSt.Dev)
	}
	ws := filepath.Join(merged, "ws")
	mustDo(t, os.Mkdir(ws, 0o755))
	for i := 0; i < 50000; i++ {
		p := filepath.Join(ws, fmt.Sprintf("f%d", i))
		mustDo(t, os.WriteFile(p, []byte("a workspace file\n"), 0o644))
		var st unix.Stat_t
		mustDo(t, unix.Stat(p, &st))
		if st.Ino == dirSt.Ino {
			o.Twin = p
			t.Logf("%s: dev %d ino %d; %s: a file of the same number", o.Dir, dirSt.Dev, dirSt.Ino, p)
			return o
		}
		if st.Ino > dirSt.Ino {
			t.Skipf("the upper layer's numbers (%d) passed the directory's (%d)", st.Ino, dirSt.Ino)
		}
	}
	t.Skipf("no file given the directory's number %d in 50000", dirSt.Ino)
	return o
}

func mustDo(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
