package lsm

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/rules/lsmrules"
)

// TestExecRulesJudgeTheCodeFile: an exec rule on a directory means what a
// noexec mount there means. The binary, a script's interpreter, a script
// itself, and files mapped executable are judged; the same from the
// workspace works.
func TestExecRulesJudgeTheCodeFile(t *testing.T) {
	eng, l := setup(t)
	dir := t.TempDir()
	noexec, ws := filepath.Join(dir, "noexec"), filepath.Join(dir, "ws")
	must(t, os.MkdirAll(noexec, 0o755))
	must(t, os.MkdirAll(ws, 0o755))
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// The test binary (static in the guest) is the program; copies by
	// hard link where the filesystem allows.
	place := func(dst string) {
		if err := os.Link(self, dst); err != nil {
			b, err := os.ReadFile(self)
			must(t, err)
			must(t, os.WriteFile(dst, b, 0o755))
		}
	}
	prog, interp, wsProg := filepath.Join(noexec, "prog"), filepath.Join(noexec, "interp"), filepath.Join(ws, "prog")
	place(prog)
	place(interp)
	place(wsProg)
	script := func(path, interpreter string) string {
		// The interpreter is this test binary: its flag goes on the #!
		// line, before the script's path ends flag parsing.
		must(t, os.WriteFile(path, []byte(fmt.Sprintf("#!%s -test.run=^$\n", interpreter)), 0o755))
		return path
	}
	wsScriptBadInterp := script(filepath.Join(ws, "bad-interp.sh"), interp)
	wsScript := script(filepath.Join(ws, "ok.sh"), wsProg)
	noexecScript := script(filepath.Join(noexec, "s.sh"), wsProg)
	lib, wsLib := filepath.Join(noexec, "lib.so"), filepath.Join(ws, "lib.so")
	must(t, os.WriteFile(lib, make([]byte, 8192), 0o644))
	must(t, os.WriteFile(wsLib, make([]byte, 8192), 0o644))

	sb := newSandbox(t, eng, l, 0, lsmrules.Rules{Exec: []lsmrules.ExecRule{
		{Path: noexec + "/", Prefix: true, Decision: lsmrules.Decision{Action: enforce.ActionBlock, RuleID: 501}},
	}, Ops: map[lsmrules.Op]lsmrules.Decision{lsmrules.OpExecFileless: {Action: enforce.ActionBlock, RuleID: 502}}})
	refused := []struct {
		op     opSpec
		fileOp string
		path   string
	}{
		{opSpec{Name: "exec_binary", Kind: "exec", Path: prog}, "exec", prog},
		{opSpec{Name: "script_with_interpreter_there", Kind: "exec", Path: wsScriptBadInterp}, "exec", interp},
		{opSpec{Name: "script_there", Kind: "exec", Path: noexecScript}, "exec", noexecScript},
		{opSpec{Name: "mmap_exec", Kind: "mmap_exec", Path: lib}, "mmap_exec", lib},
		{opSpec{Name: "mprotect_exec", Kind: "mprotect_exec", Path: lib}, "mmap_exec", lib},
		// A file with no name: the fileless op decides (rule 502).
		{opSpec{Name: "memfd_exec", Kind: "memfd_exec", Path: wsProg}, "exec", "memfd:payload"},
		{opSpec{Name: "memfd_mmap_exec", Kind: "memfd_mmap_exec", Path: wsLib}, "mmap_exec", "memfd:payload"},
	}
	benign := []opSpec{
		{Name: "ws_exec_binary", Kind: "exec", Path: wsProg},
		{Name: "ws_script", Kind: "exec", Path: wsScript},
		{Name: "ws_mmap_exec", Kind: "mmap_exec", Path: wsLib},
		{Name: "mmap_read_there", Kind: "mmap_read", Path: lib},
	}
	var specs []opSpec
	for _, c := range refused {
		specs = append(specs, c.op)
	}
	specs = append(specs, benign...)
	res, pid := runOps(t, sb.root, specs)
	for _, c := range refused {
		if got := res[c.op.Name]; got != "EPERM" {
			t.Errorf("sandbox: %s: %s, want EPERM", c.op.Name, got)
			continue
		}
		ev := waitEvent(t, "sandbox "+c.op.Name, func(ev audit.Event) bool {
			return (ev.Process.TGID == uint32(pid) || ev.Process.PPID == uint32(pid)) && ev.Kind == audit.KindFileOp &&
				ev.File != nil && ev.File.Op == c.fileOp && ev.File.Path == c.path &&
				(ev.Rule == "rule-501" || strings.HasPrefix(c.path, "memfd:") && ev.Rule == "rule-502")
		})
		if ev.Kind != "" && (ev.Verdict != audit.VerdictDenied || ev.Mechanism != expectedMechanism(t)) {
			t.Errorf("sandbox: %s: verdict %s mechanism %s", c.op.Name, ev.Verdict, ev.Mechanism)
		}
	}
	for _, b := range benign {
		if got := res[b.Name]; got != "OK" {
			t.Errorf("sandbox: benign %s: %s, want OK", b.Name, got)
		}
	}
	res, _ = runOps(t, "", specs)
	for _, s := range specs {
		if got := res[s.Name]; got != "OK" {
			t.Errorf("outside: %s: %s, want OK", s.Name, got)
		}
	}
}
