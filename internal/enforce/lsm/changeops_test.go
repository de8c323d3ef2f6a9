package lsm

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/enforcetest"
	"github.com/watcherhq/watcher/internal/enforce/rules/lsmrules"
)

// changeTree is the fixture of TestChangesJudgedByWriteRules: prot/ is
// write-protected (a prefix rule), secret/ read-protected, ws/ is where
// the sandbox may write.
type changeTree struct {
	dir, prot, secret, ws string
	xattr                 bool // the filesystem takes trusted.* xattrs
}

func newChangeTree(t *testing.T, dir string) changeTree {
	t.Helper()
	os.RemoveAll(dir)
	ct := changeTree{dir: dir, prot: filepath.Join(dir, "prot"), secret: filepath.Join(dir, "secret"), ws: filepath.Join(dir, "ws")}
	for _, d := range []string{"prot/sub", "secret", "ws/sub"} {
		must(t, os.MkdirAll(filepath.Join(dir, d), 0o755))
	}
	for _, f := range []string{"prot/file", "prot/victim", "prot/victim2", "secret/key", "ws/f", "ws/a", "ws/a2", "ws/victim"} {
		must(t, os.WriteFile(filepath.Join(dir, f), []byte("keep\n"), 0o644))
	}
	err := unix.Setxattr(filepath.Join(dir, "prot/file"), "trusted.watcher", []byte("1"), 0)
	switch {
	case err == nil:
		ct.xattr = true
		must(t, unix.Setxattr(filepath.Join(dir, "ws/f"), "trusted.watcher", []byte("1"), 0))
	case errors.Is(err, unix.EOPNOTSUPP):
		t.Logf("%s takes no trusted.* xattrs: setxattr/removexattr not exercised", dir)
	default:
		t.Fatal(err)
	}
	return ct
}

type changeCase struct {
	op     opSpec
	kind   audit.Kind
	fileOp string // FileDetail.Op, for KindFileOp
	path   string // FileDetail.Path, or the operation's message
}

