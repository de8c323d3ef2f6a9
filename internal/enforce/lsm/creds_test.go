package lsm

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/rules/lsmrules"
)

// doCredOp runs the operations of TestCapabilityUnderSubstitutedCreds.
func doCredOp(op opSpec) (string, bool) {
	switch op.Kind {
	case "list_dir":
		ents, err := os.ReadDir(op.Path)
		if err != nil {
			return errnoResult(err), true
		}
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		sort.Strings(names)
		return "OK " + strings.Join(names, ","), true
	case "append":
		f, err := os.OpenFile(op.Path, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			return errnoResult(err), true
		}
		_, err = f.WriteString("more\n")
		f.Close()
		return errnoResult(err), true
	case "set_trusted_xattr":
		return errnoResult(unix.Setxattr(op.Path, "trusted.watcher-test", []byte("1"), 0)), true
	}
	return "", false
}

// TestCapabilityUnderSubstitutedCreds: overlayfs asks for CAP_SYS_ADMIN
// under its mounter's credentials (override_creds) when it reads and
// writes its trusted.overlay.* xattrs for a sandboxed task on a container
// root. A sandbox that may not use CAP_SYS_ADMIN itself must still see
// the overlay right (an opaque directory hides the lower layer, a copy-up
// works) with no capability event, while its own use of the capability is
// refused and recorded.
func TestCapabilityUnderSubstitutedCreds(t *testing.T) {
	eng, l := setup(t)
	dir := t.TempDir()
	lower, upper, work, merged := filepath.Join(dir, "lower"), filepath.Join(dir, "upper"), filepath.Join(dir, "work"), filepath.Join(dir, "merged")
	for _, d := range []string{lower + "/opaque", upper + "/opaque", work, merged} {
		must(t, os.MkdirAll(d, 0o755))
	}
	must(t, os.WriteFile(filepath.Join(lower, "opaque", "from-lower"), []byte("hidden\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(upper, "opaque", "from-upper"), []byte("shown\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(lower, "file"), []byte("lower\n"), 0o644))
	if err := unix.Setxattr(filepath.Join(upper, "opaque"), "trusted.overlay.opaque", []byte("y"), 0); err != nil {
		t.Skipf("the test directory's filesystem has no trusted xattrs (%v): overlayfs cannot keep an upper layer on it", err)
	}
	if err := unix.Mount("overlay", merged, "overlay", 0, "lowerdir="+lower+",upperdir="+upper+",workdir="+work); err != nil {
		if err == unix.ENODEV {
			t.Skip("overlayfs is not available in this kernel")
		}
		t.Fatalf("mount overlay: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(merged, unix.MNT_DETACH) })
	plain := filepath.Join(dir, "plain")
	must(t, os.WriteFile(plain, nil, 0o644))

	const capRule = 301
	sb := newSandbox(t, eng, l, 0, lsmrules.Rules{
		Ops:  map[lsmrules.Op]lsmrules.Decision{lsmrules.OpIOUring: {Action: enforce.ActionBlock, RuleID: 302}},
		Caps: []lsmrules.CapRule{{Cap: unix.CAP_SYS_ADMIN, Decision: lsmrules.Decision{Action: enforce.ActionBlock, RuleID: capRule}}},
	})
	// The first lookups of the merged tree happen in the sandbox, so
	// overlayfs reads the opaque flag for the sandboxed task.
	res, pid := runOps(t, sb.root, []opSpec{
		{Name: "list_opaque", Kind: "list_dir", Path: filepath.Join(merged, "opaque")},
		{Name: "copy_up", Kind: "append", Path: filepath.Join(merged, "file")},
		{Name: "own_cap", Kind: "set_trusted_xattr", Path: plain},
	})
	if got := res["list_opaque"]; got != "OK from-upper" {
		t.Errorf("opaque directory listed %q in the sandbox, want only the upper layer's entry (OK from-upper)", got)
	}
	if got := res["copy_up"]; got != "OK" {
		t.Errorf("write to a lower-layer file (copy-up) in the sandbox: %s, want OK", got)
	}
	if b, err := os.ReadFile(filepath.Join(upper, "file")); err != nil || string(b) != "lower\nmore\n" {
		t.Errorf("upper layer after the copy-up: %q, %v", b, err)
	}
	if got := res["own_cap"]; got != "EPERM" {
		t.Errorf("the sandbox's own trusted.* setxattr (CAP_SYS_ADMIN): %s, want EPERM", got)
	}
	ev := waitEvent(t, "own CAP_SYS_ADMIN", func(ev audit.Event) bool {
		return ev.Process.TGID == uint32(pid) && ev.Kind == audit.KindCapability &&
			ev.Target != nil && ev.Target.Capability == unix.CAP_SYS_ADMIN
	})
	if ev.Kind != "" && ev.Verdict != audit.VerdictDenied {
		t.Errorf("own CAP_SYS_ADMIN: verdict %s, want denied", ev.Verdict)
	}
	// Events arrive in order per CPU; give stragglers a moment.
	time.Sleep(300 * time.Millisecond)
	n := 0
	for _, e := range eventsFrom(pid) {
		if e.Kind == audit.KindCapability {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d capability events from the sandboxed helper, want exactly 1 (its own setxattr): overlayfs's checks under its mounter's credentials were judged", n)
	}
}
