// Package e2etest is the testbed of the end-to-end suites (cmd/watcher's
// and test/adversarial's): one agent's private world on the real host (its
// own directories, bpffs pins, sockets, ledger, DNS port and sandbox
// cgroups, all removed at cleanup), the agent process started and stopped
// from outside, and helper binaries built once. Only tests import it.
package e2etest

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/limits"
)

// World is one agent's private world. Its names carry a random id, so
// suites running at the same time on one host do not meet.
type World struct {
	// ID is the random part of every name.
	ID string
	// Base is a private directory under /var/lib: not under /tmp, since
	// the restricted preset kills execs from /tmp and the suites run
	// binaries from their workspaces.
	Base string
	// Cgroup is the sandbox root, /watcher-PREFIX-ID, relative to the
	// cgroup2 mount; CgAbs is its absolute path. The agent's exec parent
	// is Cgroup+"-exec".
	Cgroup, CgAbs string
	// PinDir is the agent's bpffs pin directory.
	PinDir string
	// AgentDir (Base/agent) holds the agent's own files: its sockets
	// (SocketDir), its ledger (Ledger) and the state the agent keeps
	// beside the ledger. Workspaces go elsewhere under Base.
	AgentDir, SocketDir, Ledger string
	// DNSPort is a free loopback port for the agent's DNS proxy;
	// DNSUpstreams, when set, are the servers it forwards to (a test's
	// own, on loopback).
	DNSPort      int
	DNSUpstreams []string

	t       testing.TB
	cgroups []string
}

// New makes a world named watcher-PREFIX-ID. It skips the test unless it
// runs as root on a host with a cgroup v2 hierarchy. At cleanup the
// world's cgroups (the sandbox root, its exec parent and those given to
// OwnCgroup) are thawed, emptied and removed and its pins are removed;
// stop the agent before (a Process registered after New is stopped first).
func New(t testing.TB, prefix string) *World {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("end-to-end tests need root: the agent loads BPF programs")
	}
	if _, err := cgroupfs.Mountpoint(); err != nil {
		t.Skipf("no cgroup v2 hierarchy: %v", err)
	}
	b := make([]byte, 4)
	rand.Read(b)
	w := &World{ID: hex.EncodeToString(b), t: t}
	name := "watcher-" + prefix + "-" + w.ID
	if err := os.MkdirAll("/var/lib", 0o755); err != nil {
		t.Fatal(err)
	}
	base, err := os.MkdirTemp("/var/lib", name+"-")
	if err != nil {
		t.Fatal(err)
	}
	w.Base = base
	w.Cgroup = "/" + name
	if w.CgAbs, err = cgroupfs.Abs(w.Cgroup); err != nil {
		t.Fatal(err)
	}
	w.cgroups = []string{w.CgAbs, w.CgAbs + "-exec"}
	w.PinDir = filepath.Join("/sys/fs/bpf", name)
	w.AgentDir = filepath.Join(base, "agent")
	if err := os.Mkdir(w.AgentDir, 0o755); err != nil {
		t.Fatal(err)
	}
	w.SocketDir = filepath.Join(w.AgentDir, "run")
	w.Ledger = filepath.Join(w.AgentDir, "ledger")
	w.DNSPort = FreePort(t)
	t.Cleanup(func() {
		for _, cg := range w.cgroups {
			cgroupfs.Freeze(cg, false)
			if err := cgroupfs.Remove(cg); err != nil {
				t.Errorf("remove cgroup %s: %v", cg, err)
			}
			removeV1Twins(t, cg)
		}
		if err := enforce.Unpin(w.PinDir); err != nil {
			t.Errorf("unpin %s: %v", w.PinDir, err)
		}
		os.RemoveAll(base)
	})
	return w
}

// OwnCgroup adds cgroups (absolute paths) the world removes at cleanup.
func (w *World) OwnCgroup(abs ...string) { w.cgroups = append(w.cgroups, abs...) }

// ControlSocket is the agent's control socket.
func (w *World) ControlSocket() string { return filepath.Join(w.SocketDir, "control.sock") }

// EventsSocket is the agent's event stream (watcher tail).
func (w *World) EventsSocket() string { return filepath.Join(w.SocketDir, "events.sock") }

// PolicyHead is the start of a policy for this world: version, the agent
// section (its ledger, sockets, pins, exec parent and DNS port; metrics on
// metricsAddr, "" for none) and the "sandboxes:" key, for the caller to
// append its sandboxes to.
func (w *World) PolicyHead(metricsAddr string) string {
	upstreams := ""
	if len(w.DNSUpstreams) > 0 {
		upstreams = fmt.Sprintf(", upstreams: [%s]", strings.Join(w.DNSUpstreams, ", "))
	}
	return fmt.Sprintf(`version: 1
agent:
  ledger_dir: %s
  socket_dir: %s
  pin_dir: %s
  metrics_addr: %q
  exec_cgroup: %s-exec
  dns: {listen: "127.0.0.1:%d"%s}
sandboxes:
`, w.Ledger, w.SocketDir, w.PinDir, metricsAddr, w.Cgroup, w.DNSPort, upstreams)
}

// FreePort returns a TCP port on loopback that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// removeV1Twins removes the v1 cgroups the agent made beside the cgroup2
// one at abs for the sandbox's limits (hybrid hosts).
func removeV1Twins(t testing.TB, abs string) {
	h, err := limits.Detect()
	root, rerr := cgroupfs.Mountpoint()
	if err != nil || rerr != nil {
		return
	}
	if err := h.RemoveV1Tree(strings.TrimPrefix(abs, root)); err != nil {
		t.Errorf("remove v1 cgroups of %s: %v", abs, err)
	}
}
