package lsm

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/enforcetest"
	"github.com/watcherhq/watcher/internal/enforce/rules/lsmrules"
	"github.com/watcherhq/watcher/internal/testkit/poll"
)

// The hook tests share one engine and one loaded group (loading 14
// programs takes seconds under qemu's software emulation); each test uses
// its own sandbox cgroup and sandbox id.
var shared struct {
	once    sync.Once
	dir     string
	eng     *enforce.Engine
	lsm     *LSM
	err     error
	skip    string
	cancel  context.CancelFunc
	done    chan struct{}
	mu      sync.Mutex
	events  []audit.Event
	used    map[int]bool // events a test already matched
	nextSID atomic.Uint32
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.eng != nil {
		shared.cancel()
		<-shared.done
		if shared.lsm != nil {
			shared.lsm.Detach()
		}
		shared.eng.Close()
		enforce.Unpin(shared.dir)
	}
	os.Exit(code)
}

func randHex() string {
	b := make([]byte, 4)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// allRefused reports whether every hook failed with the kernel refusing
// the program (EPERM at load): the kernel lacks usable BPF LSM, not a bug.
func allRefused(l *LSM, err error) bool {
	var le *LoadError
	if l == nil || !errors.As(err, &le) {
		return false
	}
	present := 0
	for _, e := range l.Status() {
		if !errors.Is(e, ErrHookAbsent) {
			present++
		}
	}
	if len(le.Hooks) != present {
		return false
	}
	for _, e := range le.Hooks {
		if !errors.Is(e, unix.EPERM) {
			return false
		}
	}
	return true
}

// setup loads the shared group, or skips the test with the kernel's reason
// when it refuses BPF LSM programs.
func setup(t *testing.T) (*enforce.Engine, *LSM) {
	t.Helper()
	enforcetest.RequireRoot(t)
	shared.once.Do(func() {
		shared.nextSID.Store(100)
		if err := enforce.EnsureBPFFS("/sys/fs/bpf"); err != nil {
			shared.err = err
			return
		}
		shared.dir = filepath.Join("/sys/fs/bpf", "watcher-lsmtest-"+randHex())
		eng, err := enforce.Open(enforce.Options{PinDir: shared.dir})
		if err != nil {
			shared.err = err
			return
		}
		shared.eng = eng
		l, err := Load(eng)
		if err != nil {
			refused := allRefused(l, err)
			if l != nil {
				l.Detach()
			}
			if refused {
				shared.skip = err.Error()
			} else {
				shared.err = err
			}
		} else {
			shared.lsm = l
		}
		if err := eng.SetAgentPID(os.Getpid()); err != nil && shared.err == nil {
			shared.err = err
		}
		ctx, cancel := context.WithCancel(context.Background())
		shared.cancel = cancel
		shared.done = make(chan struct{})
		rd := eng.NewReader(enforce.ReaderOptions{
			// Every refusal is checked for its own event: no folding of
			// identical ones into burst records.
			Burst: -1,
		})
		Register(rd)
		go func() {
			go rd.Run(ctx)
			for ev := range rd.Events() {
				shared.mu.Lock()
				shared.events = append(shared.events, ev)
				shared.mu.Unlock()
			}
			close(shared.done)
		}()
	})
	if shared.skip != "" {
		t.Skipf("this kernel refuses BPF LSM programs; `make test-vm` runs these tests in a qemu guest: %s", shared.skip)
	}
	if shared.err != nil {
		t.Fatalf("set up LSM group: %v", shared.err)
	}
	return shared.eng, shared.lsm
}

// sandbox creates a sandbox cgroup with a nested cgroup below it,
// registers it under a fresh sandbox id and sets rules.
type sandboxFixture struct {
	sid            uint32
	root, nested   string
	rootID, nestID uint64
}

func newSandbox(t *testing.T, eng *enforce.Engine, l *LSM, flags uint32, rules lsmrules.Rules) sandboxFixture {
	t.Helper()
	sid := shared.nextSID.Add(1)
	root := enforcetest.Cgroup(t, "sb")
	nested := enforcetest.Child(t, root, "nested")
	rootID, err := eng.AddSandbox(root, sid, flags)
	if err != nil {
		t.Fatal(err)
	}
	nestID, err := cgroupfs.ID(nested)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.SetRules(sid, rules); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.ClearRules(sid); err != nil {
			t.Errorf("clear rules: %v", err)
		}
		if err := eng.RemoveSandbox(rootID); err != nil {
			t.Errorf("remove sandbox: %v", err)
		}
	})
	return sandboxFixture{sid: sid, root: root, nested: nested, rootID: rootID, nestID: nestID}
}

