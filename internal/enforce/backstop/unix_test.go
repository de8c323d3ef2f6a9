package backstop_test

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/rules/backstoprules"
)

// serveUnix listens on a stream (or datagram) unix socket at path,
// greeting every stream client; closed at cleanup.
func serveUnix(t *testing.T, path, greeting string, dgram bool) {
	t.Helper()
	if dgram {
		c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte(greeting))
			c.Close()
		}
	}()
}

// TestUnixPeers: cgroup/connect_unix judges the path as passed, so a
// symlink in the workspace to a host socket (the Docker socket, D-Bus)
// passes it. The backstop judges the peer the kernel connected to and
// kills the connecting process before it returns to user space: nothing
// the host service sends reaches it. A socket in the workspace, reached
// through a symlink in the workspace, and the host socket from outside
// the sandbox still work; without the rule the symlink reaches the host.
func TestUnixPeers(t *testing.T) {
	dir := t.TempDir()
	ws, host := filepath.Join(dir, "ws"), filepath.Join(dir, "host")
	for _, d := range []string{ws, host} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	hostSock, hostDgram := filepath.Join(host, "svc.sock"), filepath.Join(host, "log.sock")
	serveUnix(t, hostSock, "HOST-SERVICE", false)
	serveUnix(t, hostDgram, "", true)
	wsSock := filepath.Join(ws, "own.sock")
	serveUnix(t, wsSock, "WS-SERVICE", false)
	for link, target := range map[string]string{"svc-link": hostSock, "log-link": hostDgram, "own-link": wsSock, "hostdir": host} {
		if err := os.Symlink(target, filepath.Join(ws, link)); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("without_fix_leaks", func(t *testing.T) {
		f := newFixture(t, nil)
		r := f.run(t, f.sandbox, "unixconnect", filepath.Join(ws, "svc-link"))
		if r.killed || !strings.Contains(r.out, "HOST-SERVICE") {
			t.Fatalf("the symlink did not reach the host socket without the rule: killed=%v\n%s", r.killed, r.out)
		}
	})

	const ruleID = 93
	f := newFixture(t, func(r *backstoprules.Rules) {
		r.UnixPeer = backstoprules.Rule{Action: enforce.ActionKill, ID: 1}
		r.UnixPaths = []backstoprules.UnixPaths{{SandboxID: 1, Paths: []string{ws + "/"}, Rule: ruleID}}
	})
	wantPeer := func(path string) func(audit.Event) error {
		return func(ev audit.Event) error {
			if ev.Kind != audit.KindNet || ev.Net == nil || ev.Net.Addr != path || ev.Net.Op != "connect" || ev.RuleID != ruleID {
				return fmt.Errorf("event %+v (net %+v), want a connect to %s by rule %d", ev, ev.Net, path, ruleID)
			}
			return nil
		}
	}
	for _, parent := range []string{f.sandbox, f.nested} {
		for _, via := range []string{"svc-link", "hostdir/svc.sock"} {
			r := f.run(t, parent, "unixconnect", filepath.Join(ws, via))
			f.expectKilled(t, r, wantPeer(hostSock))
			if strings.Contains(r.out, "HOST-SERVICE") || strings.Contains(r.out, "connected") {
				t.Fatalf("%s: the sandboxed process went on after connecting to the host socket:\n%s", via, r.out)
			}
		}
		r := f.run(t, parent, "unixconnect", filepath.Join(ws, "log-link"), "dgram")
		f.expectKilled(t, r, wantPeer(hostDgram))

		r = f.run(t, parent, "unixconnect", filepath.Join(ws, "own-link"))
		expectSurvived(t, r)
		if !strings.Contains(r.out, "WS-SERVICE") {
			t.Fatalf("the workspace's own socket through a workspace symlink failed:\n%s", r.out)
		}
	}
	r := f.run(t, f.outside, "unixconnect", filepath.Join(ws, "svc-link"))
	expectSurvived(t, r)
	if !strings.Contains(r.out, "HOST-SERVICE") {
		t.Fatalf("the host socket from outside the sandbox failed:\n%s", r.out)
	}
}
