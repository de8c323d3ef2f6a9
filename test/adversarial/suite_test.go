package adversarial

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/dangerous"
	"github.com/watcherhq/watcher/internal/launch/ia32"
	"github.com/watcherhq/watcher/internal/testkit/poll"
)

// technique is one row of the suite.
type technique struct {
	class   int
	name    string // attacker technique (attacks_test.go)
	variant string // what it tries
	// benign rows must work on every path.
	benign bool
	// int80: the row enters the kernel through int 0x80; where this
	// kernel runs no 32-bit system calls (ia32.Available) it is not
	// applicable: skipped with the reason and counted as such.
	int80 bool
	// afterTheFact: on the kill backstop the effect happens before the
	// kill (a truncation, a chmod); the row then needs the kill and the
	// record, and reports whether the effect stayed.
	afterTheFact bool
	// delivery: the attack's syscall succeeds whatever happens to the
	// agent (kill(-1) reaches other processes, a SIGIO is queued later):
	// what counts is that the delivery to the agent was refused (an event
	// with a denial) or the sender killed.
	delivery bool
	// expect is the result required per path and layer ("sandbox/lsm":
	// "refused"), where the generic rule (refused before the fact on an
	// LSM layer, stopped on the backstop) is not precise enough.
	expect map[string]string
	// achieved judges, from outside, whether the attacker got what it was
	// after.
	achieved func(b *bed, o outcome) (bool, string)
	// reset runs after the row (puts files back).
	reset func(b *bed)
	// setup runs before each run of the row: what the host does (a
	// file created, replaced or given another name outside the sandbox).
	setup func(b *bed) string
}

func leaked(b *bed, o outcome) (bool, string) {
	if strings.Contains(o.out, secretContent) {
		return true, "secret read"
	}
	return false, ""
}

func tgtChanged(b *bed, _ outcome) (bool, string) {
	entries, _ := os.ReadDir(b.tgt)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if len(names) != 1 || names[0] != "victim" {
		return true, "directory now holds " + strings.Join(names, ",")
	}
	v := filepath.Join(b.tgt, "victim")
	var st unix.Stat_t
	if err := unix.Lstat(v, &st); err != nil {
		return true, "victim: " + err.Error()
	}
	data, _ := os.ReadFile(v)
	switch {
	case string(data) != victimContent:
		return true, fmt.Sprintf("content now %q", data)
	case st.Mode&0o7777 != 0o644:
		return true, fmt.Sprintf("mode now %o", st.Mode&0o7777)
	case st.Uid != 0 || st.Gid != 0:
		return true, fmt.Sprintf("owner now %d:%d", st.Uid, st.Gid)
	case st.Mtim.Sec != 1577836800:
		return true, "mtime changed"
	}
	if sz, _ := unix.Getxattr(v, "user.adv", nil); sz > 0 {
		return true, "xattr set"
	}
	return false, ""
}

func marker(b *bed, _ outcome) (bool, string) {
	if _, err := os.Stat(filepath.Join(b.ws, "mark")); err == nil {
		return true, "payload ran"
	}
	return false, ""
}

func printed(s string) func(*bed, outcome) (bool, string) {
	return func(b *bed, o outcome) (bool, string) {
		if strings.Contains(o.out, s) {
			return true, s
		}
		return false, ""
	}
}

// mountedAt: a mount the backstop could only kill after the fact is undone
// by the agent shortly after; wait for it.
func mountedAt(sub string) func(*bed, outcome) (bool, string) {
	return func(b *bed, o outcome) (bool, string) {
		if !poll.Within(5*time.Second, func() bool { return !isMounted(filepath.Join(b.ws, sub)) }) {
			return true, "still mounted"
		}
		return leaked(b, o)
	}
}

// agentHurt: the attack was after the agent (stopped, gone, weakened).
func agentHurt(b *bed, o outcome) (bool, string) {
	if st := b.agentState(); st != "" {
		return true, "agent " + st
	}
	return false, ""
}

func oomChanged(b *bed, o outcome) (bool, string) {
	data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", b.agent.Pid()))
	if now := strings.TrimSpace(string(data)); now != b.agentOOM {
		return true, "oom_score_adj now " + now + ", was " + b.agentOOM
	}
	return agentHurt(b, o)
}

