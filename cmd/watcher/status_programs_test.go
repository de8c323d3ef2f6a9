package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/recorder"
)

// TestStatusPrograms: `watcher status --programs` finds the agent's own
// programs by its pins and reports what the kernel counted for them while
// a sandbox ran commands; a wrong pin directory is a clear error.
func TestStatusPrograms(t *testing.T) {
	tb := newTestbed(t, "", "{enabled: false}")
	tb.startAgent()
	// Exec events in the sandbox during the window.
	busy := inSandbox(t, tb.cgAbs, "busy", "for i in $(seq 300); do /bin/true; done")
	if err := busy.Start(); err != nil {
		t.Fatal(err)
	}
	out, code := tb.watcher("status", "--programs", "--for", "2s", "--json", "--pin-dir", tb.pinDir)
	busy.Wait()
	if code != 0 {
		t.Fatalf("status --programs: exit %d\n%s", code, out)
	}
	var rows []struct {
		enforce.ProgramCost
		NsPerRun float64 `json:"ns_per_run"`
	}
	if err := json.Unmarshal([]byte(out[strings.Index(out, "["):]), &rows); err != nil {
		t.Fatalf("parse: %v\n%s", err, out)
	}
	byName := map[string]int{}
	for _, r := range rows {
		byName[r.Name]++
		if r.Runs > 0 && r.NsPerRun <= 0 {
			t.Errorf("%s: %d runs in %v: no time per run", r.Name, r.Runs, r.Runtime)
		}
	}
	exec := -1
	for i, r := range rows {
		if r.Name == recorder.ProgExec {
			exec = i
		}
	}
	if exec < 0 || rows[exec].Runs == 0 || rows[exec].Links == 0 {
		t.Fatalf("the exec recording program is missing or did not run while the sandbox ran 300 commands: %+v", rows)
	}
	if len(byName) < 5 {
		t.Errorf("only %d programs found as the agent's: %v", len(byName), byName)
	}
	t.Logf("%d programs; %s: %d runs, %.0f ns/run", len(rows), recorder.ProgExec, rows[exec].Runs, rows[exec].NsPerRun)

	// The table form.
	out, code = tb.watcher("status", "--programs", "--for", "200ms", "--pin-dir", tb.pinDir)
	if code != 0 || !strings.Contains(out, "NS/RUN") || !strings.Contains(out, recorder.ProgExec) {
		t.Errorf("table: exit %d\n%s", code, out)
	}
	out, code = tb.watcher("status", "--programs", "--for", "200ms", "--pin-dir", tb.pinDir+"-none")
	if code == 0 || !strings.Contains(out, "is the agent running") {
		t.Errorf("a pin directory with no agent: exit %d, want a clear error\n%s", code, out)
	}
}

// TestProgramCostTable is the per-program cost table of bench/README.md:
// the agent on the default sandbox, the syscall loop of bench/syscall run
// inside the sandbox and outside every sandbox, and what each program ran
// in that window. A measurement: WATCHER_BENCH_PROGRAMS=1 (host, or the
// qemu guest through test/vm/run.sh --env).
func TestProgramCostTable(t *testing.T) {
	if os.Getenv("WATCHER_BENCH_PROGRAMS") == "" {
		t.Skip("a measurement: WATCHER_BENCH_PROGRAMS=1 runs it")
	}
	tb := newTestbed(t, "", "{enabled: false}")
	tb.startAgent()
	// WATCHER_LOOP_BIN: the loop built on the host (the guest has no Go).
	loop := os.Getenv("WATCHER_LOOP_BIN")
	if loop == "" {
		loop = filepath.Join(t.TempDir(), "loop")
		if out, err := exec.Command("go", "build", "-o", loop, "../../bench/syscall/loop").CombinedOutput(); err != nil {
			t.Fatalf("build the loop: %v\n%s", err, out)
		}
	}
	file := filepath.Join(tb.ws, "probe")
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	iters := "200000"
	inside := inSandbox(t, tb.cgAbs, "loop", loop+" "+iters+" "+file+" >/dev/null")
	outside := exec.Command(loop, iters, file)
	for _, c := range []*exec.Cmd{inside, outside} {
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
	}
	out, code := tb.watcher("status", "--programs", "--for", "5s", "--pin-dir", tb.pinDir)
	inside.Wait()
	outside.Wait()
	if code != 0 {
		t.Fatalf("status --programs: exit %d\n%s", code, out)
	}
	t.Logf("per-program cost, loops inside and outside the sandbox:\n%s", out)
}
