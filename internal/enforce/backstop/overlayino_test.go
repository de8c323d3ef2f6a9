package backstop_test

import (
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