func benignOK(want string) func(*bed, outcome) (bool, string) {
	return func(b *bed, o outcome) (bool, string) {
		if o.result == "achieved" && strings.Contains(o.out, want) {
			return true, ""
		}
		return false, "expected output " + want
	}
}

func resetWS(b *bed) {
	entries, _ := os.ReadDir(b.ws)
	for _, e := range entries {
		if e.Name() != "hello" && e.Name() != ".adv" {
			p := filepath.Join(b.ws, e.Name())
			unix_unmount(p)
			os.RemoveAll(p)
		}
	}
	b.resetSecrets()
	b.resetTarget()
	if isMounted("/proc/sys/fs/binfmt_misc") {
		syscall.Unmount("/proc/sys/fs/binfmt_misc", syscall.MNT_DETACH)
	}
}

// ia32Want is what 32-bit system calls get: the LSM and cgroup hooks judge
// kernel state whatever the entry, so on an LSM layer they are refused by
// the rule they break, like 64-bit calls (the policy lets them run there,
// see the ia32_syscalls layer line); the kill backstop keys its checks on
// x86_64 numbers, so it kills every 32-bit call at entry; watcher exec's
// seccomp arch guard refuses them.
var ia32Want = map[string]string{
	"sandbox/lsm": "refused", "sandbox/fmod_ret": "refused", "sandbox/backstop": "killed",
	"exec/lsm": "refused", "exec/fmod_ret": "refused", "exec/backstop": "refused",
}

