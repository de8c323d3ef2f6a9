package backstop_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/testkit/poll"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/backstop"
	"github.com/watcherhq/watcher/internal/enforce/enforcetest"
	"github.com/watcherhq/watcher/internal/enforce/rules/backstoprules"
)

// decoy starts a process outside every sandbox, as a target for ptrace,
// process_vm_*, pidfd_getfd, /proc/PID/mem and signals.
func decoy(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("sleep", "300")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd.Process.Pid
}

func isMounted(t *testing.T, pid int, dir string) bool {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && f[4] == dir {
			return true
		}
	}
	return false
}

func wantKind(k audit.Kind) func(audit.Event) error {
	return func(ev audit.Event) error {
		if ev.Kind != k {
			return fmt.Errorf("kind %s, want %s", ev.Kind, k)
		}
		return nil
	}
}

func all(checks ...func(audit.Event) error) func(audit.Event) error {
	return func(ev audit.Event) error {
		for _, c := range checks {
			if err := c(ev); err != nil {
				return err
			}
		}
		return nil
	}
}

func wantTarget(pid int) func(audit.Event) error {
	return func(ev audit.Event) error {
		if ev.Target == nil || int(ev.Target.PID) != pid {
			return fmt.Errorf("target %+v, want pid %d", ev.Target, pid)
		}
		return nil
	}
}

func wantPath(p string) func(audit.Event) error {
	return func(ev audit.Event) error {
		if ev.File == nil || ev.File.Path != p {
			return fmt.Errorf("file %+v, want path %s", ev.File, p)
		}
		return nil
	}
}

func wantSyscall(name string) func(audit.Event) error {
	return func(ev audit.Event) error {
		if ev.Syscall == nil || ev.Syscall.Name != name {
			return fmt.Errorf("syscall %+v, want %s", ev.Syscall, name)
		}
		return nil
	}
}

func wantMessage(sub string) func(audit.Event) error {
	return func(ev audit.Event) error {
		if !strings.Contains(ev.Message, sub) {
			return fmt.Errorf("message %q lacks %q", ev.Message, sub)
		}
		return nil
	}
}

