package launch_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/enforce/enforcetest"
	"github.com/watcherhq/watcher/internal/launch"
	"github.com/watcherhq/watcher/internal/policy"
)

// metaScript tries every metadata syscall on a file outside the writable
// paths (refused before it happens: EPERM, nothing changed) and on one in
// the workspace (done), through symlinks, descriptors, relative paths and
// a second thread rewriting the path while the first calls chmod.
const metaScript = `
import ctypes, errno, os, sys, threading
libc = ctypes.CDLL(None, use_errno=True)
OUT, WS = sys.argv[1], sys.argv[2]
def t(name, f):
    try:
        f(); print(name + "=ok")
    except OSError as e:
        print(name + "=" + errno.errorcode.get(e.errno, str(e.errno)))
out, mine = OUT + "/file", WS + "/file"
t("out-chmod", lambda: os.chmod(out, 0o600))
t("out-chown", lambda: os.chown(out, 1234, 1234))
t("out-setxattr", lambda: os.setxattr(out, "user.x", b"1"))
t("out-utime", lambda: os.utime(out, (1, 1)))
t("out-utime-now", lambda: os.utime(out))
t("out-link-chmod", lambda: os.chmod(WS + "/link", 0o600))
fd = os.open(out, os.O_RDONLY)
t("out-fchmod", lambda: os.fchmod(fd, 0o600))
t("out-futimens", lambda: os.utime(fd, (2, 2)))
os.chdir(WS)
t("out-dotdot-chmod", lambda: os.chmod("../out/file", 0o600))
t("ws-chmod", lambda: os.chmod(mine, 0o640))
t("ws-chown", lambda: os.chown(mine, 1234, 1234))
t("ws-setxattr", lambda: os.setxattr(mine, "user.x", b"v1"))
print("ws-getxattr=" + os.getxattr(mine, "user.x").decode())
t("ws-removexattr", lambda: os.removexattr(mine, "user.x"))
t("ws-security-xattr", lambda: os.setxattr(mine, "security.x", b"1"))
# sed -i and cp -p copy POSIX ACLs: an empty-mask ACL equal to mode 0644.
acl = bytes([2,0,0,0, 1,0,6,0,255,255,255,255, 4,0,4,0,255,255,255,255, 32,0,4,0,255,255,255,255])
t("ws-acl", lambda: os.setxattr(mine, "system.posix_acl_access", acl))
t("out-acl", lambda: os.setxattr(out, "system.posix_acl_access", acl))
t("ws-utime", lambda: os.utime(mine, (100, 200)))
t("ws-relative-chmod", lambda: os.chmod("file", 0o644))
t("ws-lchown-link", lambda: os.lchown(WS + "/link", 0, 0))
wfd = os.open(mine, os.O_RDONLY)
t("ws-fchmod", lambda: os.fchmod(wfd, 0o644))
# A second thread flips the path buffer between the workspace file and the
# outside one while this thread calls chmod on it.
a, b = mine.encode(), out.encode()
n = max(len(a), len(b)) + 1
buf = ctypes.create_string_buffer(n)
stop = False
def flip():
    while not stop:
        ctypes.memmove(buf, b + b"\0", len(b) + 1)
        ctypes.memmove(buf, a + b"\0", len(a) + 1)
th = threading.Thread(target=flip); th.start()
ok = 0
for i in range(300):
    if libc.chmod(buf, 0o777) == 0:
        ok += 1
stop = True; th.join()
print("race-done=ok")
# File-notification marks: in the workspace (a file watcher) the watch is
# added to the caller's own instance and its events arrive; outside,
# refused.
libc.inotify_init1.restype = ctypes.c_int
ifd = libc.inotify_init1(0)
def watch(p, mask=0x100):  # IN_CREATE
    wd = libc.inotify_add_watch(ifd, p.encode(), mask)
    if wd < 0:
        raise OSError(ctypes.get_errno(), "inotify_add_watch")
    return wd
t("out-inotify", lambda: watch(OUT))
t("out-inotify-link", lambda: watch(WS + "/link", 0x2))
wd = watch(WS)
print("ws-inotify=ok")
open(WS + "/created", "w").close()
ev = os.read(ifd, 4096)
print("ws-inotify-event=" + ("ok" if b"created" in ev and int.from_bytes(ev[0:4], "little") == wd else repr(ev)))
`