// waitEvent waits for an event matching pred that no earlier call
// matched, so two operations cannot be proven by one event.
func waitEvent(t *testing.T, what string, pred func(audit.Event) bool) audit.Event {
	t.Helper()
	var found audit.Event
	if !poll.Within(15*time.Second, func() bool {
		shared.mu.Lock()
		defer shared.mu.Unlock()
		if shared.used == nil {
			shared.used = map[int]bool{}
		}
		for i, ev := range shared.events {
			if !shared.used[i] && pred(ev) {
				shared.used[i] = true
				found = ev
				return true
			}
		}
		return false
	}) {
		t.Errorf("no event for %s", what)
	}
	return found
}

// eventsFrom returns the events of process tgid (or its children).
func eventsFrom(pid int) []audit.Event {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	var out []audit.Event
	for _, ev := range shared.events {
		if ev.Process.TGID == uint32(pid) || ev.Process.PPID == uint32(pid) {
			out = append(out, ev)
		}
	}
	return out
}

func helperComm() string {
	c := filepath.Base(os.Args[0])
	if len(c) > 15 {
		c = c[:15]
	}
	return c
}

func TestProbeAgreesWithLoad(t *testing.T) {
	enforcetest.RequireRoot(t)
	t0 := time.Now()
	res, probeMech := ProbeMechanisms()
	t.Logf("Probe: %v", time.Since(t0))
	hooks := Hooks()
	spec, err := loadLsm()
	if err != nil {
		t.Fatal(err)
	}
	// Every decision is built for both attach types; the fentry programs
	// on syscall entry points (no hook) are the one kind alone.
	for h, progs := range programsByHook(spec) {
		if progs[lsmrules.MechFentry] != "" && len(progs) == 1 {
			continue
		}
		if progs[lsmrules.MechLSM] == "" || progs[lsmrules.MechFmodRet] == "" {
			t.Errorf("hook %s has programs %v, want one per mechanism", h, progs)
		}
	}
	refused := 0
	for _, h := range hooks {
		err, ok := res[h]
		if !ok {
			t.Fatalf("Probe has no entry for lsm/%s", h)
		}
		if errors.Is(err, ErrHookAbsent) {
			t.Logf("lsm/%s: not in this kernel", h)
			continue
		}
		if err != nil {
			refused++
			if !strings.Contains(err.Error(), "kernel refused") && !errors.Is(err, unix.EPERM) {
				t.Errorf("lsm/%s refused for an unexpected reason: %v", h, err)
			}
		}
		t.Logf("lsm/%s: %v", h, err)
	}
	// The agent's one-program check before Load agrees with the probe of
	// every hook: some hook loads exactly when Usable says so.
	t0 = time.Now()
	usable, checked, checkedMech := Check()
	anyHook := false
	for _, h := range hooks {
		anyHook = anyHook || res[h] == nil
	}
	t.Logf("Check: usable %v in %v", usable, time.Since(t0))
	if usable != anyHook {
		t.Errorf("Check() usable %v, but the probe finds a loadable hook: %v", usable, anyHook)
	}
	if !usable {
		// Where nothing loads, Check's statuses are the probe's.
		for _, h := range hooks {
			if (checked[h] == nil) != (res[h] == nil) || checkedMech[h] != probeMech[h] {
				t.Errorf("lsm/%s: Check says %v (%q), Probe says %v (%q)", h, checked[h], checkedMech[h], res[h], probeMech[h])
			}
		}
	}
	eng := enforcetest.Engine(t)
	t0 = time.Now()
	l, err := Load(eng)
	t.Logf("Load: %v", time.Since(t0))
	if l == nil {
		t.Fatalf("Load returned no group: %v", err)
	}
	defer func() {
		t0 := time.Now()
		l.Detach()
		t.Logf("Detach: %v", time.Since(t0))
	}()
	status := l.Status()
	for _, h := range hooks {
		if (res[h] == nil) != (status[h] == nil) || probeMech[h] != l.Mechanisms()[h] {
			t.Errorf("lsm/%s: Probe says %v (%q), Load says %v (%q)", h, res[h], probeMech[h], status[h], l.Mechanisms()[h])
		}
	}
	if refused > 0 {
		var le *LoadError
		if !errors.As(err, &le) || len(le.Hooks) != refused {
			t.Fatalf("Load error %v, want a LoadError naming the %d refused hooks", err, refused)
		}
		for h := range le.Hooks {
			if !strings.Contains(err.Error(), "lsm/"+h+":") {
				t.Errorf("Load error does not name lsm/%s", h)
			}
		}
	} else if err != nil {
		t.Fatalf("every hook probes fine but Load failed: %v", err)
	}
}