// TestOperationsKilled runs every dangerous operation in a sandbox cgroup,
// in a cgroup below it, and outside: killed with a `killed` event inside,
// unharmed outside.
func TestOperationsKilled(t *testing.T) {
	f := newFixture(t, nil)
	target := decoy(t)
	if err := f.eng.SetAgentPID(target); err != nil {
		t.Fatal(err)
	}
	mnt := t.TempDir()
	outsideProcs := filepath.Join(f.outside, "cgroup.procs")
	self := helperBin
	tg := strconv.Itoa(target)
	cases := []struct {
		name, op string
		args     []string
		check    func(audit.Event) error
	}{
		{"shadow", "open", []string{"/etc/shadow"}, all(wantKind(audit.KindFileOpen), wantPath("/etc/shadow"))},
		{"secret", "open", []string{f.secret}, all(wantPath(f.secret), func(ev audit.Event) error {
			if ev.Rule != "rule-77" {
				return fmt.Errorf("rule %q", ev.Rule)
			}
			return nil
		})},
		{"ptrace", "ptrace", []string{tg}, all(wantKind(audit.KindPtrace), wantSyscall("ptrace"), wantTarget(target))},
		{"process_vm_readv", "vmread", []string{tg}, all(wantKind(audit.KindPtrace), wantTarget(target))},
		{"process_vm_writev", "vmwrite", []string{tg}, all(wantKind(audit.KindPtrace), wantTarget(target))},
		{"pidfd_getfd", "pidfd_getfd", []string{tg}, all(wantKind(audit.KindPtrace), wantSyscall("pidfd_getfd"), wantTarget(target))},
		{"proc_mem", "procmem", []string{tg}, all(wantKind(audit.KindFileOpen), wantPath("/proc/"+tg+"/mem"), wantMessage("category=proc_mem"))},
		{"mount", "mount", []string{mnt}, all(wantKind(audit.KindMount), func(ev audit.Event) error {
			if ev.Mount == nil || ev.Mount.Op != "mount" || ev.Mount.Target != mnt || ev.Mount.FSType != "tmpfs" {
				return fmt.Errorf("mount %+v", ev.Mount)
			}
			return nil
		})},
		{"umount", "umount", []string{mnt}, all(wantKind(audit.KindMount), wantSyscall("umount2"))},
		{"fsopen", "fsopen", nil, all(wantKind(audit.KindMount), wantSyscall("fsopen"))},
		{"chroot", "chroot", nil, all(wantKind(audit.KindMount), wantSyscall("chroot"))},
		{"pivot_root", "pivot_root", nil, all(wantKind(audit.KindMount), wantSyscall("pivot_root"))},
		{"bpf", "bpf", nil, all(wantKind(audit.KindBPF), wantSyscall("bpf"))},
		{"init_module", "init_module", nil, all(wantKind(audit.KindModule), wantSyscall("init_module"))},
		{"finit_module", "finit_module", nil, all(wantKind(audit.KindModule), wantMessage("path="+self))},
		{"kexec_load", "kexec_load", nil, all(wantKind(audit.KindModule), wantSyscall("kexec_load"))},
		{"kexec_file_load", "kexec_file_load", nil, all(wantKind(audit.KindModule), wantSyscall("kexec_file_load"))},
		{"cgroup_write", "openwrite", []string{outsideProcs}, all(wantPath(outsideProcs), wantMessage("category=cgroup_write"))},
		{"kill_agent", "killagent", []string{tg}, all(wantKind(audit.KindSignal), wantTarget(target))},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, where := range []string{"sandbox", "nested"} {
				parent := f.sandbox
				if where == "nested" {
					parent = f.nested
				}
				r := f.run(t, parent, c.op, c.args...)
				f.expectKilled(t, r, c.check)
				if c.op == "mount" {
					// The mount happened before the kill landed: undo it.
					mk := f.lastMount(t, r.pid)
					if mk.Ret != 0 || !mk.Killed {
						t.Fatalf("mount record %+v", mk)
					}
					if !isMounted(t, os.Getpid(), mnt) {
						t.Fatalf("%s: the killed mount did not happen (nothing to undo?)", where)
					}
					if err := backstop.UndoMount(mk); err != nil {
						t.Fatal(err)
					}
					if isMounted(t, os.Getpid(), mnt) {
						t.Fatal("still mounted after UndoMount")
					}
				}
			}
			r := f.run(t, f.outside, c.op, c.args...)
			expectSurvived(t, r)
			if c.op == "mount" {
				unix.Unmount(mnt, 0)
			}
			if evs := f.eventsOf(r.pid); len(evs) != 0 {
				t.Errorf("events for an unsandboxed process: %+v", evs)
			}
			if _, err := os.Stat(fmt.Sprintf("/proc/%d", target)); err != nil {
				t.Fatalf("decoy died: %v", err)
			}
		})
	}
}

func (f *fixture) lastMount(t *testing.T, pid int) backstop.MountKill {
	t.Helper()
	var mk backstop.MountKill
	poll.Eventually(t, 3*time.Second, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		for i := len(f.mounts) - 1; i >= 0; i-- {
			if int(f.mounts[i].TGID) == pid {
				mk = f.mounts[i]
				return true
			}
		}
		return false
	}, "no mount record for pid %d", pid)
	return mk
}

