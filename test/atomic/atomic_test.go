// Package atomic runs the Atomic Red Team Linux tests of
// ../shared/corpus/atomic/summary.tsv inside a watcher sandbox: the rows
// whose expected check is PTRACE, MOUNT, KMOD, CRED, PROCSYS, PROCMEM or
// ESCAPE must be stopped, the NONE rows must run as they do outside. See
// README.md for how each row is adapted to this host.
package atomic

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/backstop"
	"github.com/watcherhq/watcher/internal/enforce/cgroupbpf"
	"github.com/watcherhq/watcher/internal/enforce/enforcetest"
	"github.com/watcherhq/watcher/internal/launch"
)

func TestMain(m *testing.M) {
	launch.Init()
	os.Exit(m.Run())
}

// corpus is read in place, relative to the repository root.
const corpus = "../../../shared/corpus/atomic/summary.tsv"

// row is one line of summary.tsv.
type row struct {
	id       string // technique#test_no
	name     string
	platform string
	checks   string
	action   string
	command  string
}

func readRows(t *testing.T) map[string]row {
	t.Helper()
	f, err := os.Open(corpus)
	if err != nil {
		t.Skipf("Atomic Red Team corpus not found at %s (../shared/corpus from the repo root): %v", corpus, err)
	}
	defer f.Close()
	rows := map[string]row{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	first := true
	for sc.Scan() {
		if first {
			first = false
			continue
		}
		c := strings.Split(sc.Text(), "\t")
		if len(c) < 12 {
			t.Fatalf("malformed row: %q", sc.Text())
		}
		id := c[1] + "#" + c[2]
		rows[id] = row{id: id, name: c[3], platform: c[5], checks: c[8], action: c[9],
			command: strings.ReplaceAll(c[11], " ⏎ ", "\n")}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return rows
}

// guarded are the expected checks whose rows must be stopped.
var guarded = []string{"PTRACE", "MOUNT", "KMOD", "CRED", "PROCSYS", "PROCMEM", "ESCAPE"}

func isGuarded(r row) bool {
	for _, c := range strings.Split(r.checks, ",") {
		for _, g := range guarded {
			if c == g {
				return true
			}
		}
	}
	return false
}

// sandbox is the enforcement set-up the rows run in.
type sandbox struct {
	eng      *enforce.Engine
	root     string
	work     string // the sandbox's workspace (read-write)
	private  string // a directory outside every allowed path
	rules    launch.FileRules
	backstop error // nil when the kill backstop is attached
	mu       sync.Mutex
	events   []audit.Event
	rootDev  string
}

func newSandbox(t *testing.T) *sandbox {
	t.Helper()
	eng := enforcetest.Engine(t)
	if launch.LandlockABI() == 0 {
		t.Skip("Landlock is not available on this kernel")
	}
	s := &sandbox{eng: eng, root: enforcetest.Cgroup(t, "art")}
	if _, err := eng.AddSandbox(s.root, 1, 0); err != nil {
		t.Fatal(err)
	}
	hooks, err := cgroupbpf.Load(eng)
	if err != nil {
		t.Fatalf("cgroup hooks: %v", err)
	}
	t.Cleanup(func() { hooks.Close() })
	cg, err := hooks.Attach(s.root)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hooks.Detach(cg) })
	if err := hooks.SetDeviceRules(cgroupbpf.DefaultDeviceRules(1)); err != nil {
		t.Fatal(err)
	}
	if err := hooks.SetSysctlRules(cgroupbpf.DefaultSysctlRules(2)); err != nil {
		t.Fatal(err)
	}
	if err := hooks.SetSocketRules(cgroupbpf.DefaultSocketRules(3)); err != nil {
		t.Fatal(err)
	}
	rd := eng.NewReader(enforce.ReaderOptions{PollInterval: 10 * time.Millisecond})
	cgroupbpf.Register(rd)

	// The kill backstop (internal/enforce/backstop) catches what the
	// launcher layers cannot see; use it when it loads here.
	if bs, err := backstop.Load(eng); err != nil {
		s.backstop = err
	} else {
		t.Cleanup(func() { bs.Close() })
		if err := bs.SetRules(backstop.DefaultRules()); err != nil {
			s.backstop = err
		} else if err := bs.Attach(); err != nil {
			s.backstop = err
		} else {
			t.Cleanup(func() { backstop.Detach(eng.PinDir()) })
			backstop.Register(rd)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); rd.Run(ctx) }()
	go func() {
		for ev := range rd.Events() {
			s.mu.Lock()
			s.events = append(s.events, ev)
			s.mu.Unlock()
		}
	}()
	t.Cleanup(func() { cancel(); <-done })

	base := t.TempDir()
	s.work = filepath.Join(base, "work")
	s.private = filepath.Join(base, "private")
	os.Mkdir(s.work, 0o777)
	os.Mkdir(s.private, 0o755)
	s.rules = launch.DefaultFileRules(s.work)
	s.rootDev = rootDevice(t)
	return s
}

