package backstop_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/enforcetest"
	"github.com/watcherhq/watcher/internal/enforce/rules/backstoprules"
)

// TestOverlayDirNumberNotAFile: on overlayfs over two filesystems a
// directory's inode number can be a file's too (enforcetest.OverlayTwin).
// The backstop's inode entries hold no type, so none is written for such
// a directory (its path rule judges it): a file with the protected
// directory's number is read, and the directory's own file still kills.
func TestOverlayDirNumberNotAFile(t *testing.T) {
	o := enforcetest.NewOverlayTwin(t)
	const id = 93
	f := newFixture(t, func(r *backstoprules.Rules) {
		r.Paths = append(r.Paths, backstoprules.PathRule{Path: o.Dir + "/", Prefix: true,
			Ops: backstoprules.OpRead | backstoprules.OpWrite, Rule: backstoprules.Rule{Action: enforce.ActionKill, ID: id}})
	})
	killed, out, evs := f.sandboxed(t, "/bin/cat", o.Twin)
	if killed || len(evs) > 0 || !strings.Contains(out, "a workspace file") {
		t.Errorf("cat %s (a file with the protected directory's number): killed=%v events %s\n%s", o.Twin, killed, describeEvents(evs), out)
	}
	killed, out, evs = f.sandboxed(t, "/bin/cat", o.Key)
	if !killed || len(evs) == 0 || evs[0].RuleID != id {
		t.Errorf("cat %s (the protected file): killed=%v events %s, want killed by rule %d\n%s", o.Key, killed, describeEvents(evs), id, out)
	}
}

// inotifyMark is a sandboxed process putting an inotify mark on path.
const inotifyMark = `import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(0)
wd = libc.inotify_add_watch(fd, sys.argv[1].encode(), 0x20)
print("MARKED" if wd >= 0 else "REFUSED %d" % ctypes.get_errno(), flush=True)
`

// TestOverlayNotifyMarkTwin: an inotify mark is judged by the deepest
// place above its inode; on overlayfs a file's own number may be a
// writable directory's, which once let a mark on a file outside every
// writable place pass. The walk skips a file's own dentry there: the twin
// is judged, a file inside the writable directory is not.
func TestOverlayNotifyMarkTwin(t *testing.T) {
	o := enforcetest.NewOverlayTwin(t)
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 is not installed (scripts/setup.sh installs it)")
	}
	const id = 94
	f := newFixture(t, func(r *backstoprules.Rules) {
		r.NotifyMark = backstoprules.Rule{Action: enforce.ActionKill, ID: id}
		r.Dirs = []backstoprules.DirRule{{Path: o.Dir, Kind: backstoprules.DirWritable}}
	})
	killed, out, evs := f.sandboxed(t, py, "-c", inotifyMark, o.Key)
	if killed || len(evs) > 0 || !strings.Contains(out, "MARKED") {
		t.Errorf("mark on %s (in the writable directory): killed=%v events %s\n%s", o.Key, killed, describeEvents(evs), out)
	}
	killed, out, evs = f.sandboxed(t, py, "-c", inotifyMark, o.Twin)
	if !killed || len(evs) == 0 || evs[0].RuleID != id {
		t.Errorf("mark on %s (outside, with the writable directory's number): killed=%v events %s, want killed by rule %d\n%s",
			o.Twin, killed, describeEvents(evs), id, out)
	}
}