var techniques = []technique{
	{class: 1, name: "ia32-open-read", variant: "int 0x80 open+read of a protected file", int80: true, expect: ia32Want, achieved: leaked},
	{class: 1, name: "ia32-openat-read", variant: "int 0x80 openat+read of a protected file", int80: true, expect: ia32Want, achieved: leaked},
	{class: 1, name: "ia32-mount", variant: "int 0x80 mount tmpfs", int80: true, expect: ia32Want, achieved: mountedAt("m32")},
	{class: 1, name: "ia32-socketcall-packet", variant: "int 0x80 socketcall(SYS_SOCKET, AF_PACKET)", int80: true, expect: ia32Want, achieved: printed("PACKET-SOCKET")},
	{class: 1, name: "ia32-kill-agent", variant: "int 0x80 kill(AGENT, SIGTERM)", int80: true, expect: ia32Want, achieved: agentHurt},
	{class: 1, name: "benign-read-ws", variant: "64-bit read in the workspace", benign: true, achieved: benignOK("hello from the workspace")},

	{class: 2, name: "clone3-files-race", variant: "clone3 flags flipped to CLONE_FILES after the check", achieved: printed("SHARED")},
	{class: 2, name: "clone-files", variant: "clone(2) CLONE_FILES without CLONE_THREAD", achieved: printed("SHARED")},
	{class: 2, name: "openat2-trunc-race", variant: "openat2 open_how flipped to O_TRUNC after the check", afterTheFact: true, achieved: tgtChanged},

	{class: 3, name: "clone-into-cgroup", variant: "clone3 CLONE_INTO_CGROUP to a cgroup outside", achieved: func(b *bed, o outcome) (bool, string) {
		if strings.Contains(o.out, "OUTSIDE-CHILD-RAN") {
			return true, "child ran outside the sandbox"
		}
		return leaked(b, o)
	}},
	{class: 3, name: "cgroup-procs-escape", variant: "write own pid to an outside cgroup.procs", achieved: printed("OUTSIDE-SELF")},
	{class: 3, name: "benign-child-in-sandbox", variant: "fork+exec a child, stays in the sandbox", benign: true, achieved: func(b *bed, o outcome) (bool, string) {
		// Under watcher exec Landlock hides /proc/self/cgroup; the exec
		// leaf is the launcher's.
		if o.result == "achieved" && strings.Contains(o.out, "child-ok") && (o.path == "exec" || strings.Contains(o.out, "/watcher-adv-"+b.id)) {
			return true, ""
		}
		return false, "child not in the sandbox"
	}},

	{class: 4, name: "hardlink-read", variant: "hard link of a protected file into the workspace", achieved: leaked},
	{class: 4, name: "late-file-hardlink", variant: "hard link of a protected file created after start", achieved: leaked},
	{class: 4, name: "rename-read", variant: "rename a protected file into the workspace", achieved: func(b *bed, o outcome) (bool, string) {
		if _, err := os.Stat(filepath.Join(b.secretDir, "key2")); err != nil {
			if l, why := leaked(b, o); l {
				return true, why
			}
			return false, "moved away (after the fact), not read"
		}
		return leaked(b, o)
	}},
	{class: 4, name: "symlink-read", variant: "symlink in the workspace to a protected file", achieved: leaked},
	{class: 4, name: "proc-self-root", variant: "/proc/self/root/<protected>", achieved: leaked},
	{class: 4, name: "proc-agent-root", variant: "/proc/AGENT/root/<protected>", achieved: leaked},
	{class: 4, name: "bind-mount-read", variant: "bind mount of the protected directory", achieved: mountedAt("bind")},
	{class: 4, name: "late-file-host-link", variant: "a file created under the prefix after start, read through a link the host made", achieved: leaked, setup: lateFileHostLink},
	{class: 4, name: "moved-in-earlier-link", variant: "a file renamed over a protected one, read through a link made before the move", achieved: leaked, setup: movedInEarlierLink},
	{class: 4, name: "exact-replaced-passwd", variant: "an exact rule's file replaced passwd-style (tmp + rename), read through another name", achieved: leaked, setup: exactReplacedPasswd},
	{class: 4, name: "benign-hardlink-in-ws", variant: "hard link inside the workspace", benign: true, achieved: benignOK("hello from the workspace")},
	{class: 4, name: "benign-rename-in-ws", variant: "rename inside the workspace", benign: true, achieved: benignOK("moved")},

	{class: 5, name: "rdonly-otrunc", variant: "O_RDONLY|O_TRUNC outside writable places", afterTheFact: true, achieved: tgtChanged},
	{class: 5, name: "rdonly-ocreat", variant: "O_RDONLY|O_CREAT outside writable places", afterTheFact: true, achieved: tgtChanged},
	{class: 5, name: "truncate", variant: "truncate(2)", afterTheFact: true, achieved: tgtChanged},
	{class: 5, name: "rename-away", variant: "rename a file out of a protected place", afterTheFact: true, achieved: tgtChanged},
	{class: 5, name: "unlink", variant: "unlink", afterTheFact: true, achieved: tgtChanged},
	{class: 5, name: "link-in", variant: "link into a protected place", afterTheFact: true, achieved: tgtChanged},
	{class: 5, name: "symlink-in", variant: "symlink into a protected place", afterTheFact: true, achieved: tgtChanged},
	{class: 5, name: "mknod-in", variant: "mknod (fifo) in a protected place", afterTheFact: true, achieved: tgtChanged},
	{class: 5, name: "mkdir-in", variant: "mkdir in a protected place", afterTheFact: true, achieved: tgtChanged},
	{class: 5, name: "chmod-setuid", variant: "chmod 4755", afterTheFact: true, achieved: tgtChanged},
	{class: 5, name: "chown", variant: "chown", afterTheFact: true, achieved: tgtChanged},
	{class: 5, name: "setxattr", variant: "setxattr user.*", afterTheFact: true, achieved: tgtChanged},
	{class: 5, name: "utimensat", variant: "utimensat", afterTheFact: true, achieved: tgtChanged},
	{class: 5, name: "benign-modify-in-ws", variant: "chmod/truncate/rename/link/symlink/unlink in the workspace", benign: true, achieved: func(b *bed, o outcome) (bool, string) {
		return o.result == "achieved", ""
	}},

	{class: 6, name: "exec-tmp-elf", variant: "exec a binary dropped in /tmp", achieved: marker},
	{class: 6, name: "exec-tmp-shebang", variant: "exec a /tmp script through its shebang", achieved: marker},
	{class: 6, name: "exec-tmp-ldso", variant: "ld.so /tmp/x", achieved: marker},
	{class: 6, name: "mmap-exec-tmp", variant: "mmap PROT_EXEC of a /tmp file", achieved: printed("MAPPED-EXEC")},
	{class: 6, name: "mprotect-exec-tmp", variant: "mmap a /tmp file readable, then mprotect PROT_EXEC", achieved: printed("MPROTECTED-EXEC")},
	{class: 6, name: "memfd-exec", variant: "memfd_create + exec through /proc/self/fd", achieved: marker},
	{class: 6, name: "benign-exec-ws-script", variant: "script run from the workspace", benign: true, achieved: func(b *bed, o outcome) (bool, string) {
		if ok, _ := marker(b, o); ok && o.result == "achieved" {
			return true, ""
		}
		return false, "script did not run"
	}},

	{class: 7, name: "kill-agent", variant: "kill(AGENT, SIGTERM)", achieved: agentHurt},
	{class: 7, name: "tgkill-agent", variant: "tgkill(AGENT, AGENT, SIGTERM)", achieved: agentHurt},
	{class: 7, name: "pidfd-agent", variant: "pidfd_send_signal(SIGTERM)", achieved: agentHurt},
	{class: 7, name: "kill-pgrp-agent", variant: "kill(-AGENT_PGID, SIGTERM)", achieved: agentHurt},
	{class: 7, name: "kill-all-urg", variant: "kill(-1, SIGURG)", delivery: true, achieved: agentHurt},
	{class: 7, name: "stop-agent", variant: "kill(AGENT, SIGSTOP)", achieved: agentHurt},
	{class: 7, name: "sigqueue-agent", variant: "rt_sigqueueinfo(AGENT, SIGTERM)", achieved: agentHurt},
	{class: 7, name: "fsetown-sigio-agent", variant: "F_SETOWN AGENT + F_SETSIG SIGTERM + O_ASYNC write", delivery: true, achieved: agentHurt},
	{class: 7, name: "fsetown-ex-pgrp-agent", variant: "F_SETOWN_EX AGENT's process group + F_SETSIG SIGTERM", delivery: true, achieved: agentHurt},
	{class: 7, name: "ptrace-attach-agent", variant: "PTRACE_ATTACH to the agent", achieved: agentHurt},
	{class: 7, name: "oom-score-adj-agent", variant: "write /proc/AGENT/oom_score_adj", achieved: oomChanged},

	{class: 8, name: "packet-socket", variant: "socket(AF_PACKET, SOCK_RAW)", achieved: printed("PACKET-SOCKET")},
	{class: 8, name: "unix-host-socket", variant: "connect to a host service's unix socket", achieved: printed("CONNECTED")},
	{class: 8, name: "unix-symlink-host-socket", variant: "connect through a symlink in the workspace to a host socket", achieved: printed("CONNECTED")},
	{class: 8, name: "benign-unix-ws-socket", variant: "unix socket in the workspace, through a symlink in it", benign: true, achieved: benignOK("WS-SERVICE")},

	{class: 9, name: "binfmt-register", variant: "mount binfmt_misc / open register for write", achieved: printed("OPENED-REGISTER")},
}

