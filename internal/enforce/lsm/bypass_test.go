package lsm

import (
	"errors"
	"fmt"
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

// bypassOps are the ways to reach target's contents that must all arrive
// at file_open resolved: the judged path is the file's, not the string.
func bypassOps(t *testing.T, dir, name, target string) (ops []opSpec, wantPath map[string]string) {
	t.Helper()
	wantPath = map[string]string{}
	add := func(op opSpec, path string) {
		op.Name = name + "/" + op.Name
		ops = append(ops, op)
		wantPath[op.Name] = path
	}
	add(opSpec{Name: "direct", Kind: "open", Path: target}, target)
	link := filepath.Join(dir, name+".symlink")
	must(t, os.Symlink(target, link))
	add(opSpec{Name: "symlink", Kind: "open", Path: link}, target)
	hard := filepath.Join(dir, name+".hardlink")
	if err := os.Link(target, hard); err == nil {
		// The path is the link's own: the inode rule catches it.
		add(opSpec{Name: "hardlink", Kind: "open", Path: hard}, hard)
	} else if errors.Is(err, unix.EXDEV) {
		t.Logf("%s: no hard link possible (%v): another filesystem", name, err)
	} else {
		t.Fatal(err)
	}
	sub := filepath.Join(dir, name+".sub")
	must(t, os.MkdirAll(sub, 0o755))
	rel, err := filepath.Rel(sub, target)
	must(t, err)
	add(opSpec{Name: "dotdot", Kind: "open", Path: sub + "/" + rel}, target)
	add(opSpec{Name: "proc_self_root", Kind: "open", Path: "/proc/self/root" + target}, target)
	add(opSpec{Name: "opath_proc_fd", Kind: "open_opath_proc", Path: target}, target)
	add(opSpec{Name: "openat2", Kind: "openat2", Path: target}, target)
	add(opSpec{Name: "uring_plain", Kind: "uring", Path: target, Num: uringPlain}, target)
	add(opSpec{Name: "uring_async", Kind: "uring", Path: target, Num: uringAsync}, target)
	add(opSpec{Name: "uring_sqpoll", Kind: "uring", Path: target, Num: uringSQPoll}, target)
	add(opSpec{Name: "uring_fixed", Kind: "uring", Path: target, Num: uringFixed}, target)
	return ops, wantPath
}

func TestFileOpenBypassesRefused(t *testing.T) {
	eng, l := setup(t)
	dir := t.TempDir()
	secret := filepath.Join(dir, "secret")
	must(t, os.WriteFile(secret, []byte("s3cret\n"), 0o600))
	paths := []lsmrules.PathRule{{Path: secret, Decision: lsmrules.Decision{Action: enforce.ActionBlock, RuleID: 301}}}
	ops, want := bypassOps(t, dir, "standin", secret)
	if _, err := os.Stat("/etc/shadow"); err == nil {
		paths = append(paths, lsmrules.PathRule{Path: "/etc/shadow", Decision: lsmrules.Decision{Action: enforce.ActionBlock, RuleID: 302}})
		o, w := bypassOps(t, dir, "shadow", "/etc/shadow")
		ops = append(ops, o...)
		for k, v := range w {
			want[k] = v
		}
	} else {
		t.Logf("no /etc/shadow here (%v): the stand-in carries the test", err)
	}
	sb := newSandbox(t, eng, l, 0, lsmrules.Rules{Paths: paths})

	for _, run := range []struct {
		where string
		cg    string
		cgID  uint64
	}{{"sandbox", sb.root, sb.rootID}, {"nested", sb.nested, sb.nestID}} {
		res, pid := runOps(t, run.cg, ops)
		for _, op := range ops {
			if got := res[op.Name]; got != "EPERM" {
				t.Errorf("%s: %s: %s, want EPERM", run.where, op.Name, got)
				continue
			}
			rule := "rule-301"
			if strings.HasPrefix(op.Name, "shadow/") {
				rule = "rule-302"
			}
			ev := waitEvent(t, run.where+" "+op.Name, func(ev audit.Event) bool {
				return ev.Process.TGID == uint32(pid) && ev.Kind == audit.KindFileOpen && ev.Rule == rule &&
					ev.File != nil && ev.File.Path == want[op.Name]
			})
			if ev.Kind == "" {
				continue
			}
			if ev.Verdict != audit.VerdictDenied || ev.Process.CgroupID != run.cgID || ev.Sandbox.CgroupID != sb.rootID {
				t.Errorf("%s: %s: event %+v", run.where, op.Name, ev)
			}
			if strings.HasSuffix(op.Name, "/hardlink") && ev.Message != "matched by inode rule" {
				t.Errorf("%s: %s: %q, want the inode rule", run.where, op.Name, ev.Message)
			}
			// io_uring's worker and SQPOLL threads belong to the process.
			if strings.HasSuffix(op.Name, "/uring_async") || strings.HasSuffix(op.Name, "/uring_sqpoll") {
				t.Logf("%s: %s: judged in thread %d %q", run.where, op.Name, ev.Process.PID, ev.Process.Comm)
			}
		}
	}
	res, _ := runOps(t, "", ops)
	for _, op := range ops {
		if res[op.Name] != "OK" {
			t.Errorf("outside: %s: %s, want OK", op.Name, res[op.Name])
		}
	}
}

func TestRecordModeAllowsAndReports(t *testing.T) {
	eng, l := setup(t)
	dir := t.TempDir()
	recorded := filepath.Join(dir, "recorded")
	blocked := filepath.Join(dir, "blocked")
	must(t, os.WriteFile(recorded, nil, 0o600))
	must(t, os.WriteFile(blocked, nil, 0o600))
	rules := lsmrules.Rules{
		Paths: []lsmrules.PathRule{
			{Path: recorded, Decision: lsmrules.Decision{Action: enforce.ActionRecord, RuleID: 401}},
			{Path: blocked, Decision: lsmrules.Decision{Action: enforce.ActionBlock, RuleID: 402}},
		},
		Ops:  map[lsmrules.Op]lsmrules.Decision{lsmrules.OpBPF: {Action: enforce.ActionRecord, RuleID: 403}},
		Caps: []lsmrules.CapRule{{Cap: unix.CAP_SYS_RESOURCE, Decision: lsmrules.Decision{Action: enforce.ActionRecord, RuleID: 404}}},
	}
	ops := []opSpec{
		{Name: "recorded", Kind: "open", Path: recorded},
		{Name: "blocked", Kind: "open", Path: blocked},
		{Name: "bpf", Kind: "bpf_map_create"},
		{Name: "cap", Kind: "raise_nofile"},
	}
	// A rule in record mode; then a record-only sandbox downgrading blocks.
	for _, mode := range []struct {
		name  string
		flags uint32
		want  map[string]string
	}{
		{"record rules", 0, map[string]string{"recorded": "OK", "blocked": "EPERM", "bpf": "OK", "cap": "OK"}},
		{"record-only sandbox", enforce.SandboxRecordOnly, map[string]string{"recorded": "OK", "blocked": "OK", "bpf": "OK", "cap": "OK"}},
	} {
		sb := newSandbox(t, eng, l, mode.flags, rules)
		res, pid := runOps(t, sb.nested, ops)
		for name, want := range mode.want {
			if res[name] != want {
				t.Errorf("%s: %s: %s, want %s", mode.name, name, res[name], want)
			}
		}
		expect := []struct {
			rule    string
			verdict audit.Verdict
			kind    audit.Kind
		}{
			{"rule-401", audit.VerdictRecorded, audit.KindFileOpen},
			{"rule-403", audit.VerdictRecorded, audit.KindBPF},
			{"rule-404", audit.VerdictRecorded, audit.KindCapability},
		}
		if mode.flags&enforce.SandboxRecordOnly != 0 {
			expect = append(expect, struct {
				rule    string
				verdict audit.Verdict
				kind    audit.Kind
			}{"rule-402", audit.VerdictRecorded, audit.KindFileOpen})
		} else {
			expect = append(expect, struct {
				rule    string
				verdict audit.Verdict
				kind    audit.Kind
			}{"rule-402", audit.VerdictDenied, audit.KindFileOpen})
		}
		for _, e := range expect {
			ev := waitEvent(t, fmt.Sprintf("%s %s", mode.name, e.rule), func(ev audit.Event) bool {
				return ev.Process.TGID == uint32(pid) && ev.Rule == e.rule && ev.Kind == e.kind
			})
			if ev.Kind != "" && ev.Verdict != e.verdict {
				t.Errorf("%s: %s: verdict %s, want %s", mode.name, e.rule, ev.Verdict, e.verdict)
			}
			if ev.Kind != "" && ev.Severity != audit.SeverityAlert {
				t.Errorf("%s: %s: severity %s: recorded rule matches are alerts", mode.name, e.rule, ev.Severity)
			}
		}
	}
}

// TestPinnedLinksOutliveTheLoader loads a second, independent group (own
// pin directory), drops every Go object, checks the kernel still refuses,
// re-loads (adopting the same links), then detaches.
func TestPinnedLinksOutliveTheLoader(t *testing.T) {
	setup(t) // skips where the kernel refuses LSM programs
	eng := enforcetest.Engine(t)
	dir := t.TempDir()
	secret := filepath.Join(dir, "secret")
	must(t, os.WriteFile(secret, nil, 0o600))

	l, err := Load(eng)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]any{}
	var hooks []string // those this kernel has
	for _, h := range Hooks() {
		if !errors.Is(l.Status()[h], ErrHookAbsent) {
			hooks = append(hooks, h)
		}
	}
	for _, h := range hooks {
		ids[h] = l.LinkID(h)
		if l.Adopted(h) {
			t.Errorf("lsm/%s adopted on a fresh pin directory", h)
		}
		if _, err := os.Stat(filepath.Join(enforce.LinkPinDir(eng.PinDir(), Group), h)); err != nil {
			t.Errorf("lsm/%s link not pinned: %v", h, err)
		}
	}
	cg := enforcetest.Cgroup(t, "pinned")
	if _, err := eng.AddSandbox(cg, 77, 0); err != nil {
		t.Fatal(err)
	}
	if err := l.SetRules(77, lsmrules.Rules{Paths: []lsmrules.PathRule{{Path: secret, Decision: lsmrules.Decision{Action: enforce.ActionBlock, RuleID: 1}}}}); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	op := []opSpec{{Name: "open", Kind: "open", Path: secret}}
	if res, _ := runOps(t, cg, op); res["open"] != "EPERM" {
		t.Fatalf("after Close (pins only): %s, want EPERM", res["open"])
	}

	again, err := Load(eng)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hooks {
		if !again.Adopted(h) || again.LinkID(h) != ids[h] {
			t.Errorf("lsm/%s: adopted %v, link %v, want the pinned link %v", h, again.Adopted(h), again.LinkID(h), ids[h])
		}
	}
	if res, _ := runOps(t, cg, op); res["open"] != "EPERM" {
		t.Fatalf("after re-load: %s, want EPERM", res["open"])
	}
	t0 := time.Now()
	if err := again.Detach(); err != nil {
		t.Fatal(err)
	}
	t.Logf("Detach: %v", time.Since(t0))
	if res, _ := runOps(t, cg, op); res["open"] != "OK" {
		t.Fatalf("after Detach: %s, want OK", res["open"])
	}
}
