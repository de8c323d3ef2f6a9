package posture

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/enforce/enforcetest"
	"github.com/watcherhq/watcher/internal/limits"
	"github.com/watcherhq/watcher/internal/policy"
)

func reader(t *testing.T) *Reader {
	t.Helper()
	enforcetest.RequireRoot(t)
	r, err := NewReader()
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// read reads the posture of a test cgroup the way the agent does.
func read(t *testing.T, r *Reader, cg string, workspace ...string) audit.Posture {
	t.Helper()
	root, err := cgroupfs.Mountpoint()
	if err != nil {
		t.Fatal(err)
	}
	p, err := r.Cgroup(cg, strings.TrimPrefix(cg, root), workspace)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Errors) > 0 {
		t.Fatalf("errors reading %s: %v", cg, p.Errors)
	}
	return p
}

// ownCaps is this (root) test process's effective and bounding sets, asked
// of the kernel with capget and prctl rather than read from /proc.
func ownCaps(t *testing.T) (eff, bnd uint64) {
	t.Helper()
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		t.Fatal(err)
	}
	eff = uint64(data[0].Effective) | uint64(data[1].Effective)<<32
	for c := 0; c < 64; c++ {
		if in, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(c), 0, 0, 0); err == nil && in == 1 {
			bnd |= 1 << c
		}
	}
	return eff, bnd
}

func TestPlainRootProcess(t *testing.T) {
	r := reader(t)
	cmd, cg := inCgroup(t, "sh", "-c", "echo ready; exec sleep 1000")
	start(t, cmd, true)
	p := read(t, r, cg)
	eff, bnd := ownCaps(t)
	if p.Procs != 1 || p.Threads != 1 {
		t.Errorf("procs %d threads %d, want 1 1", p.Procs, p.Threads)
	}
	if p.CapEff != eff || p.CapBnd != bnd || p.NoNewPrivs || p.Seccomp != SeccompDisabled || p.UserNS || !p.RootUser {
		t.Errorf("posture %+v, want cap_eff %x cap_bnd %x, no no_new_privs, no seccomp, host user ns, root", p, eff, bnd)
	}
	if p.Root.Mount != "/" || p.Root.ReadOnly || p.Root.Absent {
		t.Errorf("root %+v, want / read-write", p.Root)
	}
	Check(&p, policy.Requirements())
	for _, want := range []policy.Requirement{policy.RequireNoNewPrivs, policy.RequireCapDropAll, policy.RequireSeccomp,
		policy.RequireUserNamespace, policy.RequireNonRoot, policy.RequireReadonlyRoot} {
		if !slices.Contains(p.Missing, string(want)) {
			t.Errorf("missing %v lacks %s", p.Missing, want)
		}
	}
}

// needSetpriv skips where util-linux's setpriv is missing (the qemu
// guest has busybox's; scripts/setup.sh installs util-linux).
func needSetpriv(t *testing.T) {
	t.Helper()
	out, _ := exec.Command("setpriv", "--help").CombinedOutput()
	if !strings.Contains(string(out), "--bounding-set") {
		t.Skip("util-linux's setpriv not installed (busybox's has no --bounding-set)")
	}
}

func TestSetprivHardening(t *testing.T) {
	r := reader(t)
	needSetpriv(t)
	cmd, cg := inCgroup(t, "setpriv", "--no-new-privs", "--bounding-set", "-all",
		"--reuid", "65534", "--regid", "65534", "--clear-groups", "sh", "-c", "echo ready; exec sleep 1000")
	start(t, cmd, true)
	p := read(t, r, cg)
	if p.CapEff != 0 || p.CapBnd != 0 || !p.NoNewPrivs || p.RootUser {
		t.Fatalf("posture %+v, want no capabilities, no_new_privs, uid 65534", p)
	}
	Check(&p, []policy.Requirement{policy.RequireNoNewPrivs, policy.RequireCapDropAll, policy.RequireNonRoot, policy.RequireSeccomp})
	if !slices.Equal(p.Missing, []string{"seccomp"}) {
		t.Fatalf("missing %v, want only seccomp", p.Missing)
	}
}