// knownOpen lists rows not closed on a path/layer, with why: they are
// reported as OPEN, not failed, and fail the test once they close (so the
// list cannot go stale). Key: name + "/" + path + "/" + layer.
var knownOpen = map[string]string{
	// (empty: fsetown-sigio-host closed once the sandbox that set a file's
	// owner judges every SIGIO for it, whoever sends it; bpf/include/lsm_sigio.h.)
}

// raceNotWon is what a race technique prints when its flip never reached
// the kernel in time: the target is unchanged and nothing happened that
// the agent could record (the row passes on the unchanged target alone).
const raceNotWon = "RACE-NOT-WON"

// flaky lists rows seen both closed and open on this host; they are
// reported, not asserted, until the cause is found. (fsetown-sigio-agent
// was: the attack signals the agent twice, at its write and at its exit's
// close; the agent compared the sandbox's count, so the first delivery's
// handler could read both counts and the second then looked like the
// operator's. It now stops only when the operator's count moved:
// internal/enforce/backstop TestOperatorSignals.)
var flaky = map[string]string{}

type row struct {
	tech      technique
	path      string
	result    string
	achieved  bool
	why       string
	recorded  bool
	verdict   string
	knownOpen string
	event     string
	na        string // why the row is not applicable here
	failed    bool   // its subtest failed
}