// rootDevice is the block device mounted at /, for the mount-escape row.
func rootDevice(t *testing.T) string {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(data), "\n") {
		pre, post, ok := strings.Cut(l, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if ok && len(f) >= 5 && f[4] == "/" && len(g) >= 2 && strings.HasPrefix(g[1], "/dev/") {
			return g[1]
		}
	}
	return "/dev/vda"
}

type result struct {
	verdict launch.Verdict
	out     string
	events  []audit.Event
}

// run runs script with bash in a fresh leaf of the sandbox.
func (s *sandbox) run(t *testing.T, id, script string) result {
	t.Helper()
	var out bytes.Buffer
	env := append(os.Environ(), "WS="+s.work, "PRIVATE="+s.private, "TMPDIR="+s.work, "HOME="+s.work,
		"ROOTDEV="+s.rootDev)
	v, err := launch.Run(context.Background(), launch.Config{
		Path: "/bin/bash", Args: []string{"-c", script}, Env: env, Dir: s.work,
		Stdout: &out, Stderr: &out, Sandbox: "art", CgroupParent: s.root, Label: id,
		Restrictions: launch.Restrictions{Seccomp: launch.DefaultSeccomp(), Files: &s.rules},
		Timeouts:     launch.Timeouts{Term: 20 * time.Second, Kill: 25 * time.Second},
	})
	if err != nil {
		t.Fatalf("%s: %v\n%s\n%s", id, err, v, out.String())
	}
	time.Sleep(50 * time.Millisecond) // let the reader drain the rings
	s.mu.Lock()
	var evs []audit.Event
	for _, e := range s.events {
		if e.Process.CgroupID == v.CgroupID && (e.Verdict == audit.VerdictDenied || e.Verdict == audit.VerdictKilled) {
			evs = append(evs, e)
		}
	}
	s.mu.Unlock()
	return result{verdict: v, out: out.String(), events: evs}
}

// outside runs script without any sandbox, for the NONE rows.
func (s *sandbox) outside(t *testing.T, script string) (int, string) {
	cmd := exec.Command("/bin/bash", "-c", script)
	cmd.Env = append(os.Environ(), "WS="+s.work, "TMPDIR="+s.work, "HOME="+s.work)
	cmd.Dir = s.work
	cmd.WaitDelay = 5 * time.Second
	out, _ := cmd.CombinedOutput()
	return cmd.ProcessState.ExitCode(), string(out)
}

// adaptation is how one guarded row runs here and how its stop shows.
type adaptation struct {
	// how says what was changed from the corpus command, and why.
	how string
	// script is the adapted command (bash). $WS is the workspace,
	// $PRIVATE a directory outside the sandbox's view, $ROOTDEV the
	// host's root disk.
	script string
	// stopped reports whether the dangerous effect was prevented.
	stopped func(s *sandbox, r result) bool
	// target, when set, is the file the row goes for; a host without it
	// has nothing to stop, and the row is reported as not applicable.
	target string
	// remains, when set, says why the launcher layers cannot stop the
	// row here; the row is run and reported, not asserted.
	remains string
}

func has(r result, s string) bool { return strings.Contains(r.out, s) }

