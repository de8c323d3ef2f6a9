package cgroupbpf_test

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/watcherhq/watcher/internal/enforce/enforcetest"
	"github.com/watcherhq/watcher/internal/enforce/rules/cgrouprules"
)

// TestPingSockets: in a network namespace whose ping_group_range admits
// root (as systemd hosts admit every group), an unconnected ICMP ping
// socket reaches an address without any connect or sendmsg hook; the
// per-sandbox ping rules refuse creating one, while UDP sockets in the
// sandbox and ping outside it keep working.
func TestPingSockets(t *testing.T) {
	f := setup(t)
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("iproute2 (ip) is not installed")
	}
	b := make([]byte, 3)
	rand.Read(b)
	ns := "wtping-" + hex.EncodeToString(b)
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	for _, args := range [][]string{
		{"ip", "-n", ns, "link", "set", "lo", "up"},
		{"ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv4.ping_group_range=0 2147483647"},
	} {
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v %s", strings.Join(args, " "), err, out)
		}
	}
	if err := f.hooks.SetSocketRules(cgrouprules.PingSocketRules(sandboxID, ruleSock)); err != nil {
		t.Fatal(err)
	}
	inNS := func(cg, op string) error {
		t.Helper()
		cmd := enforcetest.Command(t, cg, "ip", "netns", "exec", ns, os.Args[0], "-test.run=^TestHelper$", "-test.count=1")
		cmd.Env = append(os.Environ(), "WATCHER_TEST_HELPER="+op)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("helper %s: %v\n%s", op, err, out)
		}
		return parseResult(t, op, string(out))
	}
	if err := inNS(f.outside, "ping"); err != nil {
		t.Fatalf("ping outside the sandbox: %v (the namespace should allow ping sockets)", err)
	}
	for _, cg := range []string{f.sandbox, f.child} {
		if err := inNS(cg, "ping"); err != syscall.EPERM {
			t.Errorf("ping socket in %s: %v, want EPERM", cg, err)
		}
		if err := inNS(cg, "socket:2:2:17"); err != nil {
			t.Errorf("udp socket in %s: %v", cg, err)
		}
	}
}
