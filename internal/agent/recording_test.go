package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/watcherhq/watcher/internal/canary"
	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/backstop"
	"github.com/watcherhq/watcher/internal/enforce/recorder"
	"github.com/watcherhq/watcher/internal/policy"
	"github.com/watcherhq/watcher/internal/testkit/e2etest"
	"github.com/watcherhq/watcher/internal/testkit/poll"
)

// startTestAgent starts a real agent in this process on a private world
// (e2etest.World: pins, sockets, ledger, cgroups), with the policy's
// sandbox list (the entries below "sandboxes:") from sandboxes.
func startTestAgent(t testing.TB, sandboxes func(cgroup string) string) (*Agent, string) {
	t.Helper()
	w := e2etest.New(t, "rec")
	path := filepath.Join(w.Base, "policy.yaml")
	if err := os.WriteFile(path, []byte(w.PolicyHead("")+sandboxes(w.Cgroup)), 0o600); err != nil {
		t.Fatal(err)
	}
	pol, err := policy.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	a, err := Start(context.Background(), Options{Policy: pol})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Stop() }) // before the world's cgroups and pins go
	return a, w.Cgroup
}

// kernelLinks asks the kernel how many links each named program has.
func kernelLinks(t *testing.T, ids map[string]ebpf.ProgramID) map[string]int {
	t.Helper()
	links, err := enforce.LinkedPrograms()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for name, id := range ids {
		out[name] = links[id]
	}
	return out
}