func TestMetadataSupervised(t *testing.T) {
	enforcetest.RequireRoot(t)
	if launch.LandlockABI() == 0 {
		t.Skip("Landlock is not available on this kernel")
	}
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 is not installed")
	}
	sandbox := enforcetest.Cgroup(t, "metanotify")
	base, _ := filepath.EvalSymlinks(t.TempDir())
	out, ws := filepath.Join(base, "out"), filepath.Join(base, "ws")
	os.MkdirAll(out, 0o755)
	os.MkdirAll(ws, 0o755)
	outFile, wsFile := filepath.Join(out, "file"), filepath.Join(ws, "file")
	os.WriteFile(outFile, []byte("o"), 0o644)
	os.WriteFile(wsFile, []byte("w"), 0o644)
	os.Symlink(outFile, filepath.Join(ws, "link"))
	old := time.Unix(1000, 0)
	os.Chtimes(outFile, old, old)

	rules := &launch.FileRules{
		Derive: true,
		Files: []policy.FileRule{
			{Name: "write-outside-workspace", Path: "/", Match: policy.MatchPrefix, Access: policy.AccessWrite, Action: policy.ActionBlock},
			{Name: "workspace", Path: ws + "/", Match: policy.MatchPrefix, Access: policy.AccessWrite, Action: policy.ActionAllow},
			{Name: "terminal", Path: "/dev/null", Match: policy.MatchExact, Access: policy.AccessWrite, Action: policy.ActionAllow},
		},
		Devices:       []string{"/dev/null"},
		IgnoreMissing: true,
	}
	var buf bytes.Buffer
	v, err := launch.Run(context.Background(), launch.Config{
		Path: py, Args: []string{"-c", metaScript, out, ws}, Stdout: &buf, Stderr: &buf,
		Sandbox: "test", CgroupParent: sandbox, Label: "metanotify",
		Restrictions: launch.Restrictions{Seccomp: launch.DefaultSeccomp(), Files: rules},
	})
	if err != nil || v.Outcome != launch.OutcomeExited || v.ExitCode != 0 {
		t.Fatalf("run: %v %v\n%s", err, v, buf.String())
	}
	if len(v.Applied.MetaNotify) == 0 || !strings.Contains(v.Applied.Summary(), "metadata=supervised") {
		t.Errorf("applied %+v: no metadata supervision reported", v.Applied)
	}
	got := map[string]string{}
	for _, line := range strings.Split(buf.String(), "\n") {
		if k, val, ok := strings.Cut(line, "="); ok {
			got[k] = val
		}
	}
	want := map[string]string{
		"out-chmod": "EPERM", "out-chown": "EPERM", "out-setxattr": "EPERM", "out-utime": "EPERM",
		"out-utime-now": "EPERM", "out-link-chmod": "EPERM", "out-fchmod": "EPERM", "out-futimens": "EPERM",
		"out-dotdot-chmod": "EPERM",
		"ws-chmod":         "ok", "ws-chown": "ok", "ws-setxattr": "ok", "ws-getxattr": "v1", "ws-removexattr": "ok",
		"ws-security-xattr": "EPERM", "ws-utime": "ok", "ws-relative-chmod": "ok", "ws-lchown-link": "ok",
		"ws-fchmod": "ok", "race-done": "ok", "ws-acl": "ok", "out-acl": "EPERM",
		"out-inotify": "EPERM", "out-inotify-link": "EPERM", "ws-inotify": "ok", "ws-inotify-event": "ok",
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s: %q, want %q", k, got[k], w)
		}
	}
	// Nothing changed outside, whatever the second thread did.
	var st unix.Stat_t
	if err := unix.Stat(outFile, &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&0o7777 != 0o644 || st.Uid != 0 || st.Mtim.Sec != 1000 {
		t.Errorf("outside file changed: mode %o uid %d mtime %d", st.Mode&0o7777, st.Uid, st.Mtim.Sec)
	}
	if _, err := unix.Getxattr(outFile, "user.x", nil); err == nil {
		t.Error("outside file got user.x")
	}
	if err := unix.Stat(wsFile, &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != 1234 || st.Mtim.Sec != 200 {
		t.Errorf("workspace file: uid %d mtime %d, want 1234 and 200", st.Uid, st.Mtim.Sec)
	}
	if len(v.MetaRefused) == 0 || v.MetaHandled == 0 {
		t.Errorf("verdict records no refusal: %+v handled %d", v.MetaRefused, v.MetaHandled)
	} else if r := v.MetaRefused[0]; r.Syscall != "chmod" || r.Path != outFile {
		t.Errorf("first refusal %+v, want chmod of %s", r, outFile)
	}
	if t.Failed() {
		t.Logf("output:\n%s", buf.String())
	}
}

// TestMetadataCost measures what supervision costs per call: 20000 chmod
// calls on a workspace file, under the supervisor and with Landlock alone
// (no file rules: no supervisor), in the same run; it prints the ratio.
// WATCHER_BENCH_META=1 runs it.
func TestMetadataCost(t *testing.T) {
	if os.Getenv("WATCHER_BENCH_META") == "" {
		t.Skip("a measurement, not a test: WATCHER_BENCH_META=1 runs it")
	}
	enforcetest.RequireRoot(t)
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 is not installed")
	}
	sandbox := enforcetest.Cgroup(t, "metacost")
	ws, _ := filepath.EvalSymlinks(t.TempDir())
	f := filepath.Join(ws, "file")
	os.WriteFile(f, nil, 0o644)
	const n = 20000
	loop := `import os, sys, time
f = sys.argv[1]; t0 = time.perf_counter()
for i in range(` + "20000" + `): os.chmod(f, 0o644)
print("ns=%d" % ((time.perf_counter() - t0) * 1e9 / ` + "20000" + `))`
	perCall := func(files *launch.FileRules) float64 {
		var buf bytes.Buffer
		v, err := launch.Run(context.Background(), launch.Config{
			Path: py, Args: []string{"-c", loop, f}, Stdout: &buf, Stderr: &buf,
			Sandbox: "test", CgroupParent: sandbox, Label: "metacost",
			Restrictions: launch.Restrictions{Seccomp: launch.DefaultSeccomp(), Files: files},
		})
		if err != nil || v.ExitCode != 0 {
			t.Fatalf("run: %v %v\n%s", err, v, buf.String())
		}
		var ns float64
		for _, line := range strings.Split(buf.String(), "\n") {
			if v, ok := strings.CutPrefix(line, "ns="); ok {
				fmtSscan(v, &ns)
			}
		}
		return ns
	}
	rules := &launch.FileRules{Derive: true, IgnoreMissing: true, Files: []policy.FileRule{
		{Name: "write-outside-workspace", Path: "/", Match: policy.MatchPrefix, Access: policy.AccessWrite, Action: policy.ActionBlock},
		{Name: "workspace", Path: ws + "/", Match: policy.MatchPrefix, Access: policy.AccessWrite, Action: policy.ActionAllow},
	}}
	var bare, sup []float64
	for i := 0; i < 3; i++ {
		bare = append(bare, perCall(nil))
		sup = append(sup, perCall(rules))
	}
	b, s := median(bare), median(sup)
	t.Logf("chmod in the workspace, %d calls x3: unsupervised %.0f ns/call, supervised %.0f ns/call, ratio %.1fx (+%.1f µs/call)",
		n, b, s, s/b, (s-b)/1000)
}

func median(v []float64) float64 {
	s := append([]float64{}, v...)
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
	return s[len(s)/2]
}

func fmtSscan(s string, f *float64) { fmt.Sscan(s, f) }
