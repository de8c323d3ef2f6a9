package workspace

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// layouts runs f with the state directory on the workspace's filesystem
// (commit renames upper files into place) and on a tmpfs (commit copies).
func layouts(t *testing.T, f func(t *testing.T, base, state string)) {
	for _, across := range []bool{false, true} {
		name := map[bool]string{false: "same-fs", true: "across-fs"}[across]
		t.Run(name, func(t *testing.T) {
			needRoot(t)
			base := t.TempDir()
			state := filepath.Join(base, "state")
			if across {
				if err := os.MkdirAll(state, 0o700); err != nil {
					t.Fatal(err)
				}
				if err := unix.Mount("tmpfs", state, "tmpfs", 0, "size=16m"); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { unix.Unmount(state, unix.MNT_DETACH) })
			}
			f(t, base, state)
		})
	}
}

var time1 = time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)

func openMounted(t *testing.T, state, real string) *Workspace {
	t.Helper()
	w, err := Open(state, "sb", []string{real})
	if err != nil {
		t.Fatal(err)
	}
	mount(t, w)
	t.Cleanup(func() { unix.Unmount(w.Layers[0].Merged, unix.MNT_DETACH) })
	return w
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// capV2 is a valid VFS_CAP_REVISION_2 security.capability value granting
// CAP_NET_BIND_SERVICE, effective.
func capV2() []byte {
	var b bytes.Buffer
	for _, v := range []uint32{0x02000000 | 1, 1 << unix.CAP_NET_BIND_SERVICE, 0, 0, 0} {
		binary.Write(&b, binary.LittleEndian, v)
	}
	return b.Bytes()
}

// userXattrs reports whether the filesystems of dirs take user.*
// extended attributes (tmpfs before 6.6 does not).
func userXattrs(t *testing.T, dirs ...string) bool {
	t.Helper()
	for _, d := range dirs {
		p := filepath.Join(d, ".xattr-probe")
		write(t, p, "")
		err := unix.Setxattr(p, "user.probe", []byte("1"), 0)
		os.Remove(p)
		if err != nil {
			t.Logf("no user.* xattrs on %s (%v): not checked", d, err)
			return false
		}
	}
	return true
}

func statOf(t *testing.T, p string) *unix.Stat_t {
	t.Helper()
	st, err := lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func noTemporaries(t *testing.T, dir string) {
	t.Helper()
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && strings.HasPrefix(d.Name(), ".watcher-commit-") {
			t.Errorf("temporary %s left behind", p)
		}
		return nil
	})
}

