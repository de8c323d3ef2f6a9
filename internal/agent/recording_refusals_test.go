package agent

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/enforce/recorder"
	"github.com/watcherhq/watcher/internal/launch"
	"github.com/watcherhq/watcher/internal/ledger"
	"github.com/watcherhq/watcher/internal/testkit/poll"
)

// envRefusalChild makes the test binary the command of refusalRun: it
// tries what the launcher's restrictions refuse, in the directory named
// by the variable, and prints name=errno lines.
const envRefusalChild = "WATCHER_TEST_REFUSAL_CHILD"

// The test binary is also watcher exec's launcher child (launch.Init) and
// the command refusalRun launches, so the same static binary runs in the
// qemu guest.
func TestMain(m *testing.M) {
	launch.Init()
	if dir := os.Getenv(envRefusalChild); dir != "" {
		os.Exit(refusalChild(dir))
	}
	os.Exit(m.Run())
}

// refusalChild makes one refused call of each kind and a benign neighbour.
func refusalChild(dir string) int {
	errno := func(err error) int {
		if e, ok := err.(syscall.Errno); ok {
			return int(e)
		}
		if err != nil {
			return -1
		}
		return 0
	}
	// seccomp: mount is refused with EPERM before the kernel enters it.
	fmt.Printf("mount=%d\n", errno(syscall.Mount("none", dir, "tmpfs", 0, "")))
	// Landlock: the private directory is outside every rule.
	_, err := syscall.Open(filepath.Join(dir, "private", "secret"), syscall.O_RDONLY, 0)
	fmt.Printf("open=%d\n", errno(err))
	fmt.Printf("mkdir=%d\n", errno(syscall.Mkdir(filepath.Join(dir, "private", "made"), 0o755)))
	// The neighbour: the workspace is readable.
	fd, err := syscall.Open(filepath.Join(dir, "ws", "readable"), syscall.O_RDONLY, 0)
	if err == nil {
		syscall.Close(fd)
	}
	fmt.Printf("workspace=%d\n", errno(err))
	return 0
}

// refusalEnv is the refusal child's directory (private/ outside the
// Landlock rules, ws/ the workspace) and the test binary.
type refusalEnv struct{ dir, exe string }

func newRefusalEnv(t *testing.T) refusalEnv {
	t.Helper()
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"private", "ws"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"private/secret", "ws/readable"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return refusalEnv{dir: dir, exe: exe}
}

// sandboxRules are the sandbox's own rules (YAML, indented for a sandbox
// entry) that let the child run whatever the preset: the test binary may
// execute, and the policy's kernel layers leave the directory to
// Landlock, whose refusals are the ones under test.
func (e refusalEnv) sandboxRules() string {
	return fmt.Sprintf("    files: [{name: refusal-test, path: %s/, match: prefix, access: any, action: allow}]\n"+
		"    exec: {rules: [{path: %s/, match: prefix, action: allow}]}\n", e.dir, filepath.Dir(e.exe))
}

// refusalRun launches the refusal child as watcher exec does (PrepareExec,
// then the launcher with seccomp and Landlock in a leaf below cgroup) and
// checks the refusals were refused and recorded in the ledger with their
// syscall, path and mechanism, and the neighbour worked.
func refusalRun(t *testing.T, a *Agent, cgroup string, e refusalEnv) {
	t.Helper()
	dir, exe := e.dir, e.exe
	secret := filepath.Join(dir, "private", "secret")
	rules := launch.DefaultFileRules(filepath.Join(dir, "ws"))
	rules.ReadOnly = append(rules.ReadOnly, filepath.Dir(exe))
	if err := a.PrepareExec(); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	v, err := launch.Run(context.Background(), launch.Config{
		Path: exe, Env: append(os.Environ(), envRefusalChild+"="+dir),
		Stdout: &out, Stderr: &out,
		Sandbox: "rec", CgroupParent: cgroup, Label: "refusals",
		Restrictions: launch.Restrictions{Seccomp: launch.DefaultSeccomp(), Files: &rules},
	})
	if err != nil {
		t.Fatalf("launch: %v\n%s", err, out.String())
	}
	if v.Outcome != launch.OutcomeExited || v.ExitCode != 0 {
		t.Fatalf("refusal child: %s\n%s", v, out.String())
	}
	got := map[string]syscall.Errno{}
	for _, l := range strings.Split(out.String(), "\n") {
		if k, val, ok := strings.Cut(l, "="); ok {
			if n, err := strconv.Atoi(val); err == nil {
				got[k] = syscall.Errno(n)
			}
		}
	}
	want := map[string]syscall.Errno{"mount": syscall.EPERM, "open": syscall.EACCES, "mkdir": syscall.EACCES, "workspace": 0}
	for k, w := range want {
		if g, ok := got[k]; !ok || g != w {
			t.Errorf("%s: errno %d, want %d\n%s", k, g, w, out.String())
		}
	}

	// The records: mount by seccomp; the open and the mkdir by Landlock,
	// with the path the child passed.
	type rec struct{ name, mech, path string }
	wantRecs := []rec{{"mount", recorder.MechanismSeccomp, ""}, {"openat", recorder.MechanismLandlock, secret},
		{"mkdirat", recorder.MechanismLandlock, filepath.Join(dir, "private", "made")}}
	found := map[rec]bool{}
	var seen []string
	ledgerDir := a.Policy().Agent.LedgerDir
	scan := func() bool {
		seen = seen[:0]
		rd, err := ledger.NewReaderFrom(ledgerDir, 0)
		if err != nil {
			return false
		}
		defer rd.Close()
		for {
			r, err := rd.Next()
			if err != nil {
				break
			}
			ev := &r.Event
			if ev.Process.CgroupID != v.CgroupID || ev.Syscall == nil || ev.Verdict != audit.VerdictDenied {
				continue
			}
			path := ""
			if ev.File != nil {
				path = ev.File.Path
			}
			seen = append(seen, fmt.Sprintf("%s/%s %q", ev.Syscall.Name, ev.Mechanism, path))
			found[rec{ev.Syscall.Name, ev.Mechanism, path}] = true
		}
		for _, w := range wantRecs {
			if !found[w] {
				return false
			}
		}
		return true
	}
	if !poll.Within(15*time.Second, scan) {
		t.Errorf("refusals in the ledger from the command's leaf: %v; want %+v", seen, wantRecs)
	}
}