// refusedAny reports whether some event refused or killed.
func refusedAny(evs []audit.Event) bool {
	for _, e := range evs {
		if e.Verdict == audit.VerdictDenied || e.Verdict == audit.VerdictKilled {
			return true
		}
	}
	return false
}

func eventSummary(e audit.Event) string {
	what := string(e.Kind)
	switch {
	case e.File != nil:
		what += " " + e.File.Path
	case e.Syscall != nil && e.Syscall.Name != "":
		what += " " + e.Syscall.Name
	}
	if e.Rule != "" {
		what += " [" + e.Rule + "]"
	}
	return what + " by " + e.Mechanism
}

// TestAdversarial runs every technique in the sandbox as a container
// runtime places a process, and through watcher exec.
func TestAdversarial(t *testing.T) {
	b := newBed(t)
	t.Logf("layer enforcing file rules: %s", b.layer)
	noIA32 := ia32.Available()
	if noIA32 != nil {
		t.Logf("rows through int 0x80 are not applicable here: %v", noIA32)
	}
	var rows []row
	for _, tech := range techniques {
		for _, path := range []string{"sandbox", "exec"} {
			t.Run(tech.name+"/"+path, func(t *testing.T) {
				// Deferred: a row that stopped the subtest (Fatal,
				// Skip) is counted too.
				r := row{tech: tech, path: path}
				defer func() {
					r.failed = t.Failed()
					rows = append(rows, r)
				}()
				if tech.int80 && noIA32 != nil {
					r.result, r.verdict, r.na = "n/a", "N/A", noIA32.Error()
					t.Skipf("NOT APPLICABLE: %v", noIA32)
				}
				b.t = t
				var arg string
				if tech.setup != nil {
					arg = tech.setup(b)
				}
				var o outcome
				if path == "sandbox" {
					o = b.inSandbox(tech.name, arg)
				} else {
					o = b.viaExec(tech.name, arg)
				}
				r = judge(t, b, tech, o)
				resetWS(b)
				b.ensureAgent()
			})
		}
	}
	b.t = t
	printTable(t, b, rows)
}

// judge asserts one outcome and returns its table row.
func judge(t *testing.T, b *bed, tech technique, o outcome) row {
	r := row{tech: tech, path: o.path, result: o.result}
	if o.result == "n/a" {
		r.verdict = "n/a"
		r.na = naReason(o.out)
		t.Logf("not applicable here:\n%s", o.out)
		return r
	}
	if strings.HasPrefix(o.result, "failed") {
		t.Errorf("%s: %s\n%s", tech.name, o.result, o.out)
		r.verdict = o.result
		return r
	}
	r.achieved, r.why = tech.achieved(b, o)
	if tech.benign {
		if !r.achieved {
			t.Errorf("benign control failed (%s, %s): %s\n%s", o.result, r.why, tech.variant, o.out)
			r.verdict = "BROKEN"
		} else {
			r.verdict = "works"
		}
		return r
	}
	evs := b.eventsFor(o, nil)
	r.recorded = len(evs) > 0
	key := tech.name + "/" + o.path + "/" + b.layer
	stopped := o.result == "killed" || o.result == "child-killed" || o.result == "refused"
	if !stopped && !r.achieved && o.path == "exec" && r.recorded {
		// Landlock's scopes drop some side doors silently (a SIGIO to a
		// process outside the domain is never sent).
		stopped = true
		o.result, r.result = "dropped", "dropped"
	}
	if !stopped && !r.achieved && tech.delivery && refusedAny(evs) {
		// The syscall reached other targets or queued the signal; its
		// delivery to the agent was refused.
		stopped = true
		o.result, r.result = "refused at the agent", "refused at the agent"
	}
	if len(evs) > 0 {
		r.event = eventSummary(evs[0])
	}
	var problems []string
	if r.achieved && !(tech.afterTheFact && b.layer == "backstop" && strings.Contains(o.result, "killed")) {
		problems = append(problems, "achieved: "+r.why)
	}
	if !stopped {
		problems = append(problems, "not stopped: "+o.result)
	}
	if want, ok := tech.expect[o.path+"/"+b.layer]; ok && o.result != want {
		problems = append(problems, fmt.Sprintf("want %s on %s/%s, got %s", want, o.path, b.layer, o.result))
	} else if !ok && o.path == "sandbox" && b.layer != "backstop" && o.result != "refused" && o.result != "refused at the agent" && !r.achieved {
		// BPF LSM and fmod_ret refuse before the fact; a kill here means
		// the rule fell back to the backstop.
		problems = append(problems, b.layer+" path: want EPERM before the fact, got "+o.result)
	}
	if !r.recorded && !(strings.Contains(o.out, raceNotWon) && !r.achieved) {
		problems = append(problems, "no event recorded")
	}
	switch {
	case len(problems) == 0 && r.achieved:
		r.verdict = o.result + ", after the fact (" + r.why + ")"
	case len(problems) == 0:
		r.verdict = o.result
	default:
		r.verdict = "OPEN: " + strings.Join(problems, "; ")
	}
	if why, ok := flaky[key]; ok && len(problems) > 0 {
		r.knownOpen = "flaky: " + why
		t.Logf("flaky row (%s): %s\n%s", why, strings.Join(problems, "; "), b.agentLog)
		return r
	}
	if why, ok := knownOpen[key]; ok {
		r.knownOpen = why
		if len(problems) == 0 {
			t.Errorf("%s is listed as open (%s) but is closed now: drop it from knownOpen", key, why)
		} else {
			t.Logf("known open (%s): %s", why, strings.Join(problems, "; "))
		}
		return r
	}
	if len(problems) > 0 {
		t.Errorf("%s (%s) on %s/%s: %s\nattacker output:\n%s\nevents: %d", tech.name, tech.variant, o.path, b.layer,
			strings.Join(problems, "; "), o.out, len(evs))
	}
	return r
}