// TestCommitWithholdsPrivilege: setuid and setgid bits, file
// capabilities, device nodes, FIFOs, sockets and owners the real
// directory would not give stay out of it, and the result says so.
func TestCommitWithholdsPrivilege(t *testing.T) {
	layouts(t, func(t *testing.T, base, state string) {
		const uid, gid = 4242, 4343
		real := filepath.Join(base, "real")
		write(t, filepath.Join(real, "victim.txt"), "keep me\n")
		write(t, filepath.Join(real, "rootfile"), "root's\n")
		must(t, os.Chmod(filepath.Join(real, "rootfile"), 0o666))
		write(t, filepath.Join(real, "helper"), "#!/bin/sh\n")
		must(t, os.Chown(filepath.Join(real, "helper"), uid, gid))
		must(t, unix.Chmod(filepath.Join(real, "helper"), 0o4755)) // after chown, which clears it
		must(t, os.Chown(filepath.Join(real, "victim.txt"), uid, gid))
		must(t, os.Chown(real, uid, gid))
		userX := userXattrs(t, real, state)
		w := openMounted(t, state, real)
		m := w.Layers[0].Merged
		mk := func(name, content string, mode os.FileMode) {
			write(t, filepath.Join(m, name), content)
			must(t, os.Chown(filepath.Join(m, name), uid, gid))
			must(t, os.Chmod(filepath.Join(m, name), mode))
		}
		mk("suid", "suid\n", 0o755|os.ModeSetuid)
		mk("sgid", "sgid\n", 0o755|os.ModeSetgid)
		mk("both", "both\n", 0o711|os.ModeSetuid|os.ModeSetgid)
		mk("capbin", "caps\n", 0o755)
		must(t, unix.Setxattr(filepath.Join(m, "capbin"), "security.capability", capV2(), 0))
		if userX {
			must(t, unix.Setxattr(filepath.Join(m, "capbin"), "user.note", []byte("kept"), 0))
		}
		if _, err := unix.Getxattr(filepath.Join(m, "capbin"), "security.capability", make([]byte, 64)); err != nil {
			t.Fatalf("the overlay did not take the capability: %v", err)
		}
		must(t, unix.Mknod(filepath.Join(m, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
		must(t, unix.Mknod(filepath.Join(m, "loop"), unix.S_IFBLK|0o660, int(unix.Mkdev(7, 0))))
		must(t, unix.Mkfifo(filepath.Join(m, "pipe"), 0o644))
		must(t, os.Remove(filepath.Join(m, "victim.txt")))
		must(t, unix.Mknod(filepath.Join(m, "victim.txt"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 1))))
		// Owners: chowned to another user, made by root, a directory
		// made by root with setgid (kept: inheritance of the group
		// commit gives it).
		write(t, filepath.Join(m, "chowned"), "x\n")
		must(t, os.Chown(filepath.Join(m, "chowned"), 777, 888))
		write(t, filepath.Join(m, "rootmade"), "r\n")
		must(t, os.Mkdir(filepath.Join(m, "shared"), 0o775))
		must(t, unix.Chmod(filepath.Join(m, "shared"), 0o2775))
		mk("shared/inner", "in\n", 0o644)
		// An edit keeps the file's owner, root's included.
		write(t, filepath.Join(m, "rootfile"), "edited\n")
		// A copy-up without a change leaves the real file as it was.
		f, err := os.OpenFile(filepath.Join(m, "helper"), os.O_WRONLY, 0)
		must(t, err)
		f.Close()

		res, err := w.Commit(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, n := range res.Withheld {
			rel, _ := filepath.Rel(real, n.Path)
			got = append(got, string(n.Action)+" "+rel+" "+n.What)
		}
		sort.Strings(got)
		want := []string{
			"owner chowned owner 777:888, given 4242:4343",
			"owner rootmade owner 0:0, given 4242:4343",
			"owner shared owner 0:0, given 4242:4343",
			"refused loop block device 7:0",
			"refused null character device 1:3",
			"refused pipe fifo",
			"refused victim.txt character device 1:1",
			"stripped both setgid bit",
			"stripped both setuid bit",
			"stripped capbin xattr security.capability",
			"stripped sgid setgid bit",
			"stripped suid setuid bit",
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("withheld:\n got %q\nwant %q", got, want)
		}
		for name, mode := range map[string]uint32{"suid": 0o755, "sgid": 0o755, "both": 0o711, "capbin": 0o755, "helper": 0o4755, "shared": 0o2775} {
			if st := statOf(t, filepath.Join(real, name)); st.Mode&0o7777 != mode {
				t.Errorf("%s: mode %#o, want %#o", name, st.Mode&0o7777, mode)
			}
		}
		for name, want := range map[string]string{"suid": "suid\n", "capbin": "caps\n", "shared/inner": "in\n"} {
			if b, err := os.ReadFile(filepath.Join(real, name)); err != nil || string(b) != want {
				t.Errorf("%s: %q, %v", name, b, err)
			}
		}
		if _, err := unix.Lgetxattr(filepath.Join(real, "capbin"), "security.capability", nil); !errors.Is(err, unix.ENODATA) {
			t.Errorf("capbin keeps security.capability: %v", err)
		}
		if v, err := lgetxattr(filepath.Join(real, "capbin"), "user.note"); userX && (err != nil || string(v) != "kept") {
			t.Errorf("capbin lost user.note: %q, %v", v, err)
		}
		for _, name := range []string{"null", "loop", "pipe"} {
			if _, err := os.Lstat(filepath.Join(real, name)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("refused %s is in the real directory: %v", name, err)
			}
		}
		if b, err := os.ReadFile(filepath.Join(real, "victim.txt")); err != nil || string(b) != "keep me\n" {
			t.Errorf("victim.txt replaced by a refused device: %q, %v", b, err)
		}
		for name, o := range map[string]owner{"chowned": {uid, gid}, "rootmade": {uid, gid}, "shared": {uid, gid}, "shared/inner": {uid, gid},
			"suid": {uid, gid}, "rootfile": {0, 0}, "helper": {uid, gid}} {
			if st := statOf(t, filepath.Join(real, name)); (owner{st.Uid, st.Gid}) != o {
				t.Errorf("%s: owner %d:%d, want %s", name, st.Uid, st.Gid, o)
			}
		}
		if b, _ := os.ReadFile(filepath.Join(real, "rootfile")); string(b) != "edited\n" {
			t.Errorf("rootfile: %q", b)
		}
		noTemporaries(t, real)
		if res.Hash != hashOf(t, real) {
			t.Error("result hash is not the real directory's")
		}
		// The overlay, mounted again, shows the committed tree.
		if d, err := w.Diff(context.Background()); err != nil || len(d) != 0 {
			t.Errorf("diff after commit: %+v, %v", d, err)
		}
	})
}

// TestCommitBenignExactly: ordinary files, executables, directories,
// symlinks within the tree, hard links and user xattrs commit exactly as
// the overlay showed them, with nothing withheld.
func TestCommitBenignExactly(t *testing.T) {
	layouts(t, func(t *testing.T, base, state string) {
		real := filepath.Join(base, "real")
		write(t, filepath.Join(real, "src", "main.go"), "package main\n")
		write(t, filepath.Join(real, "run.sh"), "#!/bin/sh\necho old\n")
		must(t, os.Chmod(filepath.Join(real, "run.sh"), 0o755))
		userX := userXattrs(t, real, state)
		w := openMounted(t, state, real)
		m := w.Layers[0].Merged
		write(t, filepath.Join(m, "src", "main.go"), "package main\n\nfunc main() {}\n")
		write(t, filepath.Join(m, "run.sh"), "#!/bin/sh\necho new\n")
		write(t, filepath.Join(m, "bin", "tool"), "#!/bin/sh\nexit 0\n")
		must(t, os.Chmod(filepath.Join(m, "bin", "tool"), 0o755))
		must(t, os.Mkdir(filepath.Join(m, "bin", "private"), 0o700))
		must(t, os.Mkdir(filepath.Join(m, "tmp"), 0o755))
		must(t, unix.Chmod(filepath.Join(m, "tmp"), 0o1777))
		must(t, os.Symlink("../src/main.go", filepath.Join(m, "bin", "main-link")))
		must(t, os.Symlink("src", filepath.Join(m, "srclink")))
		must(t, os.Link(filepath.Join(m, "bin", "tool"), filepath.Join(m, "bin", "tool2")))
		if userX {
			must(t, unix.Setxattr(filepath.Join(m, "run.sh"), "user.origin", []byte("sandbox"), 0))
		}
		must(t, os.Chtimes(filepath.Join(m, "bin", "tool"), time1, time1))
		seen := hashOf(t, m)
		res, err := w.Commit(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Withheld) != 0 {
			t.Errorf("withheld from a benign change: %+v", res.Withheld)
		}
		if h := hashOf(t, real); h != seen || res.Hash != seen {
			t.Error("the real directory differs from what the overlay showed")
		}
		for p, want := range map[string]string{"src/main.go": "package main\n\nfunc main() {}\n", "run.sh": "#!/bin/sh\necho new\n",
			"bin/tool": "#!/bin/sh\nexit 0\n", "bin/main-link": "package main\n\nfunc main() {}\n"} {
			if b, err := os.ReadFile(filepath.Join(real, p)); err != nil || string(b) != want {
				t.Errorf("%s: %q, %v", p, b, err)
			}
		}
		for p, mode := range map[string]uint32{"run.sh": 0o755, "bin/tool": 0o755, "bin/private": 0o700, "tmp": 0o1777} {
			if st := statOf(t, filepath.Join(real, p)); st.Mode&0o7777 != mode {
				t.Errorf("%s: mode %#o, want %#o", p, st.Mode&0o7777, mode)
			}
		}
		if v, err := lgetxattr(filepath.Join(real, "run.sh"), "user.origin"); userX && (err != nil || string(v) != "sandbox") {
			t.Errorf("run.sh: user.origin %q, %v", v, err)
		}
		if st := statOf(t, filepath.Join(real, "bin", "tool")); st.Mtim.Sec != time1.Unix() {
			t.Errorf("bin/tool: mtime %d, want %d", st.Mtim.Sec, time1.Unix())
		}
		if l, err := os.Readlink(filepath.Join(real, "srclink")); err != nil || l != "src" {
			t.Errorf("srclink: %q, %v", l, err)
		}
		noTemporaries(t, real)
	})
}

// TestCommitFollowsNoSymlinkIntoTheRealTree: the real directory's owner
// swaps a directory for a symlink to elsewhere while commit runs; commit
// stops instead of writing there.
func TestCommitFollowsNoSymlinkIntoTheRealTree(t *testing.T) {
	layouts(t, func(t *testing.T, base, state string) {
		real := filepath.Join(base, "real")
		outside := filepath.Join(base, "outside")
		must(t, os.MkdirAll(outside, 0o755))
		write(t, filepath.Join(real, "sub", "old.txt"), "old\n")
		w := openMounted(t, state, real)
		m := w.Layers[0].Merged
		write(t, filepath.Join(m, "sub", "new.txt"), "planted\n")
		must(t, os.Chmod(filepath.Join(m, "sub"), 0o777))
		commitHook = func(rel string) {
			if rel == "sub/new.txt" {
				must(t, os.Rename(filepath.Join(real, "sub"), filepath.Join(real, "sub.moved")))
				must(t, os.Symlink(outside, filepath.Join(real, "sub")))
			}
		}
		defer func() { commitHook = nil }()
		_, err := w.Commit(context.Background())
		if !errors.Is(err, errMoved) {
			t.Fatalf("commit through a swapped directory: %v", err)
		}
		ents, _ := os.ReadDir(outside)
		if len(ents) != 0 {
			t.Errorf("commit wrote outside the real directory: %v", ents)
		}
		if st := statOf(t, outside); st.Mode&0o777 != 0o755 {
			t.Errorf("commit changed the mode outside: %#o", st.Mode&0o777)
		}
	})
}

func TestRemoveAllAtFollowsNoSymlink(t *testing.T) {
	base := t.TempDir()
	write(t, filepath.Join(base, "outside", "precious"), "p")
	write(t, filepath.Join(base, "d", "sub", "f"), "f")
	must(t, os.Symlink(filepath.Join(base, "outside"), filepath.Join(base, "d", "sub", "link")))
	fd, err := unix.Open(base, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	must(t, err)
	defer unix.Close(fd)
	must(t, removeAllAt(fd, "d"))
	if _, err := os.Lstat(filepath.Join(base, "d")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("d still there: %v", err)
	}
	if _, err := os.Stat(filepath.Join(base, "outside", "precious")); err != nil {
		t.Errorf("removeAllAt followed a symlink: %v", err)
	}
	must(t, removeAllAt(fd, "missing"))
}

func TestOpenBeneathRefusesSymlinks(t *testing.T) {
	base := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(base, "a", "b"), 0o755))
	must(t, os.Symlink("b", filepath.Join(base, "a", "l")))
	fd, err := unix.Open(base, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	must(t, err)
	defer unix.Close(fd)
	for _, open := range []func(int, string) (int, error){openBeneath, walkBeneath} {
		d, err := open(fd, "a/b")
		if err != nil {
			t.Fatal(err)
		}
		unix.Close(d)
		if d, err := open(fd, "a/l"); !errors.Is(err, errMoved) {
			unix.Close(d)
			t.Errorf("opened through a symlink: %v", err)
		}
	}
}
