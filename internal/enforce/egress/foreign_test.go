package egress_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/enforce/egress"
	"github.com/watcherhq/watcher/internal/enforce/enforcetest"
	"github.com/watcherhq/watcher/internal/enforce/rules/egressrules"
)

// TestForeignSockets: a socket made outside the sandbox and handed in (here
// inherited as fd 3; SCM_RIGHTS and pidfd_getfd give the same kind of
// socket) is refused at connect and addressed send, with reason 13, even
// to an address the sandbox's own sockets may reach: the kernel runs the
// sandbox's programs only for sockets made in its cgroups, so the
// root-attached programs judge the rest. The benign neighbours: the same
// sandbox's own socket to the same answered address, and the inherited
// socket used outside every sandbox.
func TestForeignSockets(t *testing.T) {
	f := setup(t)
	if err := f.eg.ForeignErr(); err != nil {
		t.Skipf("this kernel does not judge foreign sockets: %v", err)
	}
	for _, c := range []struct {
		id     uint32
		record bool
	}{{sandboxID, false}, {recordID, true}} {
		if err := f.eg.SetSandbox(c.id, egressrules.SandboxConfig{Proxy4: f.proxy4, Proxy6: f.proxy6,
			RecordOnly: c.record, RefuseForeign: true}); err != nil {
			t.Fatal(err)
		}
	}
	n := f.net
	dnsAt := "WATCHER_DNS=" + netip.AddrPortFrom(n.dead, 53).String()

	// Own socket, answered address: allowed.
	r, _ := f.op(t, f.sandbox, "resolve-connect", "WATCHER_NAME=allowed.test", dnsAt, "WATCHER_NET=tcp4")
	mustOK(t, "own socket to allowed.test:80", r, "allowed")

	// The same, on a TCP socket made here: refused, reason 13.
	tcp := outsideSocket(t, unix.AF_INET, unix.SOCK_STREAM)
	r, pid := f.opWithFD(t, f.sandbox, tcp, "resolve-connect", "WATCHER_NAME=allowed.test", dnsAt, "WATCHER_NET=tcp4", "WATCHER_FD=3")
	mustEPERM(t, "inherited TCP socket to allowed.test:80", r)
	f.wantForeign(t, pid, netip.AddrPortFrom(n.allowed, 80).String())

	// In a child cgroup of the sandbox: the same.
	tcp = outsideSocket(t, unix.AF_INET, unix.SOCK_STREAM)
	r, _ = f.opWithFD(t, f.child, tcp, "fd-connect", "WATCHER_ADDR="+netip.AddrPortFrom(n.forbidden, 80).String())
	mustEPERM(t, "inherited TCP socket from a child cgroup", r)

	// An unconnected UDP socket: the addressed send is refused.
	udp := outsideSocket(t, unix.AF_INET, unix.SOCK_DGRAM)
	r, pid = f.opWithFD(t, f.sandbox, udp, "fd-udp", "WATCHER_ADDR="+netip.AddrPortFrom(n.allowed, 9999).String())
	mustEPERM(t, "inherited UDP socket sendto", r)
	f.wantForeign(t, pid, netip.AddrPortFrom(n.allowed, 9999).String())

	// IPv6, to the allowed server's v6 address.
	tcp6 := outsideSocket(t, unix.AF_INET6, unix.SOCK_STREAM)
	r, _ = f.opWithFD(t, f.sandbox, tcp6, "fd-connect", "WATCHER_ADDR="+netip.AddrPortFrom(n.allowed6, 80).String())
	mustEPERM(t, "inherited TCP6 socket", r)

	// A sandbox whose egress is allow does not set RefuseForeign: an
	// inherited socket there is judged by nothing new (here: the answered
	// address is reached through it).
	if err := f.eg.SetSandbox(sandboxID, egressrules.SandboxConfig{Proxy4: f.proxy4, Proxy6: f.proxy6}); err != nil {
		t.Fatal(err)
	}
	tcp = outsideSocket(t, unix.AF_INET, unix.SOCK_STREAM)
	r, _ = f.opWithFD(t, f.sandbox, tcp, "resolve-connect", "WATCHER_NAME=allowed.test", dnsAt, "WATCHER_NET=tcp4", "WATCHER_FD=3")
	mustOK(t, "inherited TCP socket, RefuseForeign unset", r, "allowed")
	if err := f.eg.SetSandbox(sandboxID, egressrules.SandboxConfig{Proxy4: f.proxy4, Proxy6: f.proxy6, RefuseForeign: true}); err != nil {
		t.Fatal(err)
	}

	// With the root's programs removed the sandbox's own ones never see
	// the socket: the refusal above was theirs.
	if err := f.eg.SetForeign(false); err != nil {
		t.Fatal(err)
	}
	tcp = outsideSocket(t, unix.AF_INET, unix.SOCK_STREAM)
	r, _ = f.opWithFD(t, f.sandbox, tcp, "fd-connect", "WATCHER_ADDR="+netip.AddrPortFrom(n.allowed, 80).String())
	mustOK(t, "inherited TCP socket, root programs removed", r, "allowed")
	if err := f.eg.SetForeign(true); err != nil {
		t.Fatal(err)
	}

	// Outside every sandbox the inherited socket works.
	tcp = outsideSocket(t, unix.AF_INET, unix.SOCK_STREAM)
	r, _ = f.opWithFD(t, f.outside, tcp, "fd-connect", "WATCHER_ADDR="+netip.AddrPortFrom(n.allowed, 80).String())
	mustOK(t, "inherited TCP socket outside", r, "allowed")

	// Record-only: the connect goes through and is recorded.
	tcp = outsideSocket(t, unix.AF_INET, unix.SOCK_STREAM)
	r, pid = f.opWithFD(t, f.record, tcp, "fd-connect", "WATCHER_ADDR="+netip.AddrPortFrom(n.allowed, 80).String())
	mustOK(t, "inherited TCP socket, record-only sandbox", r, "allowed")
	ev := f.kernelEvents.wait(t, "record of the foreign connect", func(ev audit.Event) bool {
		return ev.Kind == audit.KindNet && ev.Net != nil && ev.Process.TGID == uint32(pid)
	})
	if ev.Verdict != audit.VerdictRecorded || !strings.Contains(ev.Net.Reason, "made outside the sandbox") {
		t.Errorf("record-only foreign connect: verdict %s reason %q", ev.Verdict, ev.Net.Reason)
	}

	// Unix sockets (kernel 6.7+): a socket in the workspace, allowed for
	// the sandbox's own sockets, is refused on a socket made outside.
	if f.eg.UnixErr() != nil {
		t.Logf("no cgroup unix socket hooks here: unix sockets not checked (%v)", f.eg.UnixErr())
		return
	}
	ws := t.TempDir()
	sock := filepath.Join(ws, "dev.sock")
	serveBanner(t, "unix", sock, "workspace")
	if err := f.eg.SetSandbox(sandboxID, egressrules.SandboxConfig{Proxy4: f.proxy4, Proxy6: f.proxy6,
		RestrictUnix: true, UnixPaths: []string{ws + "/"}, RefuseForeign: true}); err != nil {
		t.Fatal(err)
	}
	r, _ = f.op(t, f.sandbox, "unix-connect", "WATCHER_ADDR="+sock)
	mustOK(t, "own unix socket to the workspace", r, "workspace")
	us := outsideSocket(t, unix.AF_UNIX, unix.SOCK_STREAM)
	r, pid = f.opWithFD(t, f.sandbox, us, "fd-unix", "WATCHER_ADDR="+sock)
	mustEPERM(t, "inherited unix socket to the workspace", r)
	ev = f.kernelEvents.wait(t, "refusal of the foreign unix connect", func(ev audit.Event) bool {
		return ev.Kind == audit.KindNet && ev.Net != nil && ev.Process.TGID == uint32(pid)
	})
	if !strings.Contains(ev.Net.Reason, "made outside the sandbox") || ev.Net.Addr != sock {
		t.Errorf("foreign unix refusal: addr %q reason %q", ev.Net.Addr, ev.Net.Reason)
	}
}

