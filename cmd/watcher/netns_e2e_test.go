package main

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/agent"
	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/testkit/dockertest"
)

// TestContainerOwnNetnsDNS: a docker container with a network namespace of
// its own, caged by its labels, resolves through the agent's DNS proxy:
// the agent opens the proxy's listeners inside the container's namespace
// (recorded), an allowed name is answered and an unlisted one is
// NXDOMAIN; when the container goes, so do the listeners (recorded).
func TestContainerOwnNetnsDNS(t *testing.T) {
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("iproute2 (ip) is not installed")
	}
	d := dockertest.Start(t)
	image := d.BusyboxImage(t)
	cdnAddr, dnsAddr, inNS := cdnNamespace(t)
	serveCDNDNS(t, dnsAddr, cdnAddr, inNS)
	tb := newTestbed(t, `  - name: pods
    select: {labels: {io.kubernetes.pod.namespace: agents}}
    dns: {allow: [.cdn.test]}
`, "{enabled: false}")
	pol, _ := os.ReadFile(tb.policy)
	listen := fmt.Sprintf(`dns: {listen: "127.0.0.1:%d"}`, tb.DNSPort)
	s := strings.Replace(string(pol), listen, fmt.Sprintf(`dns: {listen: "127.0.0.1:%d", upstreams: ["%s"]}`, tb.DNSPort, netip.AddrPortFrom(dnsAddr, 53)), 1)
	s = strings.Replace(s, "agent:\n", "agent:\n  docker_socket: "+d.Socket+"\n", 1)
	if err := os.WriteFile(tb.policy, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
	tb.startAgent()
	records := tb.tailJSON(func(e audit.Event) bool { return e.Rule == agent.RuleNetnsListeners })
	time.Sleep(300 * time.Millisecond)

	// --network none: a namespace of its own with only lo. The entrypoint
	// asks in a loop (docker exec would setns into the caged container,
	// which the restricted preset kills): the first queries may come before
	// the agent caged the container or opened its listeners.
	script := "while true; do echo ASK; busybox nslookup a.cdn.test 10.255.255.53 2>&1; busybox nslookup evil.test 10.255.255.53 2>&1; sleep 0.5; done"
	c := d.Run(t, "--network", "none", "--label", "io.kubernetes.pod.namespace=agents", image, "/bin/sh", "-c", script)
	var out string
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		// The last complete round: both answers after the last ASK.
		logs := d.Docker(t, "logs", c.ID)
		if k := strings.LastIndex(strings.TrimSuffix(logs, "ASK\n"), "ASK\n"); k >= 0 {
			out = logs[k:]
		}
		if strings.Contains(out, cdnAddr.String()) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if !strings.Contains(out, cdnAddr.String()) {
		t.Fatalf("allowed name in the container not answered within 20 s:\n%s\nagent log:\n%s", out, tb.agentLog)
	}
	if !strings.Contains(out, "NXDOMAIN") {
		t.Errorf("unlisted name in the container: want NXDOMAIN:\n%s", out)
	}
	wait := func(what string, opened bool) {
		t.Helper()
		timeout := time.After(20 * time.Second)
		for {
			select {
			case e, ok := <-records:
				if !ok {
					t.Fatalf("tail ended before %s", what)
				}
				if strings.HasPrefix(e.Message, "listeners opened") == opened {
					t.Logf("%s: %s", what, e.Message)
					return
				}
			case <-timeout:
				t.Fatalf("no record of %s within 20 s; agent log:\n%s", what, tb.agentLog)
			}
		}
	}
	wait("listeners opened", true)
	d.Docker(t, "rm", "-f", c.ID)
	wait("listeners closed", false)
	tb.stopAgent(syscall.SIGTERM)
}