// TestPathResolution opens protected files by other names: each is judged
// on the file the kernel opened, so each is killed and the event carries
// the resolved path.
func TestPathResolution(t *testing.T) {
	f := newFixture(t, nil)
	dir := t.TempDir()
	sub := filepath.Join(filepath.Dir(f.secret), "sub")
	if err := os.Mkdir(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "symlink")
	if err := os.Symlink(f.secret, link); err != nil {
		t.Fatal(err)
	}
	hard := filepath.Join(dir, "hardlink")
	if err := os.Link(f.secret, hard); err != nil {
		t.Fatal(err)
	}
	shadowLink := filepath.Join(dir, "shadow-symlink")
	if err := os.Symlink("/etc/shadow", shadowLink); err != nil {
		t.Fatal(err)
	}
	type tc struct {
		name, op, path, want string
	}
	cases := []tc{
		{"direct", "open", f.secret, f.secret},
		{"symlink", "open", link, f.secret},
		// A hard link is the same inode under another name: the name
		// opened is reported, the inode rule matches.
		{"hardlink", "open", hard, hard},
		{"dotdot", "open", sub + "/../secret", f.secret},
		{"proc_self_root", "open", "/proc/self/root" + f.secret, f.secret},
		{"opath_reopen", "opath", f.secret, f.secret},
		{"openat2", "openat2", f.secret, f.secret},
		{"shadow", "open", "/etc/shadow", "/etc/shadow"},
		{"shadow_symlink", "open", shadowLink, "/etc/shadow"},
		{"shadow_dotdot", "open", "/etc/../etc/./shadow", "/etc/shadow"},
		{"shadow_proc_root", "open", "/proc/self/root/etc/shadow", "/etc/shadow"},
		{"shadow_opath", "opath", "/etc/shadow", "/etc/shadow"},
		{"shadow_openat2", "openat2", "/etc/shadow", "/etc/shadow"},
	}
	// A hard link to /etc/shadow needs a directory on its filesystem.
	var etc, tmp syscall.Stat_t
	shadowHard := filepath.Join(os.TempDir(), fmt.Sprintf("watcher-shadow-link-%d", os.Getpid()))
	if syscall.Stat("/etc/shadow", &etc) == nil && syscall.Stat(os.TempDir(), &tmp) == nil && etc.Dev == tmp.Dev {
		if err := os.Link("/etc/shadow", shadowHard); err == nil {
			t.Cleanup(func() { os.Remove(shadowHard) })
			cases = append(cases, tc{"shadow_hardlink", "open", shadowHard, shadowHard})
		}
	} else {
		t.Logf("no hard link to /etc/shadow: %s is on another filesystem", os.TempDir())
	}
	// The rules were set before the links existed: the inode rule is keyed
	// by the file, so it needs no refresh.
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := f.run(t, f.sandbox, c.op, c.path)
			f.expectKilled(t, r, all(wantKind(audit.KindFileOpen), wantPath(c.want)))
			if c.op == "opath" && !strings.Contains(r.out, "O_PATH open survived") {
				t.Errorf("O_PATH open itself was judged (it grants no access): %s", r.out)
			}
		})
	}
	t.Run("outside", func(t *testing.T) {
		for _, p := range []string{f.secret, link, hard, "/etc/shadow"} {
			r := f.run(t, f.outside, "open", p)
			expectSurvived(t, r)
			if !strings.Contains(r.out, "result: <nil>") {
				t.Errorf("open %s outside: %s", p, r.out)
			}
		}
	})
}

// TestHoleCloneFiles: a partner sharing the file table reads the descriptor
// of a killed opener. Without the fix (clone allowed) the secret leaks;
// with it the cloner dies at clone and no partner exists.
func TestHoleCloneFiles(t *testing.T) {
	t.Run("without_fix_leaks", func(t *testing.T) {
		f := newFixture(t, func(r *backstoprules.Rules) { r.CloneFiles = backstoprules.Rule{} })
		r := f.run(t, f.sandbox, "clonefiles", f.secret)
		f.expectKilled(t, r, wantPath(f.secret))
		if !strings.Contains(r.out, "SECRET") {
			t.Fatalf("reproducer did not reproduce: the partner did not read the secret:\n%s", r.out)
		}
	})
	t.Run("fixed", func(t *testing.T) {
		f := newFixture(t, nil)
		for _, parent := range []string{f.sandbox, f.nested} {
			r := f.run(t, parent, "clonefiles", f.secret)
			f.expectKilled(t, r, all(wantSyscall("clone"), wantMessage("category=clone_files")))
			if strings.Contains(r.out, "SECRET") || strings.Contains(r.out, "partner") {
				t.Fatalf("partner exists or leaked:\n%s", r.out)
			}
		}
		r := f.run(t, f.outside, "clonefiles", f.secret)
		expectSurvived(t, r)
		if !strings.Contains(r.out, "SECRET") {
			t.Fatalf("outside, the partner should read the shared descriptor:\n%s", r.out)
		}
	})
}