// denied is true when the command printed a refusal (EPERM from seccomp
// or a cgroup hook, EACCES from Landlock) or the kernel sent an event: a
// row counts as stopped only with such evidence, not because a tool was
// missing.
func denied(r result) bool {
	return len(r.events) > 0 || strings.Contains(r.out, "ermission denied") || strings.Contains(r.out, "not permitted")
}

// notIn is true when file does not exist or lacks every marker.
func notIn(file string, markers ...string) bool {
	data, _ := os.ReadFile(file)
	for _, m := range markers {
		if bytes.Contains(data, []byte(m)) {
			return false
		}
	}
	return true
}

// shadowLine matches /etc/shadow content (a user with a password field
// other than passwd's "x").
func shadowLeaked(text string) bool {
	for _, l := range strings.Split(text, "\n") {
		f := strings.Split(strings.TrimSpace(l), ":")
		if len(f) == 9 && f[1] != "x" {
			return true
		}
	}
	return false
}

func readFile(p string) string { b, _ := os.ReadFile(p); return string(b) }

const procmemTarget = `bash -c 'SECRET=PASSWORD_ART_T1003; while :; do sleep 1; done' & PID=$!; sleep 0.3`

// adaptations cover every guarded row of the corpus; the test fails on a
// guarded row without one.
var adaptations = map[string]adaptation{
	"T1611#1": {how: "kind pod dropped: nsenter runs directly in the sandbox (the pod's container)",
		script:  `nsenter --mount=/proc/1/ns/mnt -- /bin/true && echo ESCAPED`,
		stopped: func(s *sandbox, r result) bool { return denied(r) && !has(r, "ESCAPED") }},
	"T1611#2": {how: "/dev/dm-0 replaced by the host's root disk; mountpoint in the workspace; the reverse shell part (ifconfig, netcat) dropped",
		script: `mkdir -p $WS/T1611.002; mount $ROOTDEV $WS/T1611.002 && echo MOUNTED; ` +
			`echo "* * * * * root id" > $WS/T1611.002/etc/cron.d/T1611_002 && echo WROTE; umount $WS/T1611.002 2>/dev/null; true`,
		stopped: func(s *sandbox, r result) bool { return denied(r) && !has(r, "MOUNTED") && !has(r, "WROTE") }},
	"T1611#3": {how: "sudo dropped (root already); the docker CLI talks to /var/run/docker.sock",
		script:  `docker run -v /:/mnt --rm alpine chroot /mnt id; echo rc=$?`,
		remains: "connect() to a unix socket path is outside Landlock ABI < 9 and seccomp cannot read the path; needs BPF LSM (unix_stream_connect) or Landlock ABI 9 (LANDLOCK_ACCESS_FS_RESOLVE_UNIX); dockerd is not running here"},
	"T1547.006#1": {how: "the module file is a dummy in the workspace (this host has no module build)",
		script:  `printf 'notamodule' > $WS/T1547006.ko; insmod $WS/T1547006.ko 2>&1; echo rc=$?`,
		stopped: func(s *sandbox, r result) bool { return has(r, "Operation not permitted") }},
	"T1014#1": {how: "dummy .ko in the workspace; sudo dropped",
		script:  `printf 'notamodule' > $WS/T1014.ko; insmod $WS/T1014.ko 2>&1; echo rc=$?`,
		stopped: func(s *sandbox, r result) bool { return has(r, "Operation not permitted") }},
	"T1014#2": {how: "modprobe resolves the name to a file and calls finit_module; this host has no /lib/modules, so insmod of a dummy file makes the same syscall",
		script:  `printf 'notamodule' > $WS/T1014.ko; insmod $WS/T1014.ko 2>&1; echo rc=$?`,
		stopped: func(s *sandbox, r result) bool { return has(r, "Operation not permitted") }},
	"T1014#4": {how: "as T1014#2 (diamorphine not built here); the kill -31 hiding step needs the module",
		script:  `printf 'notamodule' > $WS/diamorphine.ko; insmod $WS/diamorphine.ko 2>&1; echo rc=$?`,
		stopped: func(s *sandbox, r result) bool { return has(r, "Operation not permitted") }},
	"T1003.008#1": {how: "sudo dropped (root already); output file in the workspace",
		script: `cat /etc/shadow > $WS/T1003.008.txt; cat $WS/T1003.008.txt`,
		stopped: func(s *sandbox, r result) bool {
			return !shadowLeaked(r.out) && !shadowLeaked(readFile(s.work+"/T1003.008.txt"))
		}},
	"T1003.008#2": {target: "/etc/master.passwd", how: "sudo dropped; /etc/master.passwd (FreeBSD) is absent: the read fails either way, nothing to record",
		script:  `cat /etc/master.passwd > $WS/T1003.008.txt; cat $WS/T1003.008.txt`,
		stopped: func(s *sandbox, r result) bool { return denied(r) && !shadowLeaked(r.out) }},
	"T1003.008#4": {how: "output file in the workspace",
		script:  `echo -e "e /etc/passwd\n,p\ne /etc/shadow\n,p\n" | ed > $WS/T1003.008.txt; cat $WS/T1003.008.txt`,
		stopped: func(s *sandbox, r result) bool { return denied(r) && !shadowLeaked(r.out) }},
	"T1003.008#5": {how: "output file in the workspace",
		script: `testcat(){ (while read line; do echo $line >> $WS/T1003.008.txt; done < $1) }; ` +
			`testcat /etc/passwd; testcat /etc/shadow; cat $WS/T1003.008.txt`,
		stopped: func(s *sandbox, r result) bool { return denied(r) && !shadowLeaked(r.out) }},
	"T1685#44": {target: "/proc/sys/kernel/sysrq", how: "sysrq command 'b' (reboot) replaced by 'h' (help) so a failure cannot reboot the host; the test checks the writes, not the effect",
		script:  `echo 1 > /proc/sys/kernel/sysrq && echo SYSRQ_ON; echo h > /proc/sysrq-trigger && echo TRIGGERED`,
		stopped: func(s *sandbox, r result) bool { return denied(r) && !has(r, "SYSRQ_ON") && !has(r, "TRIGGERED") }},
	"T1685#45": {how: "as written",
		script:  `free && echo 3 > /proc/sys/vm/drop_caches && echo DROPPED`,
		stopped: func(s *sandbox, r result) bool { return denied(r) && !has(r, "DROPPED") }},
	"T1685#62": {how: "as written; the value is compared before and after",
		script: `sysctl -w kernel.randomize_va_space=0`,
		stopped: func(s *sandbox, r result) bool {
			return denied(r) && readFile("/proc/sys/kernel/randomize_va_space") != "0\n"
		}},
	"T1003.007#1": {how: "/tmp/T1003.007.sh (a process holding a password) started in the background; its pid comes from $! because pgrep needs other processes' /proc entries, which the sandbox does not see",
		script: procmemTarget + `; HEAP=$(grep -E "^[0-9a-f-]* r" /proc/$PID/maps | grep heap | cut -d' ' -f1); ` +
			`dd if=/proc/$PID/mem of=$WS/T1003.007.bin ibs=1 skip=$((0x${HEAP%-*})) count=4096 2>&1; grep -a PASSWORD_ART $WS/T1003.007.bin && echo DUMPED; kill $PID`,
		stopped: func(s *sandbox, r result) bool {
			return !has(r, "DUMPED") && notIn(s.work+"/T1003.007.bin", "PASSWORD_ART")
		}},
	"T1003.007#2": {how: "FreeBSD variant run as on Linux (/proc/PID/map does not exist; the mem read is the step that matters)",
		script: procmemTarget + `; dd if=/proc/$PID/mem of=$WS/T1003.007.bin ibs=1 skip=4194304 count=4096 2>&1; ` +
			`strings $WS/T1003.007.bin | grep -i PASSWORD_ART && echo DUMPED; kill $PID`,
		stopped: func(s *sandbox, r result) bool { return denied(r) && !has(r, "DUMPED") }},
	"T1003.007#3": {how: "dump_heap.py inlined (same open of /proc/PID/maps and /proc/PID/mem)",
		script: procmemTarget + `; /usr/bin/python3 - $PID <<'EOF' 2>&1; kill $PID
import sys, re
pid = sys.argv[1]
for l in open(f"/proc/{pid}/maps"):
    if "[heap]" in l:
        a, b = (int(x, 16) for x in l.split()[0].split("-"))
        m = open(f"/proc/{pid}/mem", "rb"); m.seek(a)
        if b"PASSWORD_ART" in m.read(b - a): print("DUMPED")
EOF`,
		stopped: func(s *sandbox, r result) bool { return denied(r) && !has(r, "DUMPED") }},
	"T1003.007#4": {how: "MimiPenguin is not shipped: its two steps (read a process's memory through /proc/PID/mem, read /etc/shadow to compare hashes) run inline",
		script: procmemTarget + `; /usr/bin/python3 -c "open('/proc/$PID/mem','rb')" 2>&1 && echo MEM_OPEN; cat /etc/shadow; kill $PID`,
		stopped: func(s *sandbox, r result) bool {
			return has(r, "PermissionError") && !has(r, "MEM_OPEN") && !shadowLeaked(r.out)
		}},
	"T1610#1": {how: "docker build/run from inside the sandbox",
		script:  `docker run --rm -d alpine true; echo rc=$?`,
		remains: "only visible step is connect() to /var/run/docker.sock (see T1611#3)"},
	"T1612#1": {how: "docker build/exec from inside the sandbox",
		script:  `docker run --rm -d alpine true; echo rc=$?`,
		remains: "only visible step is connect() to /var/run/docker.sock (see T1611#3)"},
	"T1552.004#2": {how: "find / limited to a planted home ($PRIVATE/home/u/.ssh/id_rsa) instead of the host's real keys; the row says record: Landlock stops the listing outright (stronger)",
		script:  `find $PRIVATE -name id_rsa 2>/dev/null >> $WS/keyfile_locations.txt; cat $WS/keyfile_locations.txt; ls $PRIVATE/home 2>&1`,
		stopped: func(s *sandbox, r result) bool { return denied(r) && !has(r, "id_rsa") }},
	"T1552.004#3": {how: "planted key under $PRIVATE; staging dir in the workspace",
		script:  `mkdir $WS/art-staging; find $PRIVATE -name id_rsa 2>/dev/null -exec cp --parents {} $WS/art-staging \;; grep -r ART_PRIVATE_KEY $WS/art-staging && echo COPIED; ls $PRIVATE/home 2>&1`,
		stopped: func(s *sandbox, r result) bool { return denied(r) && !has(r, "COPIED") }},
	"T1552.004#4": {how: "FreeBSD gcp replaced by cp; planted key",
		script:  `mkdir $WS/art-staging; find $PRIVATE -name id_rsa 2>/dev/null -exec cp --parents {} $WS/art-staging \;; grep -r ART_PRIVATE_KEY $WS/art-staging && echo COPIED; ls $PRIVATE/home 2>&1`,
		stopped: func(s *sandbox, r result) bool { return denied(r) && !has(r, "COPIED") }},
	"T1552.004#5": {how: "rsync replaced by cp -r when rsync is absent (same reads); planted key",
		script:  `mkdir $WS/art-staging; R=$(command -v rsync >/dev/null && echo "rsync -R" || echo "cp --parents"); find $PRIVATE -name id_rsa 2>/dev/null -exec $R {} $WS/art-staging \;; grep -r ART_PRIVATE_KEY $WS/art-staging && echo COPIED; ls $PRIVATE/home 2>&1`,
		stopped: func(s *sandbox, r result) bool { return denied(r) && !has(r, "COPIED") }},
	"T1552.004#6": {how: "as T1552.004#5",
		script:  `mkdir $WS/art-staging; R=$(command -v rsync >/dev/null && echo "rsync -R" || echo "cp --parents"); find $PRIVATE -name id_rsa 2>/dev/null -exec $R {} $WS/art-staging \;; grep -r ART_PRIVATE_KEY $WS/art-staging && echo COPIED; ls $PRIVATE/home 2>&1`,
		stopped: func(s *sandbox, r result) bool { return denied(r) && !has(r, "COPIED") }},
	"T1552.004#7": {how: "planted $PRIVATE/home/u/.gnupg; rsync or cp -r",
		script:  `mkdir $WS/GnuPG; R=$(command -v rsync >/dev/null && echo "rsync -Rr" || echo "cp -r --parents"); find $PRIVATE -type d -name .gnupg 2>/dev/null -exec $R {} $WS/GnuPG \;; grep -r ART_GPG_KEY $WS/GnuPG && echo COPIED; ls $PRIVATE/home 2>&1`,
		stopped: func(s *sandbox, r result) bool { return denied(r) && !has(r, "COPIED") }},
	"T1552.004#8": {how: "as T1552.004#7",
		script:  `mkdir $WS/GnuPG; R=$(command -v rsync >/dev/null && echo "rsync -Rr" || echo "cp -r --parents"); find $PRIVATE -type d -name .gnupg 2>/dev/null -exec $R {} $WS/GnuPG \;; grep -r ART_GPG_KEY $WS/GnuPG && echo COPIED; ls $PRIVATE/home 2>&1`,
		stopped: func(s *sandbox, r result) bool { return denied(r) && !has(r, "COPIED") }},
	"T1036.004#4": {how: "kernel thread pid 2 (kthreadd) instead of ps|grep|shuf (ps needs other processes' /proc entries); sudo dropped",
		script:  `(while true; do sleep 1; done) & EVIL=$!; mount -B /proc/2 /proc/$EVIL && echo BOUND; umount /proc/$EVIL 2>/dev/null; kill $EVIL`,
		stopped: func(s *sandbox, r result) bool { return denied(r) && !has(r, "BOUND") }},
	"T1548.003#1": {how: "sudo is absent here and no_new_privs disables setuid: the commands run directly; vim replaced by cat (non-interactive)",
		script:  `sudo -l; cat /etc/sudoers && echo READ_SUDOERS`,
		stopped: func(s *sandbox, r result) bool { return denied(r) && !has(r, "READ_SUDOERS") }},
	"T1548.003#2": {target: "/usr/local/etc/sudoers", how: "as T1548.003#1, FreeBSD path",
		script:  `cat /usr/local/etc/sudoers && echo READ_SUDOERS`,
		stopped: func(s *sandbox, r result) bool { return denied(r) && !has(r, "READ_SUDOERS") }},
	"T1548.003#3": {how: "sudo dropped; sed -i on /etc/sudoers",
		script:  `sed -i 's/env_reset.*$/env_reset,timestamp_timeout=-1/' /etc/sudoers && echo EDITED`,
		stopped: func(s *sandbox, r result) bool { return denied(r) && !has(r, "EDITED") }},
	"T1548.003#4": {target: "/usr/local/etc/sudoers", how: "sudo dropped; FreeBSD path",
		script:  `sed -i 's/env_reset.*$/env_reset,timestamp_timeout=-1/' /usr/local/etc/sudoers && echo EDITED`,
		stopped: func(s *sandbox, r result) bool { return denied(r) && !has(r, "EDITED") }},
	"T1548.003#5": {how: "sudo dropped",
		script:  `echo 'Defaults !tty_tickets' >> /etc/sudoers && echo APPENDED`,
		stopped: func(s *sandbox, r result) bool { return denied(r) && !has(r, "APPENDED") }},
	"T1548.003#6": {how: "sudo dropped; FreeBSD path",
		script:  `echo 'Defaults !tty_tickets' >> /usr/local/etc/sudoers && echo APPENDED`,
		stopped: func(s *sandbox, r result) bool { return denied(r) && !has(r, "APPENDED") }},
	"T1087.001#2": {how: "sudo dropped; output in the workspace; /etc/sudoers created by the test when absent (removed after)",
		script:  `if [ -f /etc/sudoers ]; then cat /etc/sudoers > $WS/T1087.001.txt && echo READ_SUDOERS; fi; cat $WS/T1087.001.txt`,
		stopped: func(s *sandbox, r result) bool { return denied(r) && !has(r, "READ_SUDOERS") }},
	"T1055.008#1": {how: "the ptrace-inject binary is not shipped: python forks a child and PTRACE_ATTACHes it (the same first step)",
		script: `/usr/bin/python3 - <<'EOF' 2>&1
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
pid = os.fork()
if pid == 0:
    time.sleep(5); os._exit(0)
r = libc.ptrace(16, pid, None, None)  # PTRACE_ATTACH
print("ATTACHED" if r == 0 else "ptrace: " + os.strerror(ctypes.get_errno()))
os.kill(pid, 9)
EOF`,
		stopped: func(s *sandbox, r result) bool { return has(r, "ptrace: Operation not permitted") }},
}