// expectedMechanism is the mechanism every hook must use on this boot:
// WATCHER_EXPECT_MECH when test/vm/run.sh says which boot this is, else
// what the active LSM list implies.
func expectedMechanism(t *testing.T) string {
	if m := os.Getenv("WATCHER_EXPECT_MECH"); m != "" {
		return m
	}
	lsms, err := os.ReadFile("/sys/kernel/security/lsm")
	if err != nil {
		t.Fatalf("active LSM list: %v", err)
	}
	for _, n := range strings.Split(strings.TrimSpace(string(lsms)), ",") {
		if n == "bpf" {
			return lsmrules.MechLSM
		}
	}
	return lsmrules.MechFmodRet
}

func mustSpec(t *testing.T) *ebpf.CollectionSpec {
	spec, err := loadLsm()
	if err != nil {
		t.Fatal(err)
	}
	return spec
}

// TestMechanismPerBoot checks that every hook this kernel has runs under
// the mechanism the boot calls for: BPF LSM where `bpf` is an active LSM,
// fmod_ret on the security_* function where it is not.
func TestMechanismPerBoot(t *testing.T) {
	_, l := setup(t)
	want := expectedMechanism(t)
	mechs := l.Mechanisms()
	status := l.Status()
	for _, h := range Hooks() {
		if errors.Is(status[h], ErrHookAbsent) {
			t.Logf("%s: not in this kernel", h)
			continue
		}
		if status[h] != nil {
			t.Errorf("%s: %v", h, status[h])
			continue
		}
		w := want
		if progs := programsByHook(mustSpec(t))[h]; progs[lsmrules.MechFentry] != "" {
			w = lsmrules.MechFentry // a syscall's entry point, not a hook
		}
		if mechs[h] != w {
			t.Errorf("%s runs as %q, want %q", h, mechs[h], w)
		}
	}
	t.Logf("mechanism %s for %d hooks", want, len(mechs))
}

func TestSetRulesValidates(t *testing.T) {
	_, l := setup(t)
	bad := []lsmrules.Rules{
		{Paths: []lsmrules.PathRule{{Path: "relative", Decision: lsmrules.Decision{Action: enforce.ActionBlock}}}},
		{Paths: []lsmrules.PathRule{{Path: "/" + strings.Repeat("a", 260)}}},
		{Ops: map[lsmrules.Op]lsmrules.Decision{lsmrules.Op(99): {Action: enforce.ActionBlock}}},
		{Caps: []lsmrules.CapRule{{Cap: 64}}},
		{Ops: map[lsmrules.Op]lsmrules.Decision{lsmrules.OpBPF: {Action: 9}}},
	}
	for i, r := range bad {
		if err := l.SetRules(9999, r); err == nil {
			t.Errorf("bad rules %d accepted", i)
		}
	}
}