var uringVariants = []string{"plain", "async", "sqpoll", "fixed"}

// TestHoleIOUring: opens through io_uring, fixed-file ones included, never
// return a descriptor to judge. io_uring_setup is refused by default; when
// a policy allows rings, open requests are killed at submission.
func TestHoleIOUring(t *testing.T) {
	t.Run("without_fix_leaks", func(t *testing.T) {
		f := newFixture(t, func(r *backstoprules.Rules) { r.IOUring, r.IOUringOpen = backstoprules.Rule{}, backstoprules.Rule{} })
		r := f.run(t, f.sandbox, "uring", "fixed", f.secret)
		if r.killed || !strings.Contains(r.out, "SECRET") {
			t.Fatalf("reproducer did not reproduce: killed=%v\n%s", r.killed, r.out)
		}
	})
	t.Run("setup_refused", func(t *testing.T) {
		f := newFixture(t, nil)
		for _, v := range uringVariants {
			for _, parent := range []string{f.sandbox, f.nested} {
				r := f.run(t, parent, "uring", v, f.secret)
				f.expectKilled(t, r, all(wantSyscall("io_uring_setup"), wantMessage("category=io_uring")))
				if strings.Contains(r.out, "SECRET") {
					t.Fatalf("%s leaked:\n%s", v, r.out)
				}
			}
			r := f.run(t, f.outside, "uring", v, f.secret)
			expectSurvived(t, r)
			if !strings.Contains(r.out, "SECRET") {
				t.Fatalf("%s outside did not read the file:\n%s", v, r.out)
			}
		}
	})
	t.Run("rings_allowed_opens_killed", func(t *testing.T) {
		if _, ok := backstopMissing(t)[backstop.ProgIOUringSubmit]; ok {
			t.Skip("io_uring_submit_req tracepoint missing on this kernel")
		}
		f := newFixture(t, func(r *backstoprules.Rules) { r.IOUring = backstoprules.Rule{} })
		for _, v := range uringVariants {
			r := f.run(t, f.sandbox, "uring", v, f.secret)
			f.expectKilled(t, r, all(wantKind(audit.KindFileOpen), wantMessage("category=io_uring_open")))
			if strings.Contains(r.out, "SECRET") {
				t.Fatalf("%s leaked:\n%s", v, r.out)
			}
		}
	})
}

func backstopMissing(t *testing.T) map[string]error {
	eng := enforcetest.Engine(t)
	b, err := backstop.Load(eng)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	return b.Missing()
}