// noneSkips are NONE rows not run here, with the reason.
var noneSkips = map[string]string{
	"T1048.003#1":  "manual multi-host instructions, not a command",
	"T1222.002#10": "chflags is FreeBSD's", "T1222.002#11": "needs a compiled payload not shipped",
	"T1222.002#12": "needs a compiled payload not shipped", "T1222.002#13": "needs a compiled payload not shipped",
	"T1222.002#14": "needs a compiled payload not shipped",
	"T1685#5":      "stops the host's syslog service (FreeBSD commands); not safe to run outside the sandbox",
	"T1685#53":     "VMware PowerCLI", "T1686#8": "FreeBSD pf service", "T1686#12": "FreeBSD pfctl",
	"T1685#64": "appends to a host file under /etc; not safe to run outside the sandbox for comparison",
	"T1685#66": "appends to a host file under /etc; not safe to run outside the sandbox for comparison",
	"T1686#17": "reads /var/log/ufw.log, absent here",
}

func TestGuardedRowsStopped(t *testing.T) {
	rows := readRows(t)
	s := newSandbox(t)
	if s.backstop != nil {
		t.Logf("kill backstop not in use: %v", s.backstop)
	}
	// Planted credentials outside the sandbox's view.
	for _, p := range []string{"home/u/.ssh", "home/u/.gnupg"} {
		os.MkdirAll(filepath.Join(s.private, p), 0o700)
	}
	os.WriteFile(filepath.Join(s.private, "home/u/.ssh/id_rsa"), []byte("ART_PRIVATE_KEY\n"), 0o600)
	os.WriteFile(filepath.Join(s.private, "home/u/.gnupg/secring"), []byte("ART_GPG_KEY\n"), 0o600)
	// Rows about /etc/sudoers need one; create it (and remove it) if the
	// host has none, so the read and edit are really attempted.
	if _, err := os.Stat("/etc/sudoers"); os.IsNotExist(err) {
		if err := os.WriteFile("/etc/sudoers", []byte("Defaults env_reset\nroot ALL=(ALL) ALL\n"), 0o440); err == nil {
			t.Cleanup(func() { os.Remove("/etc/sudoers") })
		}
	}
	sudoersBefore := readFile("/etc/sudoers")
	aslr := readFile("/proc/sys/kernel/randomize_va_space")
	sysrq := readFile("/proc/sys/kernel/sysrq")
	t.Cleanup(func() {
		// Put back what a failed stop could have changed.
		if readFile("/proc/sys/kernel/randomize_va_space") != aslr {
			os.WriteFile("/proc/sys/kernel/randomize_va_space", []byte(aslr), 0)
			t.Errorf("ASLR setting was changed from inside the sandbox (restored)")
		}
		if readFile("/proc/sys/kernel/sysrq") != sysrq {
			os.WriteFile("/proc/sys/kernel/sysrq", []byte(sysrq), 0)
			t.Errorf("sysrq setting was changed from inside the sandbox (restored)")
		}
		if readFile("/etc/sudoers") != sudoersBefore {
			t.Errorf("/etc/sudoers was changed from inside the sandbox")
		}
	})

	var remaining []string
	for _, id := range sortedIDs(rows) {
		r := rows[id]
		if !isGuarded(r) {
			continue
		}
		a, ok := adaptations[id]
		if !ok {
			t.Errorf("%s (%s, %s): no adaptation for this guarded row", id, r.checks, r.name)
			continue
		}
		if a.target != "" {
			if _, err := os.Stat(a.target); err != nil {
				t.Logf("%s %-14s n/a here: %s does not exist on this host", id, r.checks, a.target)
				continue
			}
		}
		res := s.run(t, id, a.script)
		var mechs []string
		for _, e := range res.events {
			mechs = append(mechs, e.Mechanism+"/"+string(e.Verdict))
		}
		layer := layerOf(res, mechs)
		if a.remains != "" {
			remaining = append(remaining, fmt.Sprintf("%s (%s): %s", id, r.name, a.remains))
			t.Logf("%s %-14s REMAINS  %s", id, r.checks, a.remains)
			continue
		}
		if !a.stopped(s, res) {
			t.Errorf("%s (%s, %s): NOT stopped\n%s\n%s", id, r.checks, r.name, res.verdict, res.out)
			continue
		}
		t.Logf("%s %-14s stopped by %s (%s)", id, r.checks, layer, r.action)
	}
	for _, l := range remaining {
		t.Logf("not stopped by the launcher layers here: %s", l)
	}
}