func TestPathInheritance(t *testing.T) {
	entries, err := buildPaths([]lsmrules.PathRule{
		{Path: "/proc/sys/", Prefix: true, Access: lsmrules.AccessWrite, Decision: lsmrules.Decision{Action: enforce.ActionBlock, RuleID: 1}},
		{Path: "/proc/", Prefix: true, Access: lsmrules.AccessRead, Decision: lsmrules.Decision{Action: enforce.ActionRecord, RuleID: 2}},
		{Path: "/proc/sys/kernel/hostname", Access: lsmrules.AccessRead, Decision: lsmrules.Decision{Action: enforce.ActionAllow, RuleID: 3}},
	})
	if err != nil {
		t.Fatal(err)
	}
	check := func(key string, r lsmAccessRule) {
		t.Helper()
		e, ok := entries[key]
		if !ok {
			t.Fatalf("no entry %q", key)
		}
		if e.rule != r {
			t.Errorf("%q: %+v, want %+v", key, e.rule, r)
		}
	}
	check("/proc/sys/", lsmAccessRule{ReadAction: enforce.ActionRecord, ReadRule: 2, WriteAction: enforce.ActionBlock, WriteRule: 1})
	check("/proc/sys\x00", lsmAccessRule{ReadAction: enforce.ActionRecord, ReadRule: 2, WriteAction: enforce.ActionBlock, WriteRule: 1})
	check("/proc/sys/kernel/hostname\x00", lsmAccessRule{ReadAction: enforce.ActionAllow, ReadRule: 3, WriteAction: enforce.ActionBlock, WriteRule: 1})
	check("/proc/", lsmAccessRule{ReadAction: enforce.ActionRecord, ReadRule: 2})
}

// hookCase is one operation: how to do it, what event proves the hook
// judged it, and whether it must succeed outside the sandbox (some only
// get past the hook and then fail for their own reasons, e.g. a junk
// module).
type hookCase struct {
	op        opSpec
	kind      audit.Kind
	rule      uint32
	outsideOK bool
	check     func(ev audit.Event) bool
}

// insideErrno is the errno inside the sandbox when not EPERM: /proc files
// turn a refused ptrace access check into EACCES.
var insideErrno = map[string]string{"proc_environ": "EACCES", "agent_environ": "EACCES"}