func printTable(t *testing.T, b *bed, rows []row) {
	byTech := map[string]map[string]row{}
	var order []string
	for _, r := range rows {
		if byTech[r.tech.name] == nil {
			byTech[r.tech.name] = map[string]row{}
			order = append(order, r.tech.name)
		}
		byTech[r.tech.name][r.path] = r
	}
	sort.SliceStable(order, func(i, j int) bool {
		return byTech[order[i]]["sandbox"].tech.class < byTech[order[j]]["sandbox"].tech.class
	})
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "CLASS\tTECHNIQUE\tVARIANT\tSANDBOX (%s)\tWATCHER EXEC\tFIRST EVENT (sandbox)\n", b.layer)
	for _, name := range order {
		s, e := byTech[name]["sandbox"], byTech[name]["exec"]
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", s.tech.class, name, s.tech.variant, cell(s), cell(e), s.event)
	}
	tw.Flush()
	var c tally
	for _, r := range rows {
		c.add(r.tech.name+"/"+r.path, r.failed, r.knownOpen != "", r.na)
	}
	c.write(&buf)
	t.Logf("adversarial suite, layer %s:\n%s", b.layer, buf.String())
	if out := os.Getenv("ADV_TABLE"); out != "" {
		os.WriteFile(out, buf.Bytes(), 0o644)
	}
}

func cell(r row) string {
	if r.verdict == "" {
		return "-"
	}
	v := r.verdict
	if !r.tech.benign && r.recorded {
		v += " +event"
	}
	if r.knownOpen != "" {
		v += " [known: " + r.knownOpen + "]"
	}
	return v
}

