package canary_test

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/testkit/e2etest"
)

// envSpend makes the test binary a process that spends its sandbox's DNS
// information budget under watcher.invalid (spendMain).
const envSpend = "WATCHER_CANARY_TEST_SPEND"

// spendMain says "ready", waits for a byte on stdin (the test moves it
// into the sandbox meanwhile: this binary's initialisers call bpf(), which
// the sandbox kills for), then asks the same made-up names under
// watcher.invalid, always in the same order, through the kernel's DNS
// redirect, until the proxy cuts the domain off for spent information
// budget. It prints how many names the proxy judged (a rate-limited query
// is asked again later and not counted) and the last refusal's reason.
func spendMain() int {
	fmt.Println("ready")
	var b [1]byte
	if n, _ := os.Stdin.Read(b[:]); n != 1 {
		return 2
	}
	c := &dns.Client{Net: "udp", Timeout: 3 * time.Second}
	x := uint64(0x9e3779b97f4a7c15)
	judged := 0
	for judged < 1000 {
		x = x*6364136223846793005 + 1442695040888963407
		m := new(dns.Msg)
		m.SetQuestion(fmt.Sprintf("%016x.watcher.invalid.", x), dns.TypeA)
		m.SetEdns0(1232, false)
		for {
			r, _, err := c.Exchange(m, "127.0.0.1:53")
			if err != nil {
				fmt.Println("error", err)
				return 1
			}
			reason := ""
			if opt := r.IsEdns0(); opt != nil {
				for _, o := range opt.Option {
					if e, ok := o.(*dns.EDNS0_EDE); ok {
						reason = e.ExtraText
					}
				}
			}
			if r.Rcode == dns.RcodeRefused && strings.Contains(reason, "rate limited") {
				time.Sleep(100 * time.Millisecond)
				continue
			}
			judged++
			if strings.HasPrefix(reason, "too much information in names") {
				fmt.Println(judged, reason)
				return 0
			}
			break
		}
	}
	fmt.Println(judged, "never cut off")
	return 0
}

// inSandbox starts this test binary with env, moves it into the leaf
// cgroup once it said "ready" (its initialisers call bpf(), which the
// sandbox kills for) and lets it go on; its stdout and stdin are returned.
// The process is killed and reaped at the test's end.
func inSandbox(t *testing.T, leaf, env string) (*bufio.Scanner, io.WriteCloser) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self)
	cmd.Env = []string{env}
	in, _ := cmd.StdinPipe()
	outPipe, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	out := bufio.NewScanner(outPipe)
	if !out.Scan() || out.Text() != "ready" {
		t.Fatalf("%s: did not start: %q", env, out.Text())
	}
	if err := cgroupfs.MovePID(leaf, cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	in.Write([]byte{1})
	return out, in
}

// spend runs spendMain in a fresh leaf below the cgroup parent and
// returns how many names it took to spend the budget.
func spend(t *testing.T, parent string) int {
	t.Helper()
	leaf := filepath.Join(parent, fmt.Sprintf("spend-%d-%d", os.Getpid(), time.Now().UnixNano()))
	if err := os.Mkdir(leaf, 0o755); err != nil {
		t.Fatal(err)
	}
	defer cgroupfs.Remove(leaf)
	out, _ := inSandbox(t, leaf, envSpend+"=1")
	if !out.Scan() {
		t.Fatalf("spender said nothing: %v", out.Err())
	}
	line := out.Text()
	n, err := strconv.Atoi(strings.Fields(line)[0])
	if err != nil || !strings.Contains(line, "under watcher.invalid") {
		t.Fatalf("spender in %s: %q", parent, line)
	}
	return n
}

// TestCanaryLeavesBudgetAlone: the canary's DNS probes spend none of the
// sandbox's DNS information budget, and a sandbox whose budget under the
// canary's domain is spent still gets the policy's verdict.
//
// Two sandboxes with the same policy: the canary runs 30 times on one
// (60 queries of made-up names under canary.watcher.invalid), never on the
// other. A process in each then asks the same names under watcher.invalid
// until the proxy cuts the domain off: it takes exactly as many names in
// both. Then, with the budget spent, the canary's DNS check still passes
// on its own reason ("not on allowlist"), and the sandbox's own queries
// are still cut off (the canary did not reset what the sandbox spent).
func TestCanaryLeavesBudgetAlone(t *testing.T) {
	var twin string
	h := startHealthyWith(t, "canary-budget", func(w *e2etest.World) string {
		twin = w.CgAbs + "-twin"
		w.OwnCgroup(twin)
		return fmt.Sprintf(`  - name: twin
    select: {cgroups: [%s]}
    preset: restricted
    escape: {enabled: false}
    canary: {enabled: false}
`, twin)
	})
	for i := 0; i < 30; i++ {
		for _, r := range h.runDNS(t) {
			if !r.OK {
				t.Fatalf("DNS run %d failed on a healthy agent:\n%s", i+1, row(r))
			}
		}
	}
	probed, fresh := spend(t, h.w.CgAbs), spend(t, twin)
	t.Logf("names until the budget under watcher.invalid was spent: %d after 30 canary runs, %d in the twin", probed, fresh)
	if probed != fresh {
		t.Errorf("the canary's runs changed the sandbox's budget: %d names to spend it, %d in a sandbox the canary never ran in", probed, fresh)
	}
	for _, r := range h.runDNS(t) {
		t.Logf("budget spent: %s", row(r))
		if !r.OK || !strings.HasSuffix(r.Detail, "EDE 17 not on allowlist") {
			t.Errorf("DNS check with the sandbox's budget spent:\n%s", row(r))
		}
	}
	if n := spend(t, h.w.CgAbs); n != 1 {
		t.Errorf("after the canary ran, the sandbox's own first query was judged %d names late: its spent budget was reset", n)
	}
}
