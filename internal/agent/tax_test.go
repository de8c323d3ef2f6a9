package agent

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/enforcetest"
	"github.com/watcherhq/watcher/internal/enforce/recorder"
	"github.com/watcherhq/watcher/internal/testkit/poll"
	"github.com/watcherhq/watcher/internal/testkit/syscallbench"
)

// TestAgentTax measures what a running agent costs processes outside every
// sandbox (the host-wide tax of syscall tracepoints): a syscall loop bare,
// under an idle agent, while a watcher exec command is announced
// (recording attached), idle again after the recording is detached, with
// the recording forced on as agents before on-demand attach kept it, and
// bare again; medians of interleaved rounds, ratios to bare in the same
// run. It also prints which syscall tracepoints the kernel has linked in
// each state. No thresholds: it prints.
//
//	sudo WATCHER_BENCH_TAX=1 go test -run '^TestAgentTax$' -v ./internal/agent
//	test/vm/run.sh --pkg ./internal/agent --run '^TestAgentTax$' --env WATCHER_BENCH_TAX=1 --boot lsm
func TestAgentTax(t *testing.T) {
	if os.Getenv("WATCHER_BENCH_TAX") == "" {
		t.Skip("a measurement: WATCHER_BENCH_TAX=1 runs it")
	}
	iters, rounds := syscallbench.Iterations(50000), 5
	var loops syscallbench.Rounds
	measure := func(state string) {
		loops.Add(state, enforcetest.SyscallLoop(t, "", "TestAgentTaxLoop", iters))
	}
	linked := map[string]string{}
	for r := 0; r < rounds; r++ {
		measure("bare")
	}
	defer func(d time.Duration) { execIdle = d }(execIdle)
	execIdle = 300 * time.Millisecond
	a, _ := startTestAgent(t, func(cg string) string {
		return fmt.Sprintf(`  - name: tax
    select: {cgroups: [%s]}
    preset: restricted
    # The canary's exec-path probes are watcher exec commands: their
    # leaves would keep the recording attached in every state.
    canary: {enabled: false}
`, cg)
	})
	trIDs, err := a.recorder.ProgramIDs()
	if err != nil {
		t.Fatal(err)
	}
	describe := func(state string) {
		l := kernelLinks(t, trIDs)
		s := fmt.Sprintf("recording sys_enter=%d sys_exit=%d", l[recorder.ProgSysEnter], l[recorder.ProgSysExit])
		if a.backstop.Backstop != nil {
			ids, err := a.backstop.ProgramIDs()
			if err != nil {
				t.Fatal(err)
			}
			bl := kernelLinks(t, ids)
			s += fmt.Sprintf(", backstop sys_enter=%d sys_exit=%d", bl["backstop_sys_enter"], bl["backstop_sys_exit"])
		} else {
			s += ", no backstop"
		}
		linked[state] = s
	}
	waitIdle := func() {
		poll.Eventually(t, 10*time.Second, func() bool { return !a.recorder.denialsOn.Load() }, "recording not detached")
	}
	describe("agent idle")
	for r := 0; r < rounds; r++ {
		measure("agent idle")
		a.exec.lastPrepare.Store(time.Now().Add(time.Hour).UnixNano()) // a command runs
		if err := a.syncRecording(); err != nil {
			t.Fatal(err)
		}
		describe("watcher exec running")
		measure("watcher exec running")
		a.exec.lastPrepare.Store(1)
		waitIdle()
		// As before on-demand attach: recording whenever a backstop loads.
		if err := a.recorder.SetSyscalls(recorder.AttachOptions{Syscalls: true, Denials: true}); err != nil {
			t.Fatal(err)
		}
		describe("recording always on (previous agents)")
		measure("recording always on (previous agents)")
		if err := a.recorder.SetSyscalls(recorder.AttachOptions{Syscalls: a.Plan().SyscallStream}); err != nil {
			t.Fatal(err)
		}
	}
	a.Stop()
	// The pins keep the programs attached after the agent stops.
	if err := enforce.Unpin(a.opts.Policy.Agent.PinDir); err != nil {
		t.Fatal(err)
	}
	for r := 0; r < rounds; r++ {
		measure("bare")
	}
	var b strings.Builder
	fmt.Fprintf(&b, "agent tax outside every sandbox: kernel %s, %d iterations, %d rounds, median ns/op and ratio to bare (same run)\n", syscallbench.KernelRelease(), iters, rounds)
	fmt.Fprintf(&b, "%-40s %20s %20s %20s  %s\n", "state", "openat+close", "stat", "getpid", "linked in the kernel")
	for _, st := range loops.States() {
		fmt.Fprintf(&b, "%-40s", st)
		for _, op := range syscallbench.Ops {
			m := loops.Median(st, op)
			fmt.Fprintf(&b, " %9.0f ns %6.3fx", m, m/loops.Median("bare", op))
		}
		fmt.Fprintf(&b, "  %s\n", linked[st])
	}
	t.Log("\n" + b.String())
	fmt.Print(b.String())
}

// TestAgentTaxLoop is TestAgentTax's loop, in a child process.
func TestAgentTaxLoop(t *testing.T) { enforcetest.SyscallLoopChild(t) }
