package lsm

import (
	"testing"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/enforcetest"
	"github.com/watcherhq/watcher/internal/enforce/rules/lsmrules"
)

// TestOverlayDirNumberNotAFile: on overlayfs over two filesystems a
// directory's inode number can be a file's too (enforcetest.OverlayTwin),
// and a protected directory's inode entry once matched such a file (the
// qemu guest's adversarial suite on the host's userland: every exec of
// the test binary refused as adv-secrets). Entries hold their file's type
// now: the twin file opens, the directory's own file stays refused.
func TestOverlayDirNumberNotAFile(t *testing.T) {
	eng, l := setup(t)
	o := enforcetest.NewOverlayTwin(t)
	sb := newSandbox(t, eng, l, 0, lsmrules.Rules{Paths: []lsmrules.PathRule{
		{Path: o.Dir + "/", Prefix: true, Decision: lsmrules.Decision{Action: enforce.ActionBlock, RuleID: 640}},
	}})
	res, pid := runOps(t, sb.root, []opSpec{
		{Name: "twin", Kind: "open", Path: o.Twin},
		{Name: "key", Kind: "open", Path: o.Key},
	})
	if res["twin"] != "OK" {
		t.Errorf("open of a workspace file with the protected directory's number: %s, want OK", res["twin"])
	}
	if res["key"] != "EPERM" {
		t.Errorf("open of the protected file: %s, want EPERM", res["key"])
	}
	waitEvent(t, "key refused", func(ev audit.Event) bool {
		return ev.Process.TGID == uint32(pid) && ev.Kind == audit.KindFileOpen && ev.Rule == "rule-640"
	})
	for _, ev := range eventsFrom(pid) {
		if ev.File != nil && ev.File.Path == o.Twin {
			t.Errorf("an event for the workspace file: %+v", ev)
		}
	}
}