// A process whose leader thread dropped every capability while its other
// threads kept them holds them: posture reads every thread.
func TestLeaderThreadCannotHideCapabilities(t *testing.T) {
	r := reader(t)
	cmd, cg := helperCmd(t, "leader-drops-caps")
	s := start(t, cmd, true)
	leader, err := readStatus(filepath.Join("/proc", itoa(s.pid), "status"))
	if err != nil {
		t.Fatal(err)
	}
	if leader.capEff != 0 {
		t.Fatalf("the helper's leader thread still has capabilities %x", leader.capEff)
	}
	p := read(t, r, cg)
	eff, _ := ownCaps(t)
	if p.Threads < 2 || p.CapEff != eff {
		t.Fatalf("threads %d cap_eff %x, want the other threads' %x", p.Threads, p.CapEff, eff)
	}
	Check(&p, []policy.Requirement{policy.RequireCapDropAll})
	if !slices.Equal(p.Missing, []string{"cap_drop_all"}) {
		t.Fatalf("missing %v", p.Missing)
	}
}

func TestSeccompEveryThread(t *testing.T) {
	r := reader(t)
	cmd, cg := helperCmd(t, "seccomp-all-threads")
	start(t, cmd, true)
	p := read(t, r, cg)
	if p.Seccomp != SeccompFilter || !p.NoNewPrivs {
		t.Fatalf("seccomp %s no_new_privs %v, want filter on every thread", p.Seccomp, p.NoNewPrivs)
	}
	// The same filter on the leader thread only: the other threads run
	// without it, and without no_new_privs.
	cmd, cg = helperCmd(t, "seccomp-leader-only")
	s := start(t, cmd, true)
	if leader, err := readStatus(filepath.Join("/proc", itoa(s.pid), "status")); err != nil || leader.seccomp != SeccompFilter {
		t.Fatalf("leader %+v %v", leader, err)
	}
	p = read(t, r, cg)
	if p.Seccomp != SeccompDisabled || p.NoNewPrivs {
		t.Fatalf("seccomp %s no_new_privs %v, want disabled and false (the other threads')", p.Seccomp, p.NoNewPrivs)
	}
}

func TestUserNamespace(t *testing.T) {
	r := reader(t)
	cmd, cg := inCgroup(t, "unshare", "--user", "--map-root-user", "sh", "-c", "echo ready; exec sleep 1000")
	start(t, cmd, true)
	p := read(t, r, cg)
	if !p.UserNS || p.UIDMap != "0 0 1" {
		t.Fatalf("user_ns %v uid_map %q, want a user namespace mapping 0 0 1", p.UserNS, p.UIDMap)
	}
	// Root inside maps to root outside here (--map-root-user run as root).
	if !p.RootUser {
		t.Fatalf("root_user false for a process whose host uid is 0")
	}
	Check(&p, []policy.Requirement{policy.RequireUserNamespace})
	if p.Missing != nil {
		t.Fatalf("missing %v", p.Missing)
	}
}

// A private mount namespace with a read-only root (a tmpfs chrooted into),
// /tmp on a noexec,nosuid tmpfs and a workspace on a nosuid bind mount;
// /escape is a symlink to "/" that must resolve inside the root.
func TestMountsInTheProcessNamespace(t *testing.T) {
	r := reader(t)
	dir, ws := t.TempDir(), t.TempDir()
	busybox := "/bin/busybox"
	if _, err := os.Stat(busybox); err != nil {
		t.Skipf("busybox-static not installed (scripts/setup.sh installs it): %v", err)
	}
	script := `set -e
D=$1 WS=$2
mount -t tmpfs -o size=16m posture-root "$D"
mkdir "$D/tmp" "$D/ws" "$D/proc"
cp /bin/busybox "$D/busybox"
ln -s / "$D/escape"
mount -t tmpfs -o noexec,nosuid,size=1m posture-tmp "$D/tmp"
mount --bind "$WS" "$D/ws"
mount -o remount,bind,nosuid "$D/ws"
mount -o remount,ro "$D"
exec chroot "$D" /busybox sh -c 'echo ready; exec /busybox sleep 1000'
`
	cmd, cg := inCgroup(t, "unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", dir, ws)
	start(t, cmd, true)
	p := read(t, r, cg, "/ws", "/escape/tmp", "/absent")
	want := audit.MountPosture{Path: "/", Mount: "/", FSType: "tmpfs", ReadOnly: true, NoExec: false, NoSuid: false}
	if p.Root != want {
		t.Errorf("root %+v, want %+v", p.Root, want)
	}
	if want := (audit.MountPosture{Path: "/tmp", Mount: "/tmp", FSType: "tmpfs", NoExec: true, NoSuid: true}); p.Tmp != want {
		t.Errorf("tmp %+v, want %+v", p.Tmp, want)
	}
	if len(p.Workspace) != 3 {
		t.Fatalf("workspace %+v", p.Workspace)
	}
	if w := p.Workspace[0]; w.Mount != "/ws" || !w.NoSuid || w.NoExec || w.ReadOnly {
		t.Errorf("workspace %+v, want /ws nosuid", w)
	}
	if w := p.Workspace[1]; w.Mount != "/tmp" || !w.NoExec {
		t.Errorf("/escape/tmp resolved to %+v, want the process's own /tmp", w)
	}
	if w := p.Workspace[2]; !w.Absent {
		t.Errorf("/absent %+v, want absent", w)
	}
	// The mountinfo options agree with statfs for the root.
	mounts, err := readMountinfo(filepath.Join("/proc", itoa(p0(t, cg)), "mountinfo"))
	if err != nil {
		t.Fatal(err)
	}
	var rootOpts string
	for _, m := range mounts {
		if m.Point == "/" {
			rootOpts = m.Options
		}
	}
	if !slices.Contains(strings.Split(rootOpts, ","), "ro") {
		t.Errorf("mountinfo has / with options %q", rootOpts)
	}
	Check(&p, []policy.Requirement{policy.RequireReadonlyRoot, policy.RequireTmpNoexec, policy.RequireTmpNosuid,
		policy.RequireWorkspaceNosuid, policy.RequireWorkspaceNoexec})
	if !slices.Equal(p.Missing, []string{"workspace_noexec"}) {
		t.Errorf("missing %v, want workspace_noexec (/ws is exec)", p.Missing)
	}
	// The host's own mounts are untouched.
	var st unix.Statfs_t
	if err := unix.Statfs("/", &st); err != nil || st.Flags&unix.ST_RDONLY != 0 {
		t.Fatalf("host root read-only? %v", err)
	}
}