// TestHoleCgroupEscape: a descriptor to an outside cgroup.procs opened
// before entering the sandbox escapes the write-open check; the move itself
// is caught (cgroup_attach_task) and the mover killed.
func TestHoleCgroupEscape(t *testing.T) {
	f := newFixture(t, nil)
	dst := f.leaf(t, f.outside)
	procs, err := os.OpenFile(filepath.Join(dst, "cgroup.procs"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer procs.Close()
	leaf := f.leaf(t, f.sandbox)
	cmd := enforcetest.Command(t, leaf, helperBin, "escape", "3")
	cmd.ExtraFiles = []*os.File{procs}
	out, _ := cmd.CombinedOutput()
	ws := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("escaped process not killed: %v\n%s", cmd.ProcessState, out)
	}
	pid := cmd.Process.Pid
	ev, ok := f.waitEvent(t, pid, func(ev audit.Event) bool { return ev.Kind == audit.KindEscape })
	if !ok {
		t.Fatalf("no escape event; events %+v", f.eventsOf(pid))
	}
	dstID, _ := cgroupfs.ID(dst)
	if ev.Verdict != audit.VerdictKilled || ev.Sandbox.CgroupID != f.sbID || ev.Target == nil || int(ev.Target.PID) != pid ||
		!strings.Contains(ev.Message, fmt.Sprintf("to cgroup %d", dstID)) {
		t.Fatalf("escape event %+v", ev)
	}
}

// TestUndoMountInNamespace: a sandboxed process in its own mount namespace
// mounts and is killed; the mount stays in that namespace (another process
// lives there) until UndoMount enters the namespace and detaches it.
func TestUndoMountInNamespace(t *testing.T) {
	f := newFixture(t, nil)
	if exe("unshare") == "" || exe("sh") == "" {
		t.Skip("needs unshare(1) and sh")
	}
	dir := t.TempDir()
	leaf := f.leaf(t, f.sandbox)
	script := fmt.Sprintf(`echo $$ > %s/cgroup.procs || exit 9
%s mount %s
echo mounter-exit=$?
exec sleep 30`, leaf, helperBin, dir)
	// The namespace is made private outside the sandbox (unshare mounts
	// to set propagation); the shell then moves itself in.
	cmd := exec.Command("unshare", "-m", "--propagation", "private", "sh", "-c", script)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	shell := cmd.Process.Pid
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	var mk backstop.MountKill
	poll.Within(5*time.Second, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, m := range f.mounts {
			if m.Target == dir {
				mk = m
			}
		}
		return mk.Op != ""
	})
	if mk.Op != "mount" || mk.Ret != 0 || !mk.Killed {
		t.Fatalf("mount record %+v; output:\n%s", mk, out.String())
	}
	if !poll.Within(5*time.Second, func() bool { return strings.Contains(out.String(), "mounter-exit=137") }) {
		t.Fatalf("mounter not killed:\n%s", out.String())
	}
	if isMounted(t, os.Getpid(), dir) {
		t.Fatal("mount leaked into the host namespace")
	}
	if !isMounted(t, shell, dir) {
		t.Fatal("the killed mount is not in the sandbox namespace: nothing to undo")
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", mk.TGID)); err == nil {
		t.Log("mounter still visible (zombie)")
	}
	if err := backstop.UndoMount(mk); err != nil {
		t.Fatal(err)
	}
	if isMounted(t, shell, dir) {
		t.Fatal("still mounted in the sandbox namespace after UndoMount")
	}
	// A failed mount is not undone.
	failed := mk
	failed.Ret = -int64(unix.EPERM)
	if err := backstop.UndoMount(failed); err == nil {
		t.Fatal("undo of a failed mount succeeded")
	}
}

