package backstop_test

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/backstop"
	"github.com/watcherhq/watcher/internal/enforce/enforcetest"
	"github.com/watcherhq/watcher/internal/enforce/rules/backstoprules"
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
	v.fixture = newFixture(t, func(r *backstoprules.Rules) {
		kill := backstoprules.Rule{Action: enforce.ActionKill, ID: 91}
		r.Paths = append(r.Paths,
			backstoprules.PathRule{Path: v.blocked + "/", Prefix: true, Ops: backstoprules.OpRead | backstoprules.OpWrite, Rule: kill},
			backstoprules.PathRule{Path: "/" + v.jailName + "/", Prefix: true, Ops: backstoprules.OpRead, Rule: kill})
		// The chroot case runs chroot in the sandbox.
		r.Syscalls = slices.DeleteFunc(r.Syscalls, func(s backstoprules.SyscallRule) bool { return s.Name == "chroot" })
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

// openThen runs a sandboxed helper that opens first repeatedly (allowed:
// the cache must answer), waits while change runs, then (chrooted to jail
// when given) opens second. One process: nothing but change happens
// between the cached opens and the last (no cgroup is created, no binary
// started, which would change directories themselves).
//
// A mount anywhere on the host (another test package's) turns the cache
// off for a moment: a run whose repeated opens were not cached is tried
// again, up to five times, before it counts as a failure.
func (v *vcFixture) openThen(t *testing.T, first, second, jail string, change func()) result {
	t.Helper()
	for try := 1; ; try++ {
		r, cached := v.openThenOnce(t, first, second, jail, change, try == 5)
		if cached || try == 5 {
			return r
		}
		t.Logf("repeated opens of %s not cached (a mount elsewhere?): try %d", first, try+1)
	}
}

func (v *vcFixture) openThenOnce(t *testing.T, first, second, jail string, change func(), last bool) (result, bool) {
	t.Helper()
	hits0, _, err := v.bs.VerdictCacheStats()
	if err != nil {
		t.Fatal(err)
	}
	cg := v.leaf(t, v.sandbox)
	cmd := enforcetest.Command(t, cg, helperBin, "openpause", "200", first, second, jail)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	rd := bufio.NewReader(stdout)
	var out strings.Builder
	for !strings.Contains(out.String(), "cached\n") {
		line, err := rd.ReadString('\n')
		out.WriteString(line)
		if err != nil {
			cmd.Wait()
			t.Fatalf("helper stopped before its repeated opens of %s were done:\n%s", first, out.String())
		}
	}
	hits, stores, err := v.bs.VerdictCacheStats()
	if err != nil {
		t.Fatal(err)
	}
	if hits == hits0 || stores == 0 {
		if !last {
			cgroupfs.Kill(cg)
			cmd.Wait()
			return result{}, false
		}
		t.Errorf("repeated opens of %s not answered by the cache: hits %d -> %d, stores %d", first, hits0, hits, stores)
	}
	if change != nil {
		change()
	}
	stdin.Write([]byte("\n"))
	rest, _ := io.ReadAll(rd)
	out.Write(rest)
	err = cmd.Wait()
	cgroupfs.Kill(cg)
	r := result{pid: cmd.Process.Pid, out: out.String(), err: err}
	r.cgroup, _ = cgroupfs.ID(cg)
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
		r.killed = true
	}
	return r, true
}

// refusedAfter expects the open of second, after change, killed as the
// rules say without any cache.
func (v *vcFixture) refusedAfter(t *testing.T, first, second string, change func()) {
	t.Helper()
	v.expectKilled(t, v.openThen(t, first, second, "", change), wantPath(second))
}

// host runs a helper op in the test's own cgroup (outside every sandbox,
// no cgroup created) and expects it to succeed.
func (v *vcFixture) host(t *testing.T, op string, args ...string) {
	t.Helper()
	r := v.run(t, "", op, args...)
	expectSurvived(t, r)
	if !strings.Contains(r.out, "result: <nil>") {
		t.Fatalf("%s %v outside: %s", op, args, r.out)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestVerdictCache shows repeated allowed opens answered by the cache, and
// that no change of a cached file's name, mount, root or rules lets a
// cached "allowed" answer an open the rules refuse.
func TestVerdictCache(t *testing.T) {
	v := newVCFixture(t)

	t.Run("repeated open allowed and cached", func(t *testing.T) {
		a := v.file(t, v.allowed, "repeat")
		r := v.openThen(t, a, a, "", nil)
		if r.killed || !strings.Contains(r.out, "result: <nil>") {
			t.Fatalf("allowed repeated open: killed=%v\n%s", r.killed, r.out)
		}
	})
	t.Run("rename into blocked", func(t *testing.T) {
		a, to := v.file(t, v.allowed, "mv"), filepath.Join(v.blocked, "mv")
		v.refusedAfter(t, a, to, func() { must(t, os.Rename(a, to)) })
	})
	t.Run("rename parent directory under blocked", func(t *testing.T) {
		a := v.file(t, v.allowed, "sub", "f")
		v.refusedAfter(t, a, filepath.Join(v.blocked, "sub", "f"), func() {
			must(t, os.Rename(filepath.Join(v.allowed, "sub"), filepath.Join(v.blocked, "sub")))
		})
	})
	t.Run("hard link into blocked", func(t *testing.T) {
		a, to := v.file(t, v.allowed, "ln"), filepath.Join(v.blocked, "ln")
		v.refusedAfter(t, a, to, func() { must(t, os.Link(a, to)) })
	})
	t.Run("blocked file linked out and back", func(t *testing.T) {
		// A file created after the rules has no inode entry: only its
		// path refuses it.
		b, out := v.file(t, v.blocked, "back"), filepath.Join(v.allowed, "back")
		v.expectKilled(t, v.run(t, v.sandbox, "open", b), wantPath(b))
		must(t, os.Link(b, out))
		must(t, os.Remove(b))
		v.refusedAfter(t, out, b, func() {
			must(t, os.Link(out, b))
			must(t, os.Remove(out))
		})
	})
	t.Run("io_uring rename outside the sandbox", func(t *testing.T) {
		a, to := v.file(t, v.allowed, "uring"), filepath.Join(v.blocked, "uring")
		v.refusedAfter(t, a, to, func() { v.host(t, "uringrename", a, to) })
	})
	t.Run("32-bit rename outside the sandbox", func(t *testing.T) {
		need32(t)
		a, to := v.file(t, v.allowed, "i386"), filepath.Join(v.blocked, "i386")
		v.refusedAfter(t, a, to, func() { v.host(t, "int80rename", a, to) })
	})
	moveCase := func(t *testing.T, name string, move func(src, dst string)) {
		mnt, dst := filepath.Join(v.allowed, name), filepath.Join(v.blocked, name)
		must(t, os.Mkdir(mnt, 0o755))
		must(t, os.Mkdir(dst, 0o755))
		must(t, unix.Mount("vctest", mnt, "tmpfs", 0, ""))
		t.Cleanup(func() {
			unix.Unmount(mnt, unix.MNT_DETACH)
			unix.Unmount(dst, unix.MNT_DETACH)
		})
		a := v.file(t, mnt, "f")
		v.refusedAfter(t, a, filepath.Join(dst, "f"), func() { move(mnt, dst) })
	}
	t.Run("mount moved under blocked", func(t *testing.T) {
		moveCase(t, "mv-mnt", func(src, dst string) { must(t, unix.Mount(src, dst, "", unix.MS_MOVE, "")) })
	})
	t.Run("mount moved under blocked by a 32-bit mount", func(t *testing.T) {
		need32(t)
		moveCase(t, "mv-mnt32", func(src, dst string) { v.host(t, "int80move", src, dst) })
	})
	t.Run("bind mount under blocked", func(t *testing.T) {
		a, dst := v.file(t, v.allowed, "bind", "f"), filepath.Join(v.blocked, "bind")
		must(t, os.Mkdir(dst, 0o755))
		t.Cleanup(func() { unix.Unmount(dst, unix.MNT_DETACH) })
		v.refusedAfter(t, a, filepath.Join(dst, "f"), func() {
			must(t, unix.Mount(filepath.Dir(a), dst, "", unix.MS_BIND, ""))
		})
	})
	t.Run("another root", func(t *testing.T) {
		// The same file, cached as seen from /, is refused as seen from a
		// root where its path is under a rule (the sandbox may chroot
		// here).
		a := v.file(t, v.jail, v.jailName, "f")
		inJail := "/" + v.jailName + "/f"
		v.expectKilled(t, v.openThen(t, a, inJail, v.jail, nil), wantPath(inJail))
	})
	t.Run("rules reloaded", func(t *testing.T) {
		a := v.file(t, v.allowed, "reload")
		rules := v.rules
		rules.Paths = append(slices.Clip(rules.Paths), backstoprules.PathRule{Path: a, Ops: backstoprules.OpRead,
			Rule: backstoprules.Rule{Action: enforce.ActionKill, ID: 92}})
		v.refusedAfter(t, a, a, func() { must(t, v.bs.SetRules(rules)) })
		must(t, v.bs.SetRules(v.rules))
		r := v.openThen(t, a, a, "", nil) // allowed (and cached) again
		if r.killed {
			t.Fatalf("allowed again after the rule was removed: killed\n%s", r.out)
		}
	})
}