// Limits on a parent cgroup hold for a process in its child, in whichever
// hierarchy this host keeps each controller; the neighbour without limits
// has none.
func TestLimitsOfTheProcessCgroups(t *testing.T) {
	r := reader(t)
	for _, c := range []string{limits.Memory, limits.CPU, limits.PIDs} {
		if r.Host.Mechanism(c) == limits.None {
			t.Skipf("no %s controller on this host", c)
		}
	}
	cmd, cg := inCgroup(t, "sh", "-c", "echo ready; exec sleep 1000")
	root, _ := cgroupfs.Mountpoint()
	rel := strings.TrimPrefix(cg, root)
	parent := filepath.Dir(rel)
	pg, err := r.Host.Apply(parent, limits.Limits{Memory: 64 << 20, CPU: 0.5, PIDs: 50}, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Remove() })
	cgp, err := r.Host.Apply(rel, limits.Limits{}, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cgp.Remove() })
	s := start(t, cmd, true)
	if err := cgp.Enter(s.pid); err != nil {
		t.Fatal(err)
	}
	p := read(t, r, cg)
	if want := (audit.LimitsPosture{MemoryBytes: 64 << 20, CPUMillis: 500, PIDs: 50}); p.Limits != want {
		t.Fatalf("limits %+v, want %+v (mechanisms memory=%s cpu=%s pids=%s)", p.Limits, want,
			r.Host.Mechanism(limits.Memory), r.Host.Mechanism(limits.CPU), r.Host.Mechanism(limits.PIDs))
	}
	Check(&p, []policy.Requirement{policy.RequireMemoryLimit, policy.RequireCPULimit, policy.RequirePIDsLimit})
	if p.Missing != nil {
		t.Fatalf("missing %v", p.Missing)
	}
	// A neighbour outside the limited parent.
	cmd, cg = inCgroup(t, "sh", "-c", "echo ready; exec sleep 1000")
	start(t, cmd, true)
	if p := read(t, r, cg); p.Limits != (audit.LimitsPosture{}) {
		t.Fatalf("unlimited neighbour has limits %+v", p.Limits)
	}
}

func TestEmptyCgroupAndChanges(t *testing.T) {
	r := reader(t)
	needSetpriv(t)
	cg := enforcetest.Cgroup(t, "empty")
	p := read(t, r, cg)
	if p.Procs != 0 || p.Seccomp != "" || p.NoNewPrivs {
		t.Fatalf("empty cgroup read as %+v", p)
	}
	Check(&p, []policy.Requirement{policy.RequireNoNewPrivs, policy.RequireMemoryLimit})
	if !slices.Equal(p.Missing, []string{"memory_limit"}) {
		t.Fatalf("missing %v, want memory_limit only", p.Missing)
	}
	// A process joins: a change; a second identical one is not.
	cmd := enforcetest.Command(t, cg, "sh", "-c", "echo ready; exec sleep 1000")
	start(t, cmd, true)
	q := read(t, r, cg)
	if Same(p, q) {
		t.Fatal("empty and running read the same")
	}
	cmd = enforcetest.Command(t, cg, "sh", "-c", "echo ready; exec sleep 1000")
	start(t, cmd, true)
	q2 := read(t, r, cg)
	if q2.Procs != 2 || !Same(q, q2) {
		t.Fatalf("a second identical process changed the posture: %+v vs %+v", q, q2)
	}
	// A hardened neighbour does not make the cgroup hardened, but a
	// process with more privilege changes it.
	cmd = enforcetest.Command(t, cg, "setpriv", "--no-new-privs", "sh", "-c", "echo ready; exec sleep 1000")
	start(t, cmd, true)
	if q3 := read(t, r, cg); q3.NoNewPrivs || !Same(q, q3) {
		t.Fatalf("no_new_privs %v after one of three processes set it", q3.NoNewPrivs)
	}
}

