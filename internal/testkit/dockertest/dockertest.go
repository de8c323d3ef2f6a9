// Package dockertest starts a private Docker daemon for a test: its own
// containerd, data root, exec root, socket and containerd namespace, so
// tests never touch (or depend on) a daemon the host runs, and several can
// run at once. It uses Debian's docker.io (scripts/setup.sh installs it);
// PID 1 need not be systemd. Images are imported offline from a static
// busybox rootfs. Everything started is stopped at cleanup.
package dockertest

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Daemon is a running private dockerd.
type Daemon struct {
	// Socket is dockerd's API socket.
	Socket string
	// CLI is the docker client used.
	CLI string
	dir string
	tag string
}

// Start starts containerd and dockerd for the test and stops them at
// cleanup. It skips the test when docker.io is not installed or the test
// is not root.
func Start(t testing.TB) *Daemon {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: starts dockerd")
	}
	dockerd, err := exec.LookPath("dockerd")
	if err != nil {
		t.Skip("dockerd not installed (docker.io; scripts/setup.sh installs it)")
	}
	containerd, err := exec.LookPath("containerd")
	if err != nil {
		t.Skip("containerd not installed (docker.io depends on it; scripts/setup.sh installs it)")
	}
	if _, err := exec.LookPath("runc"); err != nil {
		t.Skip("runc not installed (docker.io depends on it; scripts/setup.sh installs it)")
	}
	// The client shipped with the daemon (another docker in PATH may be a
	// different version).
	cli := filepath.Join(filepath.Dir(dockerd), "docker")
	if _, err := os.Stat(cli); err != nil {
		if cli, err = exec.LookPath("docker"); err != nil {
			t.Skip("docker client not installed")
		}
	}
	tag := randHex()
	// Short paths: unix socket names are limited to 108 bytes.
	dir, err := os.MkdirTemp("", "dkt-")
	if err != nil {
		t.Fatal(err)
	}
	d := &Daemon{Socket: filepath.Join(dir, "docker.sock"), CLI: cli, dir: dir, tag: tag}
	fresh := absentDockerCgroups()
	t.Cleanup(func() {
		// Left by runc for the cgroupfs driver; only those this test made.
		for _, p := range fresh {
			syscall.Rmdir(p)
		}
		unmountBelow(dir)
		os.RemoveAll(dir)
	})

	ctdSock := filepath.Join(dir, "containerd.sock")
	ctd := d.daemon(t, "containerd", containerd, "--address", ctdSock,
		"--root", filepath.Join(dir, "containerd-root"), "--state", filepath.Join(dir, "containerd-state"))
	if err := waitFor(ctd, func() bool { _, err := os.Stat(ctdSock); return err == nil }); err != nil {
		t.Fatalf("containerd: %v\n%s", err, d.log("containerd"))
	}
	dkd := d.daemon(t, "dockerd", dockerd, "--containerd", ctdSock,
		"--containerd-namespace", "dkt-"+tag, "--containerd-plugins-namespace", "dkt-"+tag+"-plugins",
		"--data-root", filepath.Join(dir, "data"), "--exec-root", filepath.Join(dir, "exec"),
		"--pidfile", filepath.Join(dir, "docker.pid"), "-H", "unix://"+d.Socket,
		"--iptables=false", "--ip-masq=false", "--bridge=none", "--exec-opt", "native.cgroupdriver=cgroupfs")
	if err := waitFor(dkd, func() bool { return exec.Command(cli, "-H", "unix://"+d.Socket, "version").Run() == nil }); err != nil {
		t.Fatalf("dockerd: %v\n%s", err, d.log("dockerd"))
	}
	return d
}

