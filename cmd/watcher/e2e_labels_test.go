package main

import (
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/testkit/dockertest"
)

// TestRunningAgentSelectsByLabels: a sandbox selecting containers by the
// labels kubelet sets (io.kubernetes.pod.namespace), read from a real
// dockerd: a container of that namespace started after the agent is
// caged, its events carry its pod, namespace and container id; one of
// another namespace is not. The log gives the caging gap: how many of the
// entrypoint's first execs ran before the container was caged.
func TestRunningAgentSelectsByLabels(t *testing.T) {
	d := dockertest.Start(t)
	image := d.BusyboxImage(t)
	tb := newTestbed(t, `  - name: pods
    select: {labels: {io.kubernetes.pod.namespace: agents}}
    mode: record
`, "{enabled: false}")
	pol, _ := os.ReadFile(tb.policy)
	os.WriteFile(tb.policy, []byte(strings.Replace(string(pol), "agent:\n", "agent:\n  docker_socket: "+d.Socket+"\n", 1)), 0o600)
	tb.startAgent()
	// The canary's own probes run in the sandbox too: not the container's.
	events := tb.tailJSON(func(e audit.Event) bool { return e.Sandbox.Name == "pods" && e.Sandbox.Labels[audit.LabelCanary] == "" })
	time.Sleep(300 * time.Millisecond)

	// The entrypoint runs cat 2000 times, numbered: the first numbered exec
	// the sandbox records says how many ran before the container was caged.
	script := "i=0; while [ $i -lt 2000 ]; do cat /etc/hostname $i >/dev/null 2>&1; i=$((i+1)); done; sleep 1000"
	other := d.Run(t, "--network", "none", "--label", "io.kubernetes.pod.namespace=other", image, "/bin/sh", "-c", script)
	c := d.Run(t, "--network", "none", "--label", "io.kubernetes.pod.namespace=agents",
		"--label", "io.kubernetes.pod.name=coder-0", "--label", "io.kubernetes.container.name=agent", image, "/bin/sh", "-c", script)
	var first *audit.Event
	deadline := time.After(20 * time.Second)
	for first == nil {
		select {
		case e, ok := <-events:
			if !ok {
				t.Fatalf("tail ended\nagent:\n%s", tb.agentLog)
			}
			if e.Sandbox.Labels["container.id"] == other.ID {
				t.Errorf("container of namespace other caged: %+v", e)
			}
			if e.Kind != audit.KindExec {
				continue
			}
			if e.Sandbox.Labels["container.id"] != c.ID || e.Sandbox.Labels["k8s.namespace.name"] != "agents" ||
				e.Sandbox.Labels["k8s.pod.name"] != "coder-0" || e.Sandbox.Labels["k8s.container.name"] != "agent" {
				t.Errorf("event without the container's identity: %+v", e.Sandbox)
			}
			if len(e.Process.Args) == 3 && e.Process.Args[0] == "cat" {
				first = &e
			}
		case <-deadline:
			t.Fatalf("no exec from the labelled container within 20 s\nagent:\n%s", tb.agentLog)
		}
	}
	started, err := time.Parse(time.RFC3339Nano, d.Docker(t, "inspect", "-f", "{{.State.StartedAt}}", c.ID))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("caging gap: the first caged exec is cat #%s of the entrypoint's loop, %v after docker's StartedAt",
		first.Process.Args[2], first.Time.Sub(started))
	out, code := tb.watcher("status", "--socket", tb.ControlSocket())
	if code != 0 && code != 1 || !strings.Contains(out, "pod agents/coder-0 container agent") || !strings.Contains(out, c.ID[:12]) {
		t.Errorf("status does not name the member pod: exit %d\n%s", code, out)
	}
	tb.stopAgent(syscall.SIGTERM)
}