func TestEveryRequirementIsChecked(t *testing.T) {
	// A posture that has everything meets every requirement, and each
	// requirement fails on a posture missing its item.
	good := audit.Posture{Procs: 1, NoNewPrivs: true, Seccomp: SeccompFilter, UserNS: true,
		Root: audit.MountPosture{ReadOnly: true}, Tmp: audit.MountPosture{NoExec: true, NoSuid: true},
		Workspace: []audit.MountPosture{{NoExec: true, NoSuid: true}},
		Limits:    audit.LimitsPosture{MemoryBytes: 1, CPUMillis: 1, PIDs: 1}}
	Check(&good, policy.Requirements())
	if good.Missing != nil {
		t.Fatalf("good posture lacks %v", good.Missing)
	}
	// A process that could not be read proves nothing.
	unread := good
	unread.Errors = []string{"root of 42: permission denied"}
	Check(&unread, policy.Requirements())
	if len(unread.Missing) != len(policy.Requirements()) {
		t.Fatalf("with a read error, missing %v", unread.Missing)
	}
	for _, req := range policy.Requirements() {
		bad := good
		bad.Workspace = slices.Clone(good.Workspace)
		switch req {
		case policy.RequireNoNewPrivs:
			bad.NoNewPrivs = false
		case policy.RequireCapDropAll:
			bad.CapBnd = 1 << 21
		case policy.RequireSeccomp:
			bad.Seccomp = SeccompDisabled
		case policy.RequireUserNamespace:
			bad.UserNS = false
		case policy.RequireNonRoot:
			bad.RootUser = true
		case policy.RequireReadonlyRoot:
			bad.Root.ReadOnly = false
		case policy.RequireTmpNoexec:
			bad.Tmp.NoExec = false
		case policy.RequireTmpNosuid:
			bad.Tmp.NoSuid = false
		case policy.RequireWorkspaceNoexec:
			bad.Workspace[0].NoExec = false
		case policy.RequireWorkspaceNosuid:
			bad.Workspace[0].NoSuid = false
		case policy.RequireMemoryLimit:
			bad.Limits.MemoryBytes = 0
		case policy.RequireCPULimit:
			bad.Limits.CPUMillis = 0
		case policy.RequirePIDsLimit:
			bad.Limits.PIDs = 0
		default:
			t.Fatalf("requirement %s has no case here", req)
		}
		Check(&bad, policy.Requirements())
		if !slices.Equal(bad.Missing, []string{string(req)}) {
			t.Errorf("%s: missing %v", req, bad.Missing)
		}
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// p0 is the first process of a cgroup.
func p0(t *testing.T, cg string) int {
	t.Helper()
	pids, err := cgroupfs.Procs(cg)
	if err != nil || len(pids) == 0 {
		t.Fatalf("procs of %s: %v %v", cg, pids, err)
	}
	return pids[0]
}

// The agent leaves `watcher exec` leaves out of a root's posture: a
// process in exec-* below the root is not read, one in another child is.
func TestSkipDir(t *testing.T) {
	r := reader(t)
	cg := enforcetest.Cgroup(t, "root")
	start(t, enforcetest.Command(t, enforcetest.Child(t, cg, "exec-call-1-ab12"), "sh", "-c", "echo ready; exec sleep 1000"), true)
	start(t, enforcetest.Command(t, enforcetest.Child(t, cg, "app"), "sh", "-c", "echo ready; exec sleep 1000"), true)
	if p := read(t, r, cg); p.Procs != 2 {
		t.Fatalf("procs %d, want 2 without SkipDir", p.Procs)
	}
	r.SkipDir = func(name string) bool { return strings.HasPrefix(name, "exec-") }
	if p := read(t, r, cg); p.Procs != 1 {
		t.Fatalf("procs %d, want 1 with exec leaves skipped", p.Procs)
	}
}