// layerOf names what stopped a row: kernel events when there are some,
// else the error the command printed (seccomp and the cgroup hooks give
// EPERM, Landlock EACCES).
func layerOf(r result, mechs []string) string {
	switch {
	case len(mechs) > 0:
		return strings.Join(mechs, ",")
	case strings.Contains(r.out, "not permitted"):
		return "seccomp (EPERM)"
	case strings.Contains(r.out, "ermission denied"):
		return "landlock (EACCES)"
	default:
		return "landlock/seccomp (no readable error)"
	}
}

func sortedIDs(rows map[string]row) []string {
	ids := make([]string, 0, len(rows))
	for id := range rows {
		ids = append(ids, id)
	}
	for i := 1; i < len(ids); i++ {
		for j := i; j > 0 && ids[j] < ids[j-1]; j-- {
			ids[j], ids[j-1] = ids[j-1], ids[j]
		}
	}
	return ids
}

// adaptNone turns a NONE row's command into one that runs here: /tmp
// becomes the workspace (the only writable place), ~ is the workspace, and
// the http.server row sleeps 2 s instead of 10.
func adaptNone(cmd string) string {
	cmd = strings.ReplaceAll(cmd, "/tmp/", "$WS/")
	cmd = strings.ReplaceAll(cmd, "cd /tmp;", "cd $WS;")
	cmd = strings.ReplaceAll(cmd, "sleep 10;", "sleep 2;")
	return cmd
}

