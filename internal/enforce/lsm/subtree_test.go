package lsm

import (
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

// startTargetIn starts a sleeper in cgroup cg ("" for none), killed at
// cleanup.
func startTargetIn(t *testing.T, cg string) int {
	t.Helper()
	cmd := enforcetest.SelfCommand(t, cg, "TestLSMSleeper", "sleep")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return cmd.Process.Pid
}

// subtreeCase is one technique reaching outside the sandbox's subtree.
type subtreeCase struct {
	op        opSpec
	want      string // errno inside the sandbox
	kind      audit.Kind
	rule      uint32
	outsideOK bool // succeeds outside every sandbox (else gets past the hook and fails on its own)
	msg       string
	target    int // the event's target pid, 0: not checked
}

// TestOwnSubtreeOnly: from a sandbox (its root cgroup and a nested one),
// every technique aimed at a process, IPC object, terminal or file
// outside its subtree is refused with EPERM (EACCES where /proc turns a
// refused ptrace check into it) and reported with its rule; the same
// operations on its own processes, objects and workspace work; outside
// every sandbox nothing changes.
func TestOwnSubtreeOnly(t *testing.T) {
	eng, l := setup(t)
	ws := t.TempDir()
	outsideFile := filepath.Join(t.TempDir(), "credentials")
	must(t, os.WriteFile(outsideFile, []byte("token\n"), 0o600))
	wsFile := filepath.Join(ws, "main.go")
	must(t, os.WriteFile(wsFile, []byte("package main\n"), 0o644))

	const (
		ruleTask   = 126
		ruleIPC    = 127
		ruleTTY    = 128
		ruleNotify = 129
	)
	sb := newSandbox(t, eng, l, 0, lsmrules.Rules{
		Ops: map[lsmrules.Op]lsmrules.Decision{
			lsmrules.OpOtherTask:  {Action: enforce.ActionBlock, RuleID: ruleTask},
			lsmrules.OpOtherIPC:   {Action: enforce.ActionBlock, RuleID: ruleIPC},
			lsmrules.OpTTYInject:  {Action: enforce.ActionBlock, RuleID: ruleTTY},
			lsmrules.OpNotifyMark: {Action: enforce.ActionBlock, RuleID: ruleNotify},
		},
		NotifyPaths: []string{ws, ws + "/"},
	})
	host := startTargetIn(t, "")
	sibling := startTargetIn(t, sb.root) // same sandbox, another cgroup of it

	// A host System V segment and message queue.
	shmID, err := unix.SysvShmGet(unix.IPC_PRIVATE, 4096, unix.IPC_CREAT|0o600)
	must(t, err)
	t.Cleanup(func() { unix.SysvShmCtl(shmID, unix.IPC_RMID, nil) })
	mqName := fmt.Sprintf("/watcher-%s-%d", t.Name(), os.Getpid())
	mq, err := mqOpen(mqName, unix.O_CREAT|unix.O_EXCL)
	if err != nil {
		t.Fatalf("mq_open: %v", err)
	}
	unix.Close(mq)
	t.Cleanup(func() { mqUnlink(mqName) })

	cases := []subtreeCase{
		{op: opSpec{Name: "kill_host", Kind: "kill", PID: host, Num: uint64(unix.SIGCONT)}, kind: audit.KindSignal, rule: ruleTask, outsideOK: true, target: host},
		{op: opSpec{Name: "kill0_host", Kind: "kill", PID: host, Num: 0}, kind: audit.KindSignal, rule: ruleTask, outsideOK: true, target: host},
		{op: opSpec{Name: "prlimit_host", Kind: "prlimit", PID: host}, kind: audit.KindOperation, rule: ruleTask, outsideOK: true, target: host, msg: "RLIMIT_NOFILE"},
		{op: opSpec{Name: "setpriority_host", Kind: "setpriority", PID: host}, kind: audit.KindOperation, rule: ruleTask, outsideOK: true, target: host, msg: "setpriority"},
		{op: opSpec{Name: "setaffinity_host", Kind: "setaffinity", PID: host}, kind: audit.KindOperation, rule: ruleTask, outsideOK: true, target: host, msg: "sched_"},
		{op: opSpec{Name: "ioprio_host", Kind: "ioprio", PID: host}, kind: audit.KindOperation, rule: ruleTask, outsideOK: true, target: host, msg: "ioprio_set"},
		// migrate_pages asks a ptrace read check before task_movememory.
		{op: opSpec{Name: "migrate_host", Kind: "migrate_pages", PID: host}, kind: audit.KindPtrace, rule: ruleTask, outsideOK: true, target: host},
		{op: opSpec{Name: "environ_host", Kind: "read", Path: fmt.Sprintf("/proc/%d/environ", host)}, want: "EACCES", kind: audit.KindPtrace, rule: ruleTask, outsideOK: true, target: host},
		{op: opSpec{Name: "maps_host", Kind: "read", Path: fmt.Sprintf("/proc/%d/maps", host)}, want: "EACCES", kind: audit.KindPtrace, rule: ruleTask, outsideOK: true, target: host},
		{op: opSpec{Name: "cwd_host", Kind: "readlink", Path: fmt.Sprintf("/proc/%d/cwd", host)}, want: "EACCES", kind: audit.KindPtrace, rule: ruleTask, outsideOK: true, target: host},
		// setns into init's mount namespace, both routes: the
		// namespace file asks a ptrace read check, and so does
		// setns(pidfd) of the task (validate_nsset).
		{op: opSpec{Name: "ns_init", Kind: "open", Path: "/proc/1/ns/mnt"}, want: "EACCES", kind: audit.KindPtrace, rule: ruleTask, outsideOK: true, target: 1},
		{op: opSpec{Name: "setns_init", Kind: "setns_pidfd", PID: 1}, kind: audit.KindPtrace, rule: ruleTask, target: 1},
		{op: opSpec{Name: "tiocsti", Kind: "tiocsti"}, kind: audit.KindOperation, rule: ruleTTY, outsideOK: true, msg: "tty_inject"},
		{op: opSpec{Name: "tioclinux", Kind: "tioclinux"}, kind: audit.KindOperation, rule: ruleTTY, msg: "tty_inject"},
		{op: opSpec{Name: "inotify_outside", Kind: "inotify", Path: outsideFile}, kind: audit.KindFileOp, rule: ruleNotify, outsideOK: true, msg: "notify_mark"},
		// ipcperms turns any refusal into EACCES (shmat, IPC_STAT).
		{op: opSpec{Name: "shmat_host", Kind: "shmat", Num: uint64(shmID)}, want: "EACCES", kind: audit.KindOperation, rule: ruleIPC, outsideOK: true, msg: "other_ipc"},
		{op: opSpec{Name: "shmstat_host", Kind: "shm_stat", Num: uint64(shmID)}, want: "EACCES", kind: audit.KindOperation, rule: ruleIPC, outsideOK: true, msg: "other_ipc"},
		{op: opSpec{Name: "mq_host", Kind: "mq_open", Path: mqName}, kind: audit.KindFileOpen, rule: ruleIPC, outsideOK: true, msg: "other_ipc"},
		// Last: outside every sandbox these remove the host's objects.
		{op: opSpec{Name: "shm_rmid_host", Kind: "shm_rmid", Num: uint64(shmID)}, kind: audit.KindOperation, rule: ruleIPC, outsideOK: true, msg: "ctl command 0"},
		{op: opSpec{Name: "mq_unlink_host", Kind: "mq_unlink", Path: mqName}, kind: audit.KindFileOp, rule: ruleIPC, outsideOK: true, msg: "other_ipc"},
	}
	// The benign neighbours: its own processes, objects, terminal reads,
	// workspace marks; ps and top's reads of a host process.
	benign := []opSpec{
		{Name: "own_children", Kind: "own_children"},
		{Name: "kill_sibling", Kind: "kill", PID: sibling, Num: uint64(unix.SIGCONT)},
		{Name: "prlimit_sibling", Kind: "prlimit", PID: sibling},
		{Name: "environ_sibling", Kind: "read", Path: fmt.Sprintf("/proc/%d/environ", sibling)},
		{Name: "stat_host", Kind: "read", Path: fmt.Sprintf("/proc/%d/stat", host)},
		{Name: "cmdline_host", Kind: "read", Path: fmt.Sprintf("/proc/%d/cmdline", host)},
		{Name: "status_host", Kind: "read", Path: fmt.Sprintf("/proc/%d/status", host)},
		{Name: "environ_self", Kind: "read", Path: "/proc/self/environ"},
		{Name: "tiocgwinsz", Kind: "tiocgwinsz"},
		{Name: "inotify_ws", Kind: "inotify", Path: wsFile},
		{Name: "inotify_ws_root", Kind: "inotify", Path: ws},
		{Name: "shm_own", Kind: "shm_own"},
		{Name: "mq_own", Kind: "mq_own", Path: fmt.Sprintf("/watcher-own-%d", os.Getpid())},
	}
	var specs []opSpec
	for _, c := range cases {
		specs = append(specs, c.op)
	}
	specs = append(specs, benign...)

	runs := []struct{ where, cg string }{{"sandbox", sb.root}, {"nested", sb.nested}}
	for _, run := range runs {
		res, pid := runOps(t, run.cg, specs)
		for _, b := range benign {
			if res[b.Name] != "OK" {
				t.Errorf("%s: benign %s: %s, want OK", run.where, b.Name, res[b.Name])
			}
		}
		for _, c := range cases {
			got := res[c.op.Name]
			if strings.HasPrefix(got, "SKIP") {
				t.Logf("%s: %s skipped: %s", run.where, c.op.Name, got)
				continue
			}
			want := c.want
			if want == "" {
				want = "EPERM"
			}
			if got != want {
				t.Errorf("%s: %s: %s, want %s", run.where, c.op.Name, got, want)
				continue
			}
			ev := waitEvent(t, run.where+" "+c.op.Name, func(ev audit.Event) bool {
				if ev.Process.TGID != uint32(pid) || ev.Kind != c.kind || ev.Rule != fmt.Sprintf("rule-%d", c.rule) {
					return false
				}
				if c.target != 0 && (ev.Target == nil || ev.Target.PID != uint32(c.target)) {
					return false
				}
				return c.msg == "" || strings.Contains(ev.Message, c.msg) || (ev.File != nil && strings.Contains(ev.File.Op, c.msg))
			})
			if ev.Kind == "" {
				continue
			}
			if ev.Verdict != audit.VerdictDenied || ev.Mechanism != expectedMechanism(t) {
				t.Errorf("%s: %s: verdict %s mechanism %s", run.where, c.op.Name, ev.Verdict, ev.Mechanism)
			}
			t.Logf("%s: %s: %s", run.where, c.op.Name, ev.Message)
		}
	}

	// Outside every sandbox: nothing refused, no event.
	res, pid := runOps(t, "", specs)
	for _, c := range cases {
		got := res[c.op.Name]
		if got == "EPERM" || (c.outsideOK && got != "OK" && !strings.HasPrefix(got, "SKIP")) {
			t.Errorf("outside: %s: %s, want OK", c.op.Name, got)
		} else if !c.outsideOK {
			t.Logf("outside: %s got past the hook and then failed with %s", c.op.Name, got)
		}
	}
	for _, b := range benign {
		if res[b.Name] != "OK" {
			t.Errorf("outside: %s: %s, want OK", b.Name, res[b.Name])
		}
	}
	time.Sleep(200 * time.Millisecond) // two reader deadlines
	if evs := eventsFrom(pid); len(evs) > 0 {
		t.Errorf("outside: %d events from an unsandboxed process, first %+v", len(evs), evs[0])
	}
}

// TestSigioOwnerOutsideRefused: a SIGIO/SIGURG owner outside the subtree
// gets no signal when a sandboxed task makes the file ready (the write
// itself succeeds: the kernel drops the signal), with an event naming
// the target.
func TestSigioOwnerOutsideRefused(t *testing.T) {
	eng, l := setup(t)
	sb := newSandbox(t, eng, l, 0, lsmrules.Rules{Ops: map[lsmrules.Op]lsmrules.Decision{lsmrules.OpOtherTask: {Action: enforce.ActionBlock, RuleID: 226}}})
	host := startTargetIn(t, "")
	res, pid := runOps(t, sb.root, []opSpec{{Name: "sigio", Kind: "sigio_owner", PID: host}})
	if res["sigio"] != "OK" {
		t.Fatalf("sigio: %s", res["sigio"])
	}
	waitEvent(t, "sigio to a host process", func(ev audit.Event) bool {
		return ev.Process.TGID == uint32(pid) && ev.Kind == audit.KindSignal && ev.Rule == "rule-226" &&
			ev.Target != nil && ev.Target.PID == uint32(host) && ev.Verdict == audit.VerdictDenied
	})
}