// outsideSocket makes a socket in the test's own (non-sandbox) cgroup.
func outsideSocket(t *testing.T, family, typ int) *os.File {
	t.Helper()
	fd, err := unix.Socket(family, typ|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "outside-socket")
	t.Cleanup(func() { f.Close() })
	return f
}

// opWithFD runs a helper operation in cgroup cg with sock as its fd 3.
func (f *fixture) opWithFD(t *testing.T, cg string, sock *os.File, mode string, env ...string) (helperResult, int) {
	t.Helper()
	cmd := enforcetest.SelfCommand(t, cg, "TestEgress", mode, env...)
	cmd.ExtraFiles = []*os.File{sock}
	out, _ := cmd.CombinedOutput()
	pid := 0
	if cmd.Process != nil {
		pid = cmd.Process.Pid
	}
	return parseHelper(out), pid
}

func (f *fixture) wantForeign(t *testing.T, pid int, addr string) {
	t.Helper()
	ev := f.kernelEvents.wait(t, "refusal of the foreign socket", func(ev audit.Event) bool {
		return ev.Kind == audit.KindNet && ev.Net != nil && ev.Process.TGID == uint32(pid)
	})
	got := net.JoinHostPort(ev.Net.Addr, strconv.Itoa(int(ev.Net.Port)))
	if !strings.Contains(ev.Net.Reason, "made outside the sandbox") || got != addr || ev.Verdict != audit.VerdictDenied {
		t.Errorf("foreign socket refusal: %s %s reason %q, want %s, reason 13", ev.Verdict, got, ev.Net.Reason, addr)
	}
	if ev.Net.Reason != egress.ReasonText(egress.ReasonForeignSock) {
		t.Errorf("reason %q is not reason 13's text", ev.Net.Reason)
	}
}