func TestHooksRefuseInsideAllowOutside(t *testing.T) {
	eng, l := setup(t)
	dir := t.TempDir()
	secret := filepath.Join(dir, "secret")
	must(t, os.WriteFile(secret, []byte("s3cret\n"), 0o600))
	junk := filepath.Join(dir, "junk.ko")
	must(t, os.WriteFile(junk, []byte("not a module"), 0o600))
	blk := filepath.Join(dir, "blk")
	must(t, unix.Mknod(blk, unix.S_IFBLK|0o600, int(unix.Mkdev(240, 7))))
	mem := filepath.Join(dir, "mem")
	must(t, unix.Mknod(mem, unix.S_IFCHR|0o600, int(unix.Mkdev(1, 1))))
	for _, d := range []string{"mnt", "um", "mvsrc", "mvdst", "pr", "pr/old"} {
		must(t, os.MkdirAll(filepath.Join(dir, d), 0o755))
	}
	target := startTarget(t)
	tpid := target.Process.Pid
	addr := firstMapping(t, tpid)
	agent := os.Getpid()

	rid := func(op lsmrules.Op) uint32 { return 100 + uint32(op) }
	ops := map[lsmrules.Op]lsmrules.Decision{}
	for op := lsmrules.OpPtraceAttach; op < opMax; op++ {
		ops[op] = lsmrules.Decision{Action: enforce.ActionBlock, RuleID: rid(op)}
	}
	sb := newSandbox(t, eng, l, 0, lsmrules.Rules{
		Ops: ops,
		Paths: []lsmrules.PathRule{
			{Path: secret, Decision: lsmrules.Decision{Action: enforce.ActionBlock, RuleID: 201}},
			{Path: "/proc/sys/", Prefix: true, Access: lsmrules.AccessWrite, Decision: lsmrules.Decision{Action: enforce.ActionBlock, RuleID: 202}},
		},
		FS:      []lsmrules.FSRule{{Magic: unix.CGROUP2_SUPER_MAGIC, Access: lsmrules.AccessWrite, Decision: lsmrules.Decision{Action: enforce.ActionBlock, RuleID: 204}}},
		Devices: []lsmrules.DeviceRule{{Block: true, Major: lsmrules.AnyDevice, Minor: lsmrules.AnyDevice, Decision: lsmrules.Decision{Action: enforce.ActionBlock, RuleID: 205}}, {Major: 1, Minor: 1, Decision: lsmrules.Decision{Action: enforce.ActionBlock, RuleID: 206}}},
		Caps:    []lsmrules.CapRule{{Cap: unix.CAP_SYS_RESOURCE, Decision: lsmrules.Decision{Action: enforce.ActionBlock, RuleID: 207}}},
	})
	procsFile := filepath.Join(sb.root, "cgroup.procs")

	path := func(p string) func(audit.Event) bool {
		return func(ev audit.Event) bool { return ev.File != nil && ev.File.Path == p }
	}
	targetPID := func(pid int) func(audit.Event) bool {
		return func(ev audit.Event) bool { return ev.Target != nil && ev.Target.PID == uint32(pid) }
	}
	mnt := func(op, target string) func(audit.Event) bool {
		return func(ev audit.Event) bool {
			return ev.Mount != nil && ev.Mount.Op == op && (target == "" || ev.Mount.Target == target)
		}
	}
	cases := []hookCase{
		{opSpec{Name: "open_secret", Kind: "open", Path: secret}, audit.KindFileOpen, 201, true, path(secret)},
		{opSpec{Name: "write_proc_sys", Kind: "open_write", Path: "/proc/sys/kernel/domainname"}, audit.KindFileOpen, 202, true,
			func(ev audit.Event) bool {
				return ev.File != nil && ev.File.Path == "/proc/sys/kernel/domainname" && ev.File.Write
			}},
		{opSpec{Name: "write_cgroupfs", Kind: "open_write", Path: procsFile}, audit.KindFileOpen, 204, true, path(procsFile)},
		{opSpec{Name: "open_blockdev", Kind: "open", Path: blk}, audit.KindFileOpen, 205, false,
			func(ev audit.Event) bool { return ev.File != nil && ev.File.Path == blk && ev.File.Dev == 240<<20|7 }},
		{opSpec{Name: "open_devmem", Kind: "open", Path: mem}, audit.KindFileOpen, 206, true,
			func(ev audit.Event) bool { return ev.File != nil && ev.File.Path == mem && ev.File.Dev == 1<<20|1 }},
		{opSpec{Name: "open_proc_self_mem", Kind: "open", Path: "/proc/self/mem"}, audit.KindFileOpen, rid(lsmrules.OpProcMem), true,
			func(ev audit.Event) bool {
				return ev.File != nil && strings.HasPrefix(ev.File.Path, "/proc/") && strings.HasSuffix(ev.File.Path, "/mem")
			}},
		{opSpec{Name: "ptrace_attach", Kind: "ptrace_seize", PID: tpid}, audit.KindPtrace, rid(lsmrules.OpPtraceAttach), true, targetPID(tpid)},
		{opSpec{Name: "process_vm_readv", Kind: "process_vm_readv", PID: tpid, Num: addr}, audit.KindPtrace, rid(lsmrules.OpPtraceAttach), true, targetPID(tpid)},
		{opSpec{Name: "pidfd_getfd", Kind: "pidfd_getfd", PID: tpid}, audit.KindPtrace, rid(lsmrules.OpPtraceAttach), true, targetPID(tpid)},
		{opSpec{Name: "proc_environ", Kind: "open", Path: fmt.Sprintf("/proc/%d/environ", tpid)}, audit.KindPtrace, rid(lsmrules.OpPtraceRead), true, targetPID(tpid)},
		{opSpec{Name: "traceme", Kind: "traceme"}, audit.KindPtrace, rid(lsmrules.OpPtraceTraceme), true,
			func(ev audit.Event) bool { return ev.Message == "ptrace_traceme" }},
		{opSpec{Name: "agent_environ", Kind: "open", Path: fmt.Sprintf("/proc/%d/environ", agent)}, audit.KindPtrace, rid(lsmrules.OpAgentPtrace), true, targetPID(agent)},
		{opSpec{Name: "kill_agent", Kind: "kill", PID: agent, Num: uint64(unix.SIGCONT)}, audit.KindSignal, rid(lsmrules.OpAgentSignal), true, targetPID(agent)},
		{opSpec{Name: "mount", Kind: "mount", Path: filepath.Join(dir, "mnt")}, audit.KindMount, rid(lsmrules.OpMount), true,
			func(ev audit.Event) bool {
				return mnt("mount", filepath.Join(dir, "mnt"))(ev) && ev.Mount.FSType == "tmpfs" && ev.Mount.Source == "none"
			}},
		{opSpec{Name: "umount", Kind: "umount", Path: filepath.Join(dir, "um")}, audit.KindMount, rid(lsmrules.OpUmount), true, mnt("umount", filepath.Join(dir, "um"))},
		{opSpec{Name: "move_mount", Kind: "move_mount", Path: filepath.Join(dir, "mvsrc"), Path2: filepath.Join(dir, "mvdst")}, audit.KindMount, rid(lsmrules.OpMoveMount), true,
			func(ev audit.Event) bool {
				return mnt("move_mount", filepath.Join(dir, "mvdst"))(ev) && ev.Mount.Source == filepath.Join(dir, "mvsrc")
			}},
		{opSpec{Name: "fsconfig", Kind: "fsconfig"}, audit.KindMount, rid(lsmrules.OpFSConfig), true,
			func(ev audit.Event) bool {
				return mnt("fsconfig", "1m")(ev) && ev.Mount.FSType == "tmpfs" && ev.Mount.Source == "size"
			}},
		{opSpec{Name: "pivot_root", Kind: "pivot_root", Path: filepath.Join(dir, "pr"), Path2: filepath.Join(dir, "pr/old")}, audit.KindMount, rid(lsmrules.OpPivotRoot), false,
			mnt("pivot_root", filepath.Join(dir, "pr"))},
		{opSpec{Name: "finit_module", Kind: "finit_module", Path: junk}, audit.KindModule, rid(lsmrules.OpKernelReadFile), false,
			func(ev audit.Event) bool {
				return ev.File != nil && ev.File.Path == junk && ev.Message == "kernel_read_file: module"
			}},
		{opSpec{Name: "init_module", Kind: "init_module"}, audit.KindModule, rid(lsmrules.OpKernelLoadData), false,
			func(ev audit.Event) bool { return ev.Message == "kernel_load_data: module" }},
		{opSpec{Name: "bpf", Kind: "bpf_map_create"}, audit.KindBPF, rid(lsmrules.OpBPF), true,
			func(ev audit.Event) bool { return ev.Message == "bpf(BPF_MAP_CREATE)" }},
		{opSpec{Name: "cap_sys_resource", Kind: "raise_nofile"}, audit.KindCapability, 207, true,
			func(ev audit.Event) bool { return ev.Target != nil && ev.Target.Capability == unix.CAP_SYS_RESOURCE }},
		// chroot("/") changes nothing when allowed; last anyway.
		{opSpec{Name: "chroot", Kind: "chroot", Path: "/"}, audit.KindMount, rid(lsmrules.OpChroot), true, mnt("chroot", "/")},
	}
	var specs []opSpec
	for _, c := range cases {
		specs = append(specs, c.op)
	}
	// A read under /proc/sys stays allowed: the rule is write-only.
	specs = append(specs, opSpec{Name: "read_proc_sys", Kind: "open", Path: "/proc/sys/kernel/domainname"})

	mountFixtures := func() {
		for _, d := range []string{"um", "mvsrc"} {
			p := filepath.Join(dir, d)
			unix.Unmount(p, unix.MNT_DETACH)
			must(t, unix.Mount("none", p, "tmpfs", 0, "size=1m"))
		}
	}
	t.Cleanup(func() {
		for _, d := range []string{"um", "mvsrc", "mvdst", "mnt"} {
			unix.Unmount(filepath.Join(dir, d), unix.MNT_DETACH)
		}
	})

	runs := []struct {
		where string
		cg    string
		cgID  uint64
	}{
		{"sandbox", sb.root, sb.rootID},
		{"nested", sb.nested, sb.nestID},
	}
	for _, run := range runs {
		mountFixtures()
		t0 := time.Now()
		res, pid := runOps(t, run.cg, specs)
		t.Logf("%s: %d operations in %v", run.where, len(specs), time.Since(t0))
		if res["read_proc_sys"] != "OK" {
			t.Errorf("%s: read of /proc/sys refused (%s): the rule is write-only", run.where, res["read_proc_sys"])
		}
		for _, c := range cases {
			want := insideErrno[c.op.Name]
			if want == "" {
				want = "EPERM"
			}
			if got := res[c.op.Name]; got != want {
				t.Errorf("%s: %s: %s, want %s", run.where, c.op.Name, got, want)
				continue
			}
			ev := waitEvent(t, run.where+" "+c.op.Name, func(ev audit.Event) bool {
				return (ev.Process.TGID == uint32(pid) || ev.Process.PPID == uint32(pid)) &&
					ev.Kind == c.kind && ev.Rule == fmt.Sprintf("rule-%d", c.rule) && c.check(ev)
			})
			if ev.Kind == "" {
				continue
			}
			if ev.Verdict != audit.VerdictDenied || ev.Mechanism != expectedMechanism(t) || ev.Severity != audit.SeverityAlert {
				t.Errorf("%s: %s: verdict %s mechanism %s severity %s", run.where, c.op.Name, ev.Verdict, ev.Mechanism, ev.Severity)
			}
			if ev.Process.CgroupID != run.cgID || ev.Sandbox.CgroupID != sb.rootID {
				t.Errorf("%s: %s: cgroup %d sandbox %d, want %d and %d", run.where, c.op.Name,
					ev.Process.CgroupID, ev.Sandbox.CgroupID, run.cgID, sb.rootID)
			}
			if ev.Process.Comm != helperComm() {
				t.Errorf("%s: %s: comm %q, want %q", run.where, c.op.Name, ev.Process.Comm, helperComm())
			}
		}
	}

	// Outside every sandbox: nothing is refused, no event.
	mountFixtures()
	res, pid := runOps(t, "", specs)
	for _, c := range append(cases, hookCase{op: opSpec{Name: "read_proc_sys"}, outsideOK: true}) {
		got := res[c.op.Name]
		if got == "EPERM" || (c.outsideOK && got != "OK") {
			t.Errorf("outside: %s: %s, want OK", c.op.Name, got)
		} else if !c.outsideOK {
			t.Logf("outside: %s got past the hook and then failed with %s", c.op.Name, got)
		}
	}
	time.Sleep(200 * time.Millisecond) // two reader deadlines
	if evs := eventsFrom(pid); len(evs) > 0 {
		t.Errorf("outside: %d events from an unsandboxed process, first %+v", len(evs), evs[0])
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