// TestDangerousList walks the one list (internal/dangerous): every entry,
// through both syscall tables, is killed or refused in the sandbox and
// refused under watcher exec. One subtest per entry and table
// (NAME/x86_64, NAME/i386); where this kernel runs no 32-bit system calls
// (ia32.Available) each NAME/i386 is skipped as not applicable.
func TestDangerousList(t *testing.T) {
	b := newBed(t)
	noIA32 := ia32.Available()
	if noIA32 != nil {
		t.Logf("the i386 table is not applicable here: %v", noIA32)
	}
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "SYSCALL\tHOOK\tx86_64 SANDBOX (%s)\tx86_64 EXEC\ti386 SANDBOX\ti386 EXEC\n", b.layer)
	var c tally
	for _, op := range dangerous.Ops {
		cells := []string{"-", "-", "-", "-"}
		for i, abi := range []struct{ tech, table string }{{"syscall64", "x86_64"}, {"syscall32", "i386"}} {
			name := op.Name + "/" + abi.table
			t.Run(name, func(t *testing.T) {
				var na []string
				defer func() {
					var why string // set when both paths were n/a
					if len(na) == 2 {
						why = na[0]
						if na[1] != na[0] {
							why += "; " + na[1]
						}
					}
					c.add(name, t.Failed(), false, why)
				}()
				if abi.tech == "syscall32" && noIA32 != nil {
					cells[2*i], cells[2*i+1] = "N/A", "N/A"
					na = []string{noIA32.Error(), noIA32.Error()}
					t.Skipf("NOT APPLICABLE: %v", noIA32)
				}
				b.t = t
				for j, path := range []string{"sandbox", "exec"} {
					tech := abi.tech + ":" + op.Name
					var o outcome
					if path == "sandbox" {
						o = b.inSandbox(tech, "")
					} else {
						o = b.viaExec(tech, "")
					}
					cells[2*i+j] = listVerdict(t, b, op, tech, o)
					if o.result == "n/a" {
						na = append(na, naReason(o.out))
					}
					b.ensureAgent()
				}
			})
		}
		hook := op.Hook
		if hook == "" {
			hook = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", op.Name, hook, strings.Join(cells, "\t"))
	}
	b.t = t
	tw.Flush()
	c.write(&buf)
	t.Logf("dangerous list:\n%s", buf.String())
}

// tally counts a suite's rows for its summary. A row not applicable here
// (skipped: this kernel lacks what it needs; or reported n/a by the
// attacker) is neither passed nor failed: it is counted and listed with
// its reason.
type tally struct {
	passed, failed, open int
	na                   map[string][]string // reason: rows
	reasons              []string
}

// add counts one row: failed (its subtest failed), open (a known open or
// flaky row, reported, not asserted), na (why it is not applicable, "" if
// it is).
func (c *tally) add(name string, failed, open bool, na string) {
	switch {
	case failed:
		c.failed++
	case na != "":
		if c.na == nil {
			c.na = map[string][]string{}
		}
		if _, ok := c.na[na]; !ok {
			c.reasons = append(c.reasons, na)
		}
		c.na[na] = append(c.na[na], name)
	case open:
		c.open++
	default:
		c.passed++
	}
}

func (c *tally) notApplicable() int {
	n := 0
	for _, rows := range c.na {
		n += len(rows)
	}
	return n
}

func (c *tally) write(w io.Writer) {
	fmt.Fprintf(w, "\nsummary: %d passed, %d failed, %d not applicable", c.passed, c.failed, c.notApplicable())
	if c.open > 0 {
		fmt.Fprintf(w, ", %d known open (reported, not asserted)", c.open)
	}
	fmt.Fprintln(w)
	for _, why := range c.reasons {
		fmt.Fprintf(w, "not applicable (%d): %s\n", len(c.na[why]), why)
		for _, name := range c.na[why] {
			fmt.Fprintf(w, "  %s\n", name)
		}
	}
}

// naReason is the attacker's reason for reporting n/a (its NA line).
func naReason(out string) string {
	for _, l := range strings.Split(out, "\n") {
		if why, ok := strings.CutPrefix(l, "NA "); ok {
			return strings.TrimSpace(why)
		}
	}
	return "reported n/a by the attacker"
}

func listVerdict(t *testing.T, b *bed, op dangerous.Op, tech string, o outcome) string {
	switch {
	case o.result == "n/a":
		return "n/a"
	case o.result == "killed":
		if len(b.eventsFor(o, nil)) == 0 {
			t.Errorf("%s on %s: killed but no event", tech, o.path)
			return "killed, NO EVENT"
		}
		return "killed"
	case o.result == "refused" && strings.Contains(o.out, "(1)"): // EPERM
		return "EPERM"
	case o.result == "refused" && b.layer != "backstop" && o.path == "sandbox":
		// The probe's harmless arguments fail before the LSM hook runs:
		// nothing reached the kernel's work, but no refusal is shown.
		return "refused by the kernel before the hook (" + lastLine(o.out) + ")"
	}
	t.Errorf("%s (%s) on %s/%s: %s, want killed or EPERM\n%s", tech, op.Group, o.path, b.layer, o.result, o.out)
	return "OPEN: " + o.result + " " + lastLine(o.out)
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return s
}

var _ = audit.VerdictKilled
