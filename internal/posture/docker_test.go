package posture

import (
	"slices"
	"testing"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/containers"
	"github.com/watcherhq/watcher/internal/enforce/enforcetest"
	"github.com/watcherhq/watcher/internal/limits"
	"github.com/watcherhq/watcher/internal/policy"
	"github.com/watcherhq/watcher/internal/testkit/dockertest"
)

// Docker's default capability set (moby's oci/caps/defaults.go), what a
// container started without --cap-add/--cap-drop gets.
var dockerDefaultCaps = []string{"CHOWN", "DAC_OVERRIDE", "FSETID", "FOWNER", "MKNOD", "NET_RAW", "SETGID", "SETUID",
	"SETFCAP", "SETPCAP", "NET_BIND_SERVICE", "SYS_CHROOT", "KILL", "AUDIT_WRITE"}

// A real container started with and without docker's hardening flags:
// the posture read from the kernel matches what docker applied. The
// container is found the way a sandbox selects it (docker://ID).
func TestDockerContainers(t *testing.T) {
	r := reader(t)
	d := dockertest.Start(t)
	image := d.BusyboxImage(t)
	plain := d.Run(t, "--network", "none", image, "/bin/sleep", "1000")
	hard := d.Run(t, "--network", "none", "--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
		"--tmpfs", "/tmp:rw,noexec,nosuid,size=16m", "--memory", "64m", "--cpus", "0.5", "--pids-limit", "50",
		image, "/bin/sleep", "1000")

	res, err := containers.NewResolver()
	if err != nil {
		t.Fatal(err)
	}
	readContainer := func(id string, procs int) audit.Posture {
		t.Helper()
		ref, err := containers.ParseRef("docker://" + id)
		if err != nil {
			t.Fatal(err)
		}
		m, err := res.Resolve(ref)
		if err != nil {
			t.Fatalf("resolve %s: %v", id, err)
		}
		p, err := r.Cgroup(m.Abs, m.Path, []string{"/tmp"})
		if err != nil || len(p.Errors) > 0 {
			t.Fatalf("read %s: %v %v", m.Path, err, p.Errors)
		}
		if p.Container != id || (procs > 0 && p.Procs != procs) {
			t.Fatalf("posture of %s: container %q procs %d, want %d", m.Path, p.Container, p.Procs, procs)
		}
		return p
	}
	var defaults uint64
	for _, c := range dockerDefaultCaps {
		n, ok := policy.CapabilityNumber(c)
		if !ok {
			t.Fatalf("capability %s", c)
		}
		defaults |= 1 << n
	}
	require := []policy.Requirement{policy.RequireNoNewPrivs, policy.RequireCapDropAll, policy.RequireReadonlyRoot,
		policy.RequireTmpNoexec, policy.RequireTmpNosuid, policy.RequireMemoryLimit, policy.RequireCPULimit,
		policy.RequirePIDsLimit, policy.RequireSeccomp}

	p := readContainer(plain.ID, 1)
	if p.CapEff != defaults || p.CapBnd != defaults {
		t.Errorf("plain: cap_eff %x cap_bnd %x, want docker's defaults %x", p.CapEff, p.CapBnd, defaults)
	}
	// Docker's default seccomp profile applies to both; no user
	// namespace remapping is configured.
	if p.NoNewPrivs || p.Seccomp != SeccompFilter || p.UserNS || !p.RootUser {
		t.Errorf("plain: no_new_privs %v seccomp %s user_ns %v root %v", p.NoNewPrivs, p.Seccomp, p.UserNS, p.RootUser)
	}
	if p.Root.ReadOnly || p.Root.FSType != "overlay" || p.Root.Mount != "/" || p.Tmp.Mount != "/" || p.Tmp.NoExec {
		t.Errorf("plain: root %+v tmp %+v, want a writable overlay root holding /tmp", p.Root, p.Tmp)
	}
	if p.Limits != (audit.LimitsPosture{}) {
		t.Errorf("plain: limits %+v, want none", p.Limits)
	}
	Check(&p, require)
	want := []string{"no_new_privs", "cap_drop_all", "readonly_root", "tmp_noexec", "tmp_nosuid", "memory_limit", "cpu_limit", "pids_limit"}
	if !slices.Equal(p.Missing, want) {
		t.Errorf("plain: missing %v, want %v", p.Missing, want)
	}

	h := readContainer(hard.ID, 1)
	if h.CapEff != 0 || h.CapBnd != 0 || !h.NoNewPrivs || h.Seccomp != SeccompFilter || !h.Root.ReadOnly {
		t.Errorf("hardened: cap_eff %x cap_bnd %x no_new_privs %v seccomp %s root %+v", h.CapEff, h.CapBnd, h.NoNewPrivs, h.Seccomp, h.Root)
	}
	if h.Tmp.Mount != "/tmp" || h.Tmp.FSType != "tmpfs" || !h.Tmp.NoExec || !h.Tmp.NoSuid || h.Tmp.ReadOnly {
		t.Errorf("hardened: tmp %+v, want docker's noexec,nosuid tmpfs", h.Tmp)
	}
	if len(h.Workspace) != 1 || h.Workspace[0] != h.Tmp {
		t.Errorf("hardened: workspace /tmp %+v differs from tmp %+v", h.Workspace, h.Tmp)
	}
	wantLim := audit.LimitsPosture{MemoryBytes: 64 << 20, CPUMillis: 500, PIDs: 50}
	if h.Limits != wantLim {
		t.Errorf("hardened: limits %+v, want %+v (memory=%s cpu=%s pids=%s)", h.Limits, wantLim,
			r.Host.Mechanism(limits.Memory), r.Host.Mechanism(limits.CPU), r.Host.Mechanism(limits.PIDs))
	}
	Check(&h, require)
	if h.Missing != nil {
		t.Errorf("hardened: missing %v", h.Missing)
	}

	// A host process placed into the hardened container's cgroup (as
	// debugging tools do) changes its posture: the weakest process counts.
	m, err := res.Resolve(containers.Ref{Runtime: containers.Docker, ID: hard.ID})
	if err != nil {
		t.Fatal(err)
	}
	start(t, enforcetest.Command(t, m.Abs, "sh", "-c", "echo ready; exec sleep 1000"), true)
	e := readContainer(hard.ID, 2)
	own, _ := ownCaps(t)
	if e.CapEff != own || e.NoNewPrivs || e.Root.ReadOnly || Same(h, e) {
		t.Errorf("with a host process: cap_eff %x (want %x) no_new_privs %v root %+v, same %v", e.CapEff, own, e.NoNewPrivs, e.Root, Same(h, e))
	}
}