// TestSyscallTracepointsOnDemand: the raw syscall tracepoints are linked in
// the kernel only while something needs them. Recording of watcher exec
// refusals: from a command's PrepareExec, while its leaf cgroup lives,
// and detached after it is gone; the backstop's: exactly when its rules
// need them (on a host where LSM or fmod_ret hooks cover every rule the
// backstop would hold, never).
func TestSyscallTracepointsOnDemand(t *testing.T) {
	defer func(d time.Duration) { execIdle = d }(execIdle)
	execIdle = 500 * time.Millisecond
	a, _ := startTestAgent(t, func(cg string) string {
		return fmt.Sprintf(`  - name: rec
    select: {cgroups: [%s]}
    preset: restricted
    # The canary's exec-path probes are watcher exec commands: they would
    # attach the recording at start.
    canary: {enabled: false}
`, cg)
	})
	trIDs, err := a.recorder.ProgramIDs()
	if err != nil {
		t.Fatal(err)
	}
	var bsIDs map[string]ebpf.ProgramID
	if a.backstop.Backstop != nil {
		if bsIDs, err = a.backstop.ProgramIDs(); err != nil {
			t.Fatal(err)
		}
	}
	plan := a.Plan()
	needBackstop := a.backstop.Backstop != nil && plan.Backstop.NeedsSyscallTracepoints()
	t.Logf("backstop loaded: %v; its rules need syscall tracepoints: %v; syscall stream: %v", a.backstop.Backstop != nil, needBackstop, plan.SyscallStream)
	if os.Getenv("WATCHER_EXPECT_MECH") != "" && (needBackstop || plan.SyscallStream) {
		// The qemu guest (BPF LSM or fmod_ret, and fentry): every rule of
		// the preset has a hook or a per-syscall entry program.
		t.Errorf("LSM guest: the restricted preset still needs syscall tracepoints: backstop syscalls %v, io_uring %+v, compat %+v, stream %v",
			plan.Backstop.For(1).Syscalls, plan.Backstop.For(1).IOUring, plan.Backstop.For(1).Compat, plan.SyscallStream)
	}
	// Where fexit loads, refusals are recorded without syscall tracepoints.
	fexit := a.recorder.FexitError() == nil
	t.Logf("refusals recorded by %v (fexit: %v)", a.recorder.DenialPrograms(), a.recorder.FexitError())
	check := func(state string, denials bool) {
		t.Helper()
		tl := kernelLinks(t, trIDs)
		wantEnter := plan.SyscallStream || (denials && !fexit)
		wantExit := denials && !fexit
		if (tl[recorder.ProgSysEnter] > 0) != wantEnter || (tl[recorder.ProgSysExit] > 0) != wantExit {
			t.Errorf("%s: recording sys_enter %d, sys_exit %d links in the kernel; want sys_enter=%v sys_exit=%v",
				state, tl[recorder.ProgSysEnter], tl[recorder.ProgSysExit], wantEnter, wantExit)
		}
		for _, name := range recorder.FexitPrograms {
			if want := denials && fexit; (tl[name] > 0) != want {
				t.Errorf("%s: %s has %d links, want linked=%v", state, name, tl[name], want)
			}
		}
		if tl[recorder.ProgExec] != 1 || tl[recorder.ProgExit] != 1 {
			t.Errorf("%s: exec/exit recording has %d/%d links, want 1/1", state, tl[recorder.ProgExec], tl[recorder.ProgExit])
		}
		if bsIDs != nil {
			bl := kernelLinks(t, bsIDs)
			if (bl[backstop.ProgSysEnter] > 0) != needBackstop || (bl[backstop.ProgSysExit] > 0) != needBackstop {
				t.Errorf("%s: backstop sys_enter %d, sys_exit %d links; its rules need them: %v", state,
					bl[backstop.ProgSysEnter], bl[backstop.ProgSysExit], needBackstop)
			}
			if bl[backstop.ProgFork] != 1 {
				t.Errorf("%s: backstop fork program has %d links, want 1", state, bl[backstop.ProgFork])
			}
		}
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		poll.Eventually(t, 10*time.Second, cond, "timed out waiting for %s", what)
	}
	check("started, no command yet", false)

	if err := a.PrepareExec(); err != nil {
		t.Fatal(err)
	}
	check("a command announced", true)

	// The command's leaf keeps the recording past the idle time.
	leaf, err := cgroupfs.Abs(filepath.Join(ExecParents(a.Policy(), a.Policy().Sandbox("rec"))[0], "exec-rec-1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := cgroupfs.Create(leaf); err != nil {
		t.Fatal(err)
	}
	waitFor("the exec leaf to be seen", func() bool { return a.exec.leafCount.Load() == 1 })
	time.Sleep(execIdle + 1500*time.Millisecond) // at least one periodic pass after the idle time
	check("a command running past the idle time", true)

	if err := cgroupfs.Remove(leaf); err != nil {
		t.Fatal(err)
	}
	waitFor("the recording to be detached", func() bool { return !a.recorder.denialsOn.Load() })
	check("the command gone", false)

	// The next command attaches them again.
	if err := a.PrepareExec(); err != nil {
		t.Fatal(err)
	}
	check("the next command", true)
}

// TestNoSyscallWidePrograms: on a kernel where every LSM hook and fentry
// program loads (the qemu guest, both boots: WATCHER_EXPECT_MECH), an
// agent with one runtime-placed sandbox links no raw syscall tracepoint
// (the backstop's or the recording's), whatever the preset, also while
// its canary and a watcher exec command with refusals run: their seccomp
// and Landlock refusals are still recorded (fexit programs). Elsewhere it
// says which rules and programs ask for them.
func TestNoSyscallWidePrograms(t *testing.T) {
	guest := os.Getenv("WATCHER_EXPECT_MECH") != ""
	for _, preset := range policy.PresetNames() {
		t.Run(preset, func(t *testing.T) {
			env := newRefusalEnv(t)
			a, cg := startTestAgent(t, func(cg string) string {
				return fmt.Sprintf("  - name: rec\n    select: {cgroups: [%s]}\n    preset: %s\n    escape: {enabled: false}\n    canary: {enabled: true, interval: 1h}\n%s",
					cg, preset, env.sandboxRules())
			})
			plan := a.Plan()
			need := a.backstop.Backstop != nil && plan.Backstop.NeedsSyscallTracepoints()
			// The canary's probes through watcher exec's launcher, then a
			// command of our own: refusals the recording must see.
			reps, err := a.Check("rec")
			if err != nil {
				t.Fatal(err)
			}
			execRefusals := 0
			for _, rep := range reps {
				for _, r := range rep.Results {
					if r.Path != canary.PathExec || r.Expected == canary.Allowed {
						continue
					}
					execRefusals++
					if r.Event != "yes" {
						t.Errorf("canary %s/%s refused (%s) but not recorded: %+v", r.Path, r.Check, r.Got, r)
					}
				}
			}
			refusalRun(t, a, cg, env)
			if !a.recorder.denialsOn.Load() {
				t.Fatal("refusal recording is off right after a command")
			}
			links := map[string]int{}
			if ids, err := a.recorder.ProgramIDs(); err == nil {
				for k, v := range kernelLinks(t, ids) {
					links["recorder "+k] = v
				}
			}
			if a.backstop.Backstop != nil {
				if ids, err := a.backstop.ProgramIDs(); err == nil {
					for k, v := range kernelLinks(t, ids) {
						links["backstop "+k] = v
					}
				}
			}
			wide := links["recorder "+recorder.ProgSysEnter] + links["recorder "+recorder.ProgSysExit] +
				links["backstop "+backstop.ProgSysEnter] + links["backstop "+backstop.ProgSysExit]
			t.Logf("preset %s: backstop rules need syscall tracepoints: %v, syscall stream: %v, syscall-wide links: %d; %d canary exec refusals; refusals recorded by %v (fexit: %v)",
				preset, need, plan.SyscallStream, wide, execRefusals, a.recorder.DenialPrograms(), a.recorder.FexitError())
			if !guest {
				return
			}
			if need || plan.SyscallStream || wide != 0 {
				t.Errorf("LSM guest, preset %s: syscall-wide programs linked (%d; backstop rules need them: %v, stream: %v): backstop syscalls %v, io_uring %+v, compat %+v",
					preset, wide, need, plan.SyscallStream, plan.Backstop.For(1).Syscalls, plan.Backstop.For(1).IOUring, plan.Backstop.For(1).Compat)
			}
			if links["recorder "+recorder.ProgSeccompExit] != 1 || links["recorder "+recorder.ProgFileOpen] != 1 {
				t.Errorf("LSM guest, preset %s: the fexit refusal programs are not linked: %v", preset, links)
			}
		})
	}
}
