package backstop_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/backstop"
)

// vcFixture is a backstop whose rules kill reads below blocked/ (and, for
// the chroot case, below /<jailName>/ as seen from a root at jail), with
// files the tests open under allowed/. The directory is a private bind
// mount of itself so mounts inside it can be moved.
type vcFixture struct {
	*fixture
	dir, allowed, blocked, jail, jailName string
}

func newVCFixture(t *testing.T) *vcFixture {
	t.Helper()
	v := &vcFixture{dir: t.TempDir()}
	if err := unix.Mount(v.dir, v.dir, "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("bind %s: %v", v.dir, err)
	}
	t.Cleanup(func() { unix.Unmount(v.dir, unix.MNT_DETACH) })
	if err := unix.Mount("", v.dir, "", unix.MS_PRIVATE, ""); err != nil {
		t.Fatalf("make %s private: %v", v.dir, err)
	}
	v.allowed, v.blocked = filepath.Join(v.dir, "allowed"), filepath.Join(v.dir, "blocked")
	v.jailName = fmt.Sprintf("vcjail%d", time.Now().UnixNano())
	v.jail = filepath.Join(v.dir, "jail")
	for _, d := range []string{v.allowed, v.blocked, filepath.Join(v.jail, v.jailName)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	v.fixture = newFixture(t, func(r *backstop.Rules) {
		kill := backstop.Rule{Action: enforce.ActionKill, ID: 91}
		r.Paths = append(r.Paths,
			backstop.PathRule{Path: v.blocked + "/", Prefix: true, Ops: backstop.OpRead | backstop.OpWrite, Rule: kill},
			backstop.PathRule{Path: "/" + v.jailName + "/", Prefix: true, Ops: backstop.OpRead, Rule: kill})
		// The chroot case runs chroot in the sandbox.
		r.Syscalls = slices.DeleteFunc(r.Syscalls, func(s backstop.SyscallRule) bool { return s.Name == "chroot" })
	})
	on, err := v.bs.VerdictCacheOn()
	if err != nil {
		t.Fatal(err)
	}
	if !on {
		missing := v.bs.Missing()
		for _, p := range []string{backstop.ProgCtimeSet, backstop.ProgCtimeXchg, backstop.ProgCtimeSkip} {
			if missing[p] != nil {
				t.Skipf("verdict cache off: %s: %v", p, missing[p])
			}
		}
		t.Fatal("verdict cache off although every program it needs is attached")
	}
	return v
}

// file creates a file with content below dir and returns its path.
func (v *vcFixture) file(t *testing.T, elem ...string) string {
	t.Helper()
	p := filepath.Join(elem...)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte("content of "+filepath.Base(p)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// cached opens path many times in the sandbox, allowed, and checks the
// verdict was stored and then answered from the cache.
func (v *vcFixture) cached(t *testing.T, path string) {
	t.Helper()
	hits0, stores0, err := v.bs.VerdictCacheStats()
	if err != nil {
		t.Fatal(err)
	}
	r := v.run(t, v.sandbox, "openloop", "200", path)
	if r.killed || !strings.Contains(r.out, "result: <nil>") {
		t.Fatalf("repeated open of %s: killed=%v, output:\n%s", path, r.killed, r.out)
	}
	hits, stores, err := v.bs.VerdictCacheStats()
	if err != nil {
		t.Fatal(err)
	}
	if stores == stores0 || hits == hits0 {
		t.Fatalf("open of %s not cached: stores %d -> %d, hits %d -> %d", path, stores0, stores, hits0, hits)
	}
}

// refused opens path in the sandbox and expects the kill the rules give it.
func (v *vcFixture) refused(t *testing.T, path string) {
	t.Helper()
	v.expectKilled(t, v.run(t, v.sandbox, "open", path), wantPath(path))
}

// outside runs a helper op outside every sandbox and expects it to succeed.
func (v *vcFixture) outside(t *testing.T, op string, args ...string) {
	t.Helper()
	r := v.run(t, v.fixture.outside, op, args...)
	expectSurvived(t, r)
	if !strings.Contains(r.out, "result: <nil>") {
		t.Fatalf("%s %v outside: %s", op, args, r.out)
	}
}

// TestVerdictCache shows repeated allowed opens answered by the cache, and
// that no change of a cached file's name, mount, root or rules lets a
// cached "allowed" answer an open the rules refuse.
func TestVerdictCache(t *testing.T) {
	v := newVCFixture(t)

	t.Run("repeated open allowed and cached", func(t *testing.T) {
		a := v.file(t, v.allowed, "repeat")
		v.cached(t, a)
		v.cached(t, a) // still allowed, still answered by the cache
	})
	t.Run("rename into blocked", func(t *testing.T) {
		a := v.file(t, v.allowed, "mv")
		v.cached(t, a)
		to := filepath.Join(v.blocked, "mv")
		if err := os.Rename(a, to); err != nil {
			t.Fatal(err)
		}
		v.refused(t, to)
	})
	t.Run("rename parent directory under blocked", func(t *testing.T) {
		a := v.file(t, v.allowed, "sub", "f")
		v.cached(t, a)
		if err := os.Rename(filepath.Join(v.allowed, "sub"), filepath.Join(v.blocked, "sub")); err != nil {
			t.Fatal(err)
		}
		v.refused(t, filepath.Join(v.blocked, "sub", "f"))
	})
	t.Run("hard link into blocked", func(t *testing.T) {
		a := v.file(t, v.allowed, "ln")
		v.cached(t, a)
		to := filepath.Join(v.blocked, "ln")
		if err := os.Link(a, to); err != nil {
			t.Fatal(err)
		}
		v.refused(t, to)
		v.cached(t, v.file(t, v.allowed, "ln-neighbour")) // the neighbour still cached
	})
	t.Run("blocked file linked out and back", func(t *testing.T) {
		// A file created after the rules has no inode entry: only its
		// path refuses it.
		b := v.file(t, v.blocked, "back")
		v.refused(t, b)
		out := filepath.Join(v.allowed, "back")
		if err := os.Link(b, out); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(b); err != nil {
			t.Fatal(err)
		}
		v.cached(t, out) // one name, allowed
		if err := os.Link(out, b); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(out); err != nil {
			t.Fatal(err)
		}
		v.refused(t, b)
	})
	t.Run("io_uring rename outside the sandbox", func(t *testing.T) {
		a := v.file(t, v.allowed, "uring")
		v.cached(t, a)
		to := filepath.Join(v.blocked, "uring")
		v.outside(t, "uringrename", a, to)
		v.refused(t, to)
	})
	t.Run("32-bit rename outside the sandbox", func(t *testing.T) {
		a := v.file(t, v.allowed, "i386")
		v.cached(t, a)
		to := filepath.Join(v.blocked, "i386")
		v.outside(t, "int80rename", a, to)
		v.refused(t, to)
	})
	moveCase := func(t *testing.T, name string, move func(src, dst string)) {
		mnt := filepath.Join(v.allowed, name)
		if err := os.Mkdir(mnt, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount("vctest", mnt, "tmpfs", 0, ""); err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(v.blocked, name)
		t.Cleanup(func() {
			unix.Unmount(mnt, unix.MNT_DETACH)
			unix.Unmount(dst, unix.MNT_DETACH)
		})
		a := v.file(t, mnt, "f")
		v.cached(t, a)
		if err := os.Mkdir(dst, 0o755); err != nil {
			t.Fatal(err)
		}
		move(mnt, dst)
		v.refused(t, filepath.Join(dst, "f"))
	}
	t.Run("mount moved under blocked", func(t *testing.T) {
		moveCase(t, "mv-mnt", func(src, dst string) {
			if err := unix.Mount(src, dst, "", unix.MS_MOVE, ""); err != nil {
				t.Fatal(err)
			}
		})
	})
	t.Run("mount moved under blocked by a 32-bit mount", func(t *testing.T) {
		moveCase(t, "mv-mnt32", func(src, dst string) { v.outside(t, "int80move", src, dst) })
	})
	t.Run("bind mount under blocked", func(t *testing.T) {
		a := v.file(t, v.allowed, "bind", "f")
		v.cached(t, a)
		dst := filepath.Join(v.blocked, "bind")
		if err := os.Mkdir(dst, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount(filepath.Dir(a), dst, "", unix.MS_BIND, ""); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Unmount(dst, unix.MNT_DETACH) })
		v.refused(t, filepath.Join(dst, "f"))
	})
	t.Run("another root", func(t *testing.T) {
		// The same file, cached as seen from /, is refused as seen from a
		// root where its path is under a rule.
		a := v.file(t, v.jail, v.jailName, "f")
		v.cached(t, a)
		inJail := "/" + v.jailName + "/f"
		r := v.run(t, v.sandbox, "chrootopen", v.jail, inJail)
		v.expectKilled(t, r, wantPath(inJail))
	})
	t.Run("rules reloaded", func(t *testing.T) {
		a := v.file(t, v.allowed, "reload")
		v.cached(t, a)
		rules := v.rules
		rules.Paths = append(slices.Clip(rules.Paths), backstop.PathRule{Path: a, Ops: backstop.OpRead,
			Rule: backstop.Rule{Action: enforce.ActionKill, ID: 92}})
		if err := v.bs.SetRules(rules); err != nil {
			t.Fatal(err)
		}
		v.refused(t, a)
		if err := v.bs.SetRules(v.rules); err != nil {
			t.Fatal(err)
		}
		v.cached(t, a) // allowed again once the rule is gone
	})
}