// foreignHelpers use the socket inherited as fd 3.
var foreignHelpers = map[string]func(ctx context.Context) (string, error){
	"fd-connect": func(ctx context.Context) (string, error) {
		ap, err := netip.ParseAddrPort(os.Getenv("WATCHER_ADDR"))
		if err != nil {
			return "", err
		}
		return connectFD(3, ap)
	},
	"fd-udp": func(ctx context.Context) (string, error) {
		ap, err := netip.ParseAddrPort(os.Getenv("WATCHER_ADDR"))
		if err != nil {
			return "", err
		}
		if err := unix.Sendto(3, []byte("ping"), 0, sockaddr(ap)); err != nil {
			return "", err
		}
		return "sent", nil
	},
	"fd-unix": func(ctx context.Context) (string, error) {
		if err := unix.Connect(3, &unix.SockaddrUnix{Name: os.Getenv("WATCHER_ADDR")}); err != nil {
			return "", err
		}
		return readFD(3)
	},
}

// connectFD connects fd to ap and returns what the server says.
func connectFD(fd int, ap netip.AddrPort) (string, error) {
	if err := unix.Connect(fd, sockaddr(ap)); err != nil {
		return "", err
	}
	return readFD(fd)
}

func readFD(fd int) (string, error) {
	tv := unix.NsecToTimeval((3 * time.Second).Nanoseconds())
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	buf := make([]byte, 64)
	k, err := unix.Read(fd, buf)
	if err != nil {
		return "", fmt.Errorf("read: %w", err)
	}
	return strings.TrimSpace(string(buf[:k])), nil
}

func sockaddr(ap netip.AddrPort) unix.Sockaddr {
	if ap.Addr().Is4() {
		return &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}
	}
	return &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
}