// TestProbeAndAdoption: every program loads on this kernel; a second agent
// replaces the pinned links without a gap and enforcement continues.
func TestProbeAndAdoption(t *testing.T) {
	f := newFixture(t, nil)
	for name, err := range backstop.Probe(f.eng) {
		if err != nil {
			t.Errorf("%s does not load here: %v", name, err)
		}
	}
	// A restarted agent: load and attach again on the same pins; the rule
	// maps are adopted (pinned by name), links replaced after attaching.
	again, err := enforce.Open(enforce.Options{PinDir: f.eng.PinDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	b2, err := backstop.Load(again)
	if err != nil {
		t.Fatal(err)
	}
	if err := b2.Attach(); err != nil {
		t.Fatal(err)
	}
	b2.Close()
	f.bs.Close() // the first agent's descriptors go away
	r := f.run(t, f.sandbox, "open", f.secret)
	f.expectKilled(t, r, wantPath(f.secret))
	pins, _ := os.ReadDir(enforce.LinkPinDir(f.eng.PinDir(), backstop.Group))
	if want := len(b2.Attached()); len(pins) != want {
		t.Errorf("pinned links %d, want %d (one per attached program)", len(pins), want)
	}
}

func TestRulesValidation(t *testing.T) {
	eng := enforcetest.Engine(t)
	b, err := backstop.Load(eng)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for _, r := range []backstoprules.Rules{
		{SandboxRules: backstoprules.SandboxRules{Syscalls: []backstoprules.SyscallRule{{Name: "no_such_call", Rule: backstoprules.Rule{Action: enforce.ActionKill}}}}},
		{SandboxRules: backstoprules.SandboxRules{Syscalls: []backstoprules.SyscallRule{{Name: "clone", Rule: backstoprules.Rule{Action: enforce.ActionKill}}}}},
		{Sandboxes: map[uint32]backstoprules.SandboxRules{3: {ProcMem: backstoprules.Rule{Action: 9}}}},
		{Sandboxes: map[uint32]backstoprules.SandboxRules{0: {ProcMem: backstoprules.Rule{Action: enforce.ActionKill}}}},
		{Paths: []backstoprules.PathRule{{Path: "relative", Ops: backstoprules.OpRead, Rule: backstoprules.Rule{Action: enforce.ActionKill}}}},
		{Paths: []backstoprules.PathRule{{Path: "/x", Rule: backstoprules.Rule{Action: enforce.ActionKill}}}},
		{Paths: []backstoprules.PathRule{{Path: "/" + strings.Repeat("a", 300), Ops: backstoprules.OpRead}}},
		{SandboxRules: backstoprules.SandboxRules{ProcMem: backstoprules.Rule{Action: 9}}},
	} {
		if err := b.SetRules(r); err == nil {
			t.Errorf("rules %+v accepted", r)
		}
	}
}

// TestPacketSockets: socket(AF_PACKET) runs no cgroup hook, so a packet
// socket would reach the wire past every connect and sendmsg hook. The
// backstop kills it at entry in a sandbox and its nested cgroup; a UDP
// socket there, and a packet socket outside, still work; without the rule
// the packet socket is created.
func TestPacketSockets(t *testing.T) {
	t.Run("without_fix_leaks", func(t *testing.T) {
		f := newFixture(t, nil)
		r := f.run(t, f.sandbox, "socket", "packet")
		if r.killed || !strings.Contains(r.out, "result: <nil>") {
			t.Fatalf("packet socket not created without the rule: killed=%v\n%s", r.killed, r.out)
		}
	})
	kill := backstoprules.Rule{Action: enforce.ActionKill, ID: 91}
	f := newFixture(t, func(r *backstoprules.Rules) { r.PacketSocket = kill })
	for _, parent := range []string{f.sandbox, f.nested} {
		r := f.run(t, parent, "socket", "packet")
		f.expectKilled(t, r, all(wantSyscall("socket"), wantMessage("category=packet_socket")))
		if strings.Contains(r.out, "result: <nil>") {
			t.Fatalf("packet socket created before the kill:\n%s", r.out)
		}
		r = f.run(t, parent, "socket", "udp")
		expectSurvived(t, r)
		if !strings.Contains(r.out, "result: <nil>") {
			t.Fatalf("UDP socket in the sandbox failed:\n%s", r.out)
		}
	}
	r := f.run(t, f.outside, "socket", "packet")
	expectSurvived(t, r)
	if !strings.Contains(r.out, "result: <nil>") {
		t.Fatalf("packet socket outside the sandbox failed:\n%s", r.out)
	}
}

// linked asks the kernel how many links each of bs's programs has.
func linked(t *testing.T, bs *backstop.Backstop) map[string]int {
	t.Helper()
	ids, err := bs.ProgramIDs()
	if err != nil {
		t.Fatal(err)
	}
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

// TestSyscallTracepointsFollowRules: the raw syscall tracepoints (which
// slow every syscall of the host) are attached only while a rule needs
// them, as the kernel's link table shows; the event tracepoints stay.
func TestSyscallTracepointsFollowRules(t *testing.T) {
	// Rules the event tracepoints enforce alone: leaving the sandbox.
	noSyscalls := backstoprules.Rules{SandboxRules: backstoprules.SandboxRules{CgroupEscape: backstoprules.Rule{Action: enforce.ActionKill, ID: 9}}}
	if noSyscalls.NeedsSyscallTracepoints() {
		t.Fatal("a cgroup-escape rule needs no syscall tracepoint")
	}
	f := newFixture(t, func(r *backstoprules.Rules) { *r = noSyscalls })
	withSecret := backstop.DefaultRules()
	withSecret.Paths = append(withSecret.Paths, backstoprules.PathRule{Path: f.secret, Ops: backstoprules.OpRead,
		Rule: backstoprules.Rule{Action: enforce.ActionKill, ID: f.secretID}})
	pin := func(name string) bool {
		_, err := os.Stat(filepath.Join(enforce.LinkPinDir(f.eng.PinDir(), backstop.Group), name))
		return err == nil
	}
	expect := func(state string, want bool) {
		t.Helper()
		l := linked(t, f.bs)
		for _, name := range []string{backstop.ProgSysEnter, backstop.ProgSysExit} {
			if (l[name] > 0) != want || pin(name) != want {
				t.Errorf("%s: %s has %d links in the kernel (pinned %v), want attached=%v", state, name, l[name], pin(name), want)
			}
		}
		for _, name := range []string{backstop.ProgFork, backstop.ProgCgroupAttach, backstop.ProgSignal} {
			if l[name] != 1 {
				t.Errorf("%s: %s has %d links in the kernel, want 1", state, name, l[name])
			}
		}
		if f.bs.SyscallTracepoints() != want {
			t.Errorf("%s: SyscallTracepoints() = %v, the kernel says %v", state, f.bs.SyscallTracepoints(), want)
		}
	}
	escape := func(state string) {
		t.Helper()
		dst := f.leaf(t, f.outside)
		procs, err := os.OpenFile(filepath.Join(dst, "cgroup.procs"), os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer procs.Close()
		cmd := enforcetest.Command(t, f.leaf(t, f.sandbox), helperBin, "escape", "3")
		cmd.ExtraFiles = []*os.File{procs}
		out, _ := cmd.CombinedOutput()
		if ws := cmd.ProcessState.Sys().(syscall.WaitStatus); !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
			t.Errorf("%s: escaped process not killed: %v\n%s", state, cmd.ProcessState, out)
		}
	}

	expect("escape rule only", false)
	escape("escape rule only")
	r := f.run(t, f.sandbox, "open", f.secret)
	if r.killed || r.err != nil {
		t.Fatalf("no file rule yet, but the open failed: killed=%v err=%v\n%s", r.killed, r.err, r.out)
	}

	if err := f.bs.SetRules(withSecret); err != nil {
		t.Fatal(err)
	}
	expect("file and syscall rules", true)
	f.expectKilled(t, f.run(t, f.sandbox, "open", f.secret), wantPath(f.secret))
	expectSurvived(t, f.run(t, f.outside, "open", f.secret))

	if err := f.bs.SetRules(noSyscalls); err != nil {
		t.Fatal(err)
	}
	expect("back to the escape rule", false)
	escape("back to the escape rule")

	// A restarted agent whose rules need no syscall tracepoint removes the
	// ones its predecessor pinned.
	if err := f.bs.SetRules(withSecret); err != nil {
		t.Fatal(err)
	}
	old := linked(t, f.bs)
	oldIDs, err := f.bs.ProgramIDs()
	if err != nil {
		t.Fatal(err)
	}
	f.bs.Close() // the first agent exits: only its pins hold its links
	again, err := enforce.Open(enforce.Options{PinDir: f.eng.PinDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	b2, err := backstop.Load(again)
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	if err := b2.SetRules(noSyscalls); err != nil {
		t.Fatal(err)
	}
	if err := b2.Attach(); err != nil {
		t.Fatal(err)
	}
	if old[backstop.ProgSysEnter] == 0 {
		t.Fatal("the first agent's sys_enter was not attached")
	}
	links, err := enforce.LinkedPrograms()
	if err != nil {
		t.Fatal(err)
	}
	if n := links[oldIDs[backstop.ProgSysEnter]] + links[oldIDs[backstop.ProgSysExit]]; n != 0 {
		t.Errorf("the first agent's sys_enter/sys_exit still have %d links after the restart", n)
	}
	l2 := linked(t, b2)
	if l2[backstop.ProgSysEnter] != 0 || l2[backstop.ProgSysExit] != 0 || pin(backstop.ProgSysEnter) || pin(backstop.ProgSysExit) {
		t.Errorf("restarted agent without syscall rules: sys_enter %d, sys_exit %d links (pinned %v/%v), want none",
			l2[backstop.ProgSysEnter], l2[backstop.ProgSysExit], pin(backstop.ProgSysEnter), pin(backstop.ProgSysExit))
	}
	if l2[backstop.ProgFork] != 1 {
		t.Errorf("restarted agent: fork program has %d links, want 1", l2[backstop.ProgFork])
	}
}