func randHex() string {
	b := make([]byte, 4)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// daemon starts a daemon logging to dir/NAME.log, ended by its pid at
// cleanup (SIGTERM, then SIGKILL).
func (d *Daemon) daemon(t testing.TB, name, bin string, args ...string) *exec.Cmd {
	t.Helper()
	logf, err := os.Create(filepath.Join(d.dir, name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); logf.Close(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	return cmd
}

// waitFor polls ready until it holds or the daemon exits (or 60 s pass:
// a daemon that neither starts nor fails is an error too).
func waitFor(cmd *exec.Cmd, ready func() bool) error {
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if ready() {
			return nil
		}
		if syscall.Kill(cmd.Process.Pid, 0) != nil {
			return errors.New("exited")
		}
		time.Sleep(100 * time.Millisecond)
	}
	return errors.New("not ready after 60 s")
}

func (d *Daemon) log(name string) string {
	b, _ := os.ReadFile(filepath.Join(d.dir, name+".log"))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// Docker runs the client against the daemon and returns its trimmed
// output; an error fails the test.
func (d *Daemon) Docker(t testing.TB, args ...string) string {
	t.Helper()
	var out, errb bytes.Buffer
	cmd := exec.Command(d.CLI, append([]string{"-H", "unix://" + d.Socket}, args...)...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("docker %s: %v\n%s\ndockerd log:\n%s", strings.Join(args, " "), err, errb.String(), d.log("dockerd"))
	}
	return strings.TrimSpace(out.String())
}

// BusyboxImage imports a static busybox rootfs (busybox-static) as an
// image and returns its name. It skips the test without busybox-static.
func (d *Daemon) BusyboxImage(t testing.TB) string {
	t.Helper()
	bb := "/bin/busybox"
	if out, err := exec.Command(bb, "--help").CombinedOutput(); err != nil || !bytes.Contains(out, []byte("BusyBox")) {
		t.Skipf("no static busybox at %s (busybox-static; scripts/setup.sh installs it)", bb)
	}
	root := filepath.Join(d.dir, "rootfs")
	for _, dir := range []string{"bin", "tmp", "proc", "sys", "dev", "etc"} {
		if err := os.MkdirAll(filepath.Join(root, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "bin", "busybox"), data, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, applet := range []string{"sh", "sleep", "cat", "id", "mount"} {
		if err := os.Symlink("busybox", filepath.Join(root, "bin", applet)); err != nil {
			t.Fatal(err)
		}
	}
	name := "dockertest-busybox:" + d.tag
	tar := exec.Command("tar", "-C", root, "-c", ".")
	imp := exec.Command(d.CLI, "-H", "unix://"+d.Socket, "import", "-", name)
	pipe, err := tar.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	imp.Stdin = pipe
	var errb bytes.Buffer
	imp.Stderr = &errb
	if err := tar.Start(); err != nil {
		t.Fatal(err)
	}
	if err := imp.Run(); err != nil {
		t.Fatalf("docker import: %v: %s", err, errb.String())
	}
	if err := tar.Wait(); err != nil {
		t.Fatalf("tar: %v", err)
	}
	return name
}

// Container is a running container, its program executed.
type Container struct {
	ID  string
	PID int // its init process, as the host sees it
}

// Run starts a detached container (`docker run -d ARGS...`) and removes
// it at cleanup.
func (d *Daemon) Run(t testing.TB, args ...string) Container {
	t.Helper()
	name := "dkt-" + d.tag + "-" + randHex()
	id := d.Docker(t, append([]string{"run", "-d", "--name", name}, args...)...)
	t.Cleanup(func() {
		exec.Command(d.CLI, "-H", "unix://"+d.Socket, "rm", "-f", id).Run()
	})
	pid, err := strconv.Atoi(d.Docker(t, "inspect", "-f", "{{.State.Pid}}", id))
	if err != nil || pid <= 0 {
		t.Fatalf("container %s has no pid: %v", id, err)
	}
	// `docker run -d` can return while runc's init still runs in the
	// container, before it applies capabilities, seccomp and
	// no_new_privs and executes the container's program.
	deadline := time.Now().Add(30 * time.Second)
	for {
		comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if err != nil {
			t.Fatalf("container %s: %v", id, err)
		}
		if !strings.HasPrefix(string(comm), "runc") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("container %s still runs %q after 30 s", id, comm)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return Container{ID: id, PID: pid}
}

// absentDockerCgroups lists the "docker" cgroups (cgroupfs driver) that
// do not exist yet in each mounted hierarchy.
func absentDockerCgroups() []string {
	var out []string
	mounts, _ := os.ReadFile("/proc/self/mounts")
	for _, l := range strings.Split(string(mounts), "\n") {
		f := strings.Fields(l)
		if len(f) < 3 || (f[2] != "cgroup" && f[2] != "cgroup2") {
			continue
		}
		p := filepath.Join(f[1], "docker")
		if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) {
			out = append(out, p)
		}
	}
	return out
}

// unmountBelow lazily unmounts whatever a killed daemon left mounted
// under dir (overlay layers, shm), deepest first.
func unmountBelow(dir string) {
	mounts, _ := os.ReadFile("/proc/self/mounts")
	lines := strings.Split(string(mounts), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		f := strings.Fields(lines[i])
		if len(f) >= 2 && strings.HasPrefix(f[1], dir+"/") {
			if err := syscall.Unmount(f[1], syscall.MNT_DETACH); err != nil {
				fmt.Fprintf(os.Stderr, "dockertest: unmount %s: %v\n", f[1], err)
			}
		}
	}
}