func TestChangesJudgedByWriteRules(t *testing.T) {
	eng, l := setup(t)
	base := t.TempDir()
	dir := filepath.Join(base, "tree")
	ct := newChangeTree(t, dir)
	outside := enforcetest.Cgroup(t, "outside")
	agent := os.Getpid()
	rid := func(op lsmrules.Op) uint32 { return 400 + uint32(op) }
	ops := map[lsmrules.Op]lsmrules.Decision{}
	for _, op := range []lsmrules.Op{lsmrules.OpCloneIntoCgroup, lsmrules.OpPerfEvent, lsmrules.OpUserNS, lsmrules.OpKeyring, lsmrules.OpUserfaultfd, lsmrules.OpIOUring, lsmrules.OpAgentSignal} {
		ops[op] = lsmrules.Decision{Action: enforce.ActionBlock, RuleID: rid(op)}
	}
	sb := newSandbox(t, eng, l, 0, lsmrules.Rules{
		Ops: ops,
		Paths: []lsmrules.PathRule{
			{Path: ct.prot + "/", Prefix: true, Access: lsmrules.AccessWrite, Decision: lsmrules.Decision{Action: enforce.ActionBlock, RuleID: 301}},
			{Path: ct.secret + "/", Prefix: true, Access: lsmrules.AccessRead, Decision: lsmrules.Decision{Action: enforce.ActionBlock, RuleID: 302}},
		},
	})
	p := func(rel string) string { return filepath.Join(dir, rel) }
	fileOp := func(name, kind, path, path2, op, evPath string) changeCase {
		return changeCase{opSpec{Name: name, Kind: kind, Path: path, Path2: path2}, audit.KindFileOp, op, evPath}
	}
	refused := []changeCase{
		fileOp("truncate", "truncate", p("prot/file"), "", "truncate", p("prot/file")),
		fileOp("ftruncate_inherited_fd", "ftruncate_fd3", "", "", "truncate", p("prot/file")),
		// file_open already counts O_TRUNC as a write: it refuses first.
		{opSpec{Name: "open_rdonly_trunc", Kind: "open_rdonly_trunc", Path: p("prot/file")}, audit.KindFileOpen, "", p("prot/file")},
		fileOp("open_rdonly_creat", "open_rdonly_creat", p("prot/new"), "", "create", p("prot/new")),
		fileOp("mkfifo", "mkfifo", p("prot/fifo"), "", "create", p("prot/fifo")),
		fileOp("mkdir", "mkdir", p("prot/d"), "", "mkdir", p("prot/d")),
		fileOp("unlink", "unlink", p("prot/victim"), "", "unlink", p("prot/victim")),
		fileOp("rmdir", "rmdir", p("prot/sub"), "", "rmdir", p("prot/sub")),
		fileOp("symlink", "symlink", p("prot/ln"), "", "symlink", p("prot/ln")),
		fileOp("hardlink_read_protected", "link", p("secret/key"), p("ws/keylink"), "link_source", p("secret/key")),
		fileOp("hardlink_write_protected", "link", p("prot/file"), p("ws/filelink"), "link_source", p("prot/file")),
		fileOp("rename_away", "rename", p("prot/victim2"), p("ws/moved"), "rename_from", p("prot/victim2")),
		fileOp("rename_over", "rename", p("ws/a"), p("prot/file"), "rename_to", p("prot/file")),
		fileOp("chmod_setuid", "chmod_setuid", p("prot/file"), "", "chmod", p("prot/file")),
		fileOp("chown", "chown", p("prot/file"), "", "chown", p("prot/file")),
		fileOp("utimes", "utimes", p("prot/file"), "", "utimes", p("prot/file")),
		{opSpec{Name: "clone_into_cgroup", Kind: "clone_into_cgroup", Path: outside}, audit.KindOperation, "", "clone_into_cgroup"},
		{opSpec{Name: "perf_event_open", Kind: "perf_event_open"}, audit.KindOperation, "", "perf_event_open"},
		{opSpec{Name: "userns", Kind: "userns"}, audit.KindOperation, "", "userns_create"},
		{opSpec{Name: "add_key", Kind: "add_key"}, audit.KindOperation, "", "key_alloc"},
		{opSpec{Name: "userfaultfd", Kind: "userfaultfd"}, audit.KindOperation, "", "userfaultfd"},
	}
	if ct.xattr {
		refused = append(refused,
			fileOp("setxattr", "setxattr", p("prot/file"), "", "setxattr", p("prot/file")),
			fileOp("removexattr", "removexattr", p("prot/file"), "", "removexattr", p("prot/file")))
	}
	benign := []opSpec{
		{Name: "ws_truncate", Kind: "truncate", Path: p("ws/f")},
		{Name: "ws_creat", Kind: "open_rdonly_creat", Path: p("ws/new")},
		{Name: "ws_mkfifo", Kind: "mkfifo", Path: p("ws/fifo")},
		{Name: "ws_mkdir", Kind: "mkdir", Path: p("ws/d")},
		{Name: "ws_unlink", Kind: "unlink", Path: p("ws/victim")},
		{Name: "ws_rmdir", Kind: "rmdir", Path: p("ws/sub")},
		{Name: "ws_symlink", Kind: "symlink", Path: p("ws/ln")},
		{Name: "ws_hardlink", Kind: "link", Path: p("ws/f"), Path2: p("ws/f2")},
		{Name: "ws_rename", Kind: "rename", Path: p("ws/a2"), Path2: p("ws/b")},
		{Name: "ws_chmod", Kind: "chmod_setuid", Path: p("ws/f")},
		{Name: "ws_chown", Kind: "chown", Path: p("ws/f")},
		{Name: "ws_utimes", Kind: "utimes", Path: p("ws/f")},
		{Name: "read_protected_file", Kind: "open", Path: p("prot/file")},
		{Name: "child_in_sandbox", Kind: "fork"},
		{Name: "sigio_self", Kind: "sigio"},
	}
	if ct.xattr {
		benign = append(benign, opSpec{Name: "ws_setxattr", Kind: "setxattr", Path: p("ws/f")},
			opSpec{Name: "ws_removexattr", Kind: "removexattr", Path: p("ws/f")})
	}
	sigioAgent := opSpec{Name: "sigio_agent", Kind: "sigio", PID: agent}
	// Signals to the agent by group: its process group, and kill(-1).
	// SIGCONT, so a hole in the hook would not stop this test.
	pgid, err := unix.Getpgid(agent)
	must(t, err)
	groupKills := []opSpec{{Name: "kill_agent_pgrp", Kind: "kill_pgrp", PID: pgid}, {Name: "kill_all", Kind: "kill_all"}}

	var specs []opSpec
	for _, c := range refused {
		specs = append(specs, c.op)
	}
	specs = append(specs, benign...)
	inherited := func() []*os.File {
		f, err := os.OpenFile(p("prot/file"), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return []*os.File{f}
	}

	res, pid := runOpsFiles(t, sb.root, append(append(specs, sigioAgent), groupKills...), inherited())
	for _, c := range refused {
		if got := res[c.op.Name]; got != "EPERM" {
			t.Errorf("sandbox: %s: %s, want EPERM", c.op.Name, got)
			continue
		}
		ev := waitEvent(t, "sandbox "+c.op.Name, func(ev audit.Event) bool {
			if (ev.Process.TGID != uint32(pid) && ev.Process.PPID != uint32(pid)) || ev.Kind != c.kind {
				return false
			}
			if c.kind == audit.KindOperation {
				// Syscall-scoped decisions name the syscall first
				// ("add_key: key_alloc").
				return ev.Message == c.path || strings.HasSuffix(ev.Message, ": "+c.path)
			}
			return ev.File != nil && ev.File.Path == c.path && ev.File.Op == c.fileOp
		})
		if ev.Kind != "" && (ev.Verdict != audit.VerdictDenied || ev.Mechanism != expectedMechanism(t) || ev.Sandbox.CgroupID != sb.rootID) {
			t.Errorf("sandbox: %s: verdict %s mechanism %s sandbox %d", c.op.Name, ev.Verdict, ev.Mechanism, ev.Sandbox.CgroupID)
		}
	}
	for _, b := range benign {
		if got := res[b.Name]; got != "OK" {
			t.Errorf("sandbox: benign %s: %s, want OK", b.Name, got)
		}
	}
	// SIGIO to the agent: setting it up works, the delivery is refused.
	if got := res[sigioAgent.Name]; got != "OK" {
		t.Errorf("sandbox: sigio_agent setup: %s", got)
	}
	waitEvent(t, "sigio to the agent", func(ev audit.Event) bool {
		return ev.Kind == audit.KindSignal && ev.Target != nil && ev.Target.PID == uint32(agent) &&
			ev.Target.Mode == uint32(unix.SIGIO) && ev.Verdict == audit.VerdictDenied
	})
	for _, k := range groupKills {
		if got := res[k.Name]; got != "OK" {
			t.Errorf("sandbox: %s: %s (the call succeeds for the other targets)", k.Name, got)
		}
		waitEvent(t, k.Name, func(ev audit.Event) bool {
			return ev.Kind == audit.KindSignal && ev.Process.TGID == uint32(pid) && ev.Target != nil &&
				ev.Target.PID == uint32(agent) && ev.Target.Mode == uint32(unix.SIGCONT) && ev.Verdict == audit.VerdictDenied
		})
	}
	// Nothing changed where writes are refused.
	if b, err := os.ReadFile(p("prot/file")); err != nil || string(b) != "keep\n" {
		t.Errorf("prot/file now %q (%v)", b, err)
	}
	if st, err := os.Stat(p("prot/file")); err != nil || st.Mode().Perm() != 0o644 || st.Mode()&os.ModeSetuid != 0 {
		t.Errorf("prot/file mode now %v (%v)", st.Mode(), err)
	}
	for _, gone := range []string{"prot/new", "prot/fifo", "prot/d", "prot/ln", "ws/keylink", "ws/filelink", "ws/moved"} {
		if _, err := os.Lstat(p(gone)); err == nil {
			t.Errorf("%s exists: the refused operation happened", gone)
		}
	}
	for _, kept := range []string{"prot/victim", "prot/victim2", "prot/sub", "ws/a"} {
		if _, err := os.Lstat(p(kept)); err != nil {
			t.Errorf("%s: %v", kept, err)
		}
	}
	if procs, err := os.ReadFile(filepath.Join(outside, "cgroup.procs")); err != nil || len(strings.TrimSpace(string(procs))) > 0 {
		t.Errorf("outside cgroup holds %q (%v)", procs, err)
	}

	// Outside every sandbox the same operations work, with no event.
	ct = newChangeTree(t, dir)
	res, pid = runOpsFiles(t, "", specs, inherited())
	for _, s := range specs {
		if got := res[s.Name]; got != "OK" {
			t.Errorf("outside: %s: %s, want OK", s.Name, got)
		}
	}
	time.Sleep(200 * time.Millisecond) // two reader deadlines
	if evs := eventsFrom(pid); len(evs) > 0 {
		t.Errorf("outside: %d events from an unsandboxed process, first %+v", len(evs), evs[0])
	}
}