func TestNoneRowsUndisturbed(t *testing.T) {
	rows := readRows(t)
	s := newSandbox(t)
	// The chmod/chown rows work on an ART checkout; make one.
	os.MkdirAll(filepath.Join(s.work, "AtomicRedTeam/atomics/T1222.002"), 0o755)
	os.WriteFile(filepath.Join(s.work, "AtomicRedTeam/atomics/T1222.002/T1222.002.yaml"), []byte("x"), 0o644)
	n := 0
	for _, id := range sortedIDs(rows) {
		r := rows[id]
		if r.checks != "NONE" || !strings.Contains(r.platform, "linux") {
			continue
		}
		if why, skip := noneSkips[id]; skip {
			t.Logf("%s skipped: %s", id, why)
			continue
		}
		script := adaptNone(r.command)
		wantCode, wantOut := s.outside(t, script)
		res := s.run(t, id, script)
		if res.verdict.ExitCode != wantCode || len(res.events) > 0 || res.verdict.Outcome != launch.OutcomeExited {
			t.Errorf("%s (%s) disturbed: exit %d (outside %d), %d denial events, %s\ninside:\n%s\noutside:\n%s",
				id, r.name, res.verdict.ExitCode, wantCode, len(res.events), res.verdict.Outcome, res.out, wantOut)
			continue
		}
		n++
	}
	t.Logf("%d NONE rows ran as they do outside the sandbox", n)
}
