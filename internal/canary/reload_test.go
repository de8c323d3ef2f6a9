package canary_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/agent"
	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/testkit/e2etest"
)

// envConnects makes the test binary connectsMain.
const envConnects = "WATCHER_CANARY_TEST_CONNECTS"

// connectsMain says "ready", waits for a byte on stdin (it is moved into
// the sandbox meanwhile), then connects UDP sockets to 127.0.0.1:53 (what
// the DNS probe does first) until stdin closes, and prints how many it
// made and each failure's errno.
func connectsMain() int {
	fmt.Println("ready")
	var b [1]byte
	if n, _ := os.Stdin.Read(b[:]); n != 1 {
		return 2
	}
	var stop atomic.Bool
	go func() { os.Stdin.Read(b[:]); stop.Store(true) }()
	failed := map[string]int{}
	n := 0
	for ; !stop.Load(); n++ {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err == nil {
			err = unix.Connect(fd, &unix.SockaddrInet4{Port: 53, Addr: [4]byte{127, 0, 0, 1}})
			unix.Close(fd)
		}
		if err != nil {
			failed[err.Error()]++
		}
	}
	fmt.Println(n, len(failed), failed)
	return 0
}

// TestDNSRedirectAcrossReloads: the kernel's DNS redirect never refuses a
// query while the policy is reloaded (every layer rewritten, the egress
// programs attached anew) and probes come and go in fresh leaf cgroups.
// A spurious EPERM of the canary's dns_unlisted probe was suspected to be
// a window at a reload; this is the canary's first step (connect to
// 127.0.0.1:53 from a leaf of the sandbox) hammered through 20 reloads
// and 20 moves to a new leaf (at least 5 s).
func TestDNSRedirectAcrossReloads(t *testing.T) {
	w := e2etest.New(t, "canary-reload")
	w.DNSUpstreams = []string{`"` + upstream(t) + `"`}
	pf := filepath.Join(w.Base, "policy.yaml")
	policyN := func(i int) []byte {
		return []byte(w.PolicyHead("") + fmt.Sprintf(`  - name: agents
    select: {cgroups: [%s]}
    preset: restricted
    escape: {enabled: false}
    canary: {enabled: false}
    dns: {allow: [x.example.com, y%d.example.com]}
`, w.Cgroup, i))
	}
	if err := os.WriteFile(pf, policyN(0), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a, err := agent.Start(ctx, agent.Options{PolicyPath: pf})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Stop()

	leaf := filepath.Join(w.CgAbs, fmt.Sprintf("connects-%d-0", os.Getpid()))
	if err := os.Mkdir(leaf, 0o755); err != nil {
		t.Fatal(err)
	}
	defer func() { cgroupfs.Remove(leaf) }()
	out, stdin := inSandbox(t, leaf, envConnects+"=1")
	procs, err := cgroupfs.Procs(leaf)
	if err != nil || len(procs) != 1 {
		t.Fatalf("connecting process in %s: %v %v", leaf, procs, err)
	}
	pid := procs[0]

	var reloads, moves int
	for i, start := 1, time.Now(); reloads < 20 || moves < 20 || time.Since(start) < 5*time.Second; i++ {
		if err := os.WriteFile(pf, policyN(i), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := a.Reload(); err != nil {
			t.Fatalf("reload %d: %v", i, err)
		}
		reloads++
		next := filepath.Join(w.CgAbs, fmt.Sprintf("connects-%d-%d", os.Getpid(), i))
		if err := os.Mkdir(next, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := cgroupfs.MovePID(next, pid); err != nil {
			t.Fatal(err)
		}
		moves++
		cgroupfs.Remove(leaf)
		leaf = next
		time.Sleep(20 * time.Millisecond)
	}
	stdin.Close()
	if !out.Scan() {
		t.Fatalf("connecting process said nothing: %v", out.Err())
	}
	var n, kinds int
	fmt.Sscan(out.Text(), &n, &kinds)
	t.Logf("%d connects to 127.0.0.1:53 through %d reloads and %d moves to a fresh leaf: %s", n, reloads, moves, out.Text())
	if kinds != 0 || n == 0 || !strings.HasSuffix(out.Text(), "map[]") {
		t.Errorf("the DNS redirect refused connects: %s", out.Text())
	}
}
