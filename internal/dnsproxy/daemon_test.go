package dnsproxy

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/watcherhq/watcher/internal/testkit/poll"
)

// freePort returns a loopback port that was free a moment ago (UDP and TCP).
func freePort(t *testing.T) int {
	t.Helper()
	for range 20 {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := pc.LocalAddr().(*net.UDPAddr).Port
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		pc.Close()
		if err == nil {
			ln.Close()
			return port
		}
	}
	t.Fatal("no free port")
	return 0
}

// startDaemon runs a resolver daemon in the foreground, killed by PID at
// the end of the test, and waits until it answers probe.
func startDaemon(t *testing.T, bin string, args []string, addr, probe string) {
	t.Helper()
	path, err := exec.LookPath(bin)
	if err != nil {
		for _, dir := range []string{"/usr/sbin", "/sbin"} {
			if _, err2 := os.Stat(filepath.Join(dir, bin)); err2 == nil {
				path, err = filepath.Join(dir, bin), nil
				break
			}
		}
	}
	if err != nil {
		t.Fatalf("%s not installed (Debian package needed in CI): %v", bin, err)
	}
	var out strings.Builder
	var mu sync.Mutex
	cmd := exec.Command(path, args...)
	w := &lockedWriter{mu: &mu, w: &out}
	cmd.Stdout, cmd.Stderr = w, w
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	pid := cmd.Process.Pid
	t.Cleanup(func() {
		syscall.Kill(pid, syscall.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			syscall.Kill(pid, syscall.SIGKILL)
			<-done
		}
	})
	c := &dns.Client{Net: "udp", Timeout: 200 * time.Millisecond}
	if poll.Within(10*time.Second, func() bool {
		m := new(dns.Msg)
		m.SetQuestion(probe, dns.TypeA)
		r, _, err := c.Exchange(m, addr)
		return err == nil && r.Rcode == dns.RcodeSuccess
	}) {
		return
	}
	mu.Lock()
	defer mu.Unlock()
	t.Fatalf("%s did not answer on %s: output:\n%s", bin, addr, out.String())
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *strings.Builder
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

func startUnbound(t *testing.T, zone string, records []string) string {
	t.Helper()
	dir := t.TempDir()
	port := freePort(t)
	var conf strings.Builder
	fmt.Fprintf(&conf, `server:
	interface: 127.0.0.1
	port: %d
	do-daemonize: no
	use-syslog: no
	logfile: ""
	username: ""
	chroot: ""
	directory: %q
	pidfile: ""
	do-ip6: no
	num-threads: 1
	module-config: "iterator"
	access-control: 127.0.0.0/8 allow
	local-zone: %q static
`, port, dir, zone)
	for _, r := range records {
		fmt.Fprintf(&conf, "\tlocal-data: %q\n", r)
	}
	cfgPath := filepath.Join(dir, "unbound.conf")
	if err := os.WriteFile(cfgPath, []byte(conf.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	startDaemon(t, "unbound", []string{"-d", "-c", cfgPath}, addr, "www."+zone)
	return addr
}

func TestWithUnbound(t *testing.T) {
	ub := startUnbound(t, "lab.test.", []string{
		"www.lab.test. 120 IN A 198.51.100.7",
		"www.lab.test. 120 IN AAAA 2001:db8::7",
		"api.lab.test. 60 IN A 198.51.100.8",
	})
	var mu sync.Mutex
	var got []Answer
	s, addr := startProxy(t, Config{
		Upstreams: []string{ub},
		Policy:    policyOf(map[string]*SandboxPolicy{"sb": allowOnly(".lab.test")}),
		OnAnswer: func(a Answer) {
			mu.Lock()
			got = append(got, a)
			mu.Unlock()
		},
	})
	r := query(t, addr, "www.lab.test", dns.TypeA)
	if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != "198.51.100.7" {
		t.Fatalf("A via unbound: %v", r)
	}
	r = query(t, addr, "www.lab.test", dns.TypeAAAA)
	if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
		t.Fatalf("AAAA via unbound: %v", r)
	}
	r = query(t, addr, "missing.lab.test", dns.TypeA)
	if r.Rcode != dns.RcodeNameError {
		t.Fatalf("unbound's NXDOMAIN not passed on: %s", dns.RcodeToString[r.Rcode])
	}
	if _, _, ok := ede(r); ok {
		t.Errorf("upstream NXDOMAIN carries a block EDE")
	}
	// Blocked before unbound is asked.
	r = query(t, addr, "other.test", dns.TypeA)
	if _, text, _ := ede(r); r.Rcode != dns.RcodeNameError || text != ReasonNotAllowed {
		t.Fatalf("not-allowed name: %s %q", dns.RcodeToString[r.Rcode], text)
	}
	// Over TCP too.
	m := new(dns.Msg)
	m.SetQuestion("api.lab.test.", dns.TypeA)
	tr, _, err := (&dns.Client{Net: "tcp", Timeout: 3 * time.Second}).Exchange(m, addr)
	if err != nil || tr.Rcode != dns.RcodeSuccess || len(tr.Answer) != 1 {
		t.Fatalf("TCP via unbound: %v %v", tr, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 3 || got[0].Addrs[0] != netip.MustParseAddr("198.51.100.7") || got[0].TTL != 120 {
		t.Errorf("OnAnswer: %+v", got)
	}
	if st := s.Stats(); st.UpstreamErrors != 0 || st.Allowed != 4 {
		t.Errorf("stats %+v", st)
	}
}

func TestWithDnsmasq(t *testing.T) {
	dir := t.TempDir()
	port := freePort(t)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	startDaemon(t, "dnsmasq", []string{
		"--keep-in-foreground", "--conf-file=/dev/null", "--no-resolv", "--no-hosts", "--bind-interfaces",
		"--listen-address=127.0.0.1", fmt.Sprintf("--port=%d", port), "--user=root",
		"--pid-file=" + filepath.Join(dir, "dnsmasq.pid"),
		"--address=/mask.test/203.0.113.9", "--local-ttl=90", "--log-facility=-",
	}, addr, "www.mask.test.")
	_, paddr := startProxy(t, Config{Upstreams: []string{addr}, Policy: policyOf(map[string]*SandboxPolicy{"sb": allowOnly(".mask.test")})})
	r := query(t, paddr, "www.mask.test", dns.TypeA)
	if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != "203.0.113.9" {
		t.Fatalf("A via dnsmasq: %v", r)
	}
}
