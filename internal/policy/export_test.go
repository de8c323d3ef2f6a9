package policy

import (
	"strings"
	"testing"
	"time"
)

func exportPolicy(exports string) string {
	return "version: 1\nagent:\n  export:\n" + exports + "sandboxes:\n  - name: a\n    select: {cgroups: [/a]}\n"
}

func TestExport(t *testing.T) {
	p, err := Parse("e.yaml", []byte(exportPolicy(`    - name: central
      endpoint: collector.example:4317
      tls: {ca_file: /etc/watcher/ca.pem}
      headers: {authorization: "Bearer t"}
      filter: {sandboxes: [a], kinds: [exec, file_open], verdicts: [denied], min_severity: alert}
      batch_interval: 250ms
      buffer_records: 1000
      rate_limit: 50
      metrics_interval: 30s
    - name: lake
      protocol: http
      endpoint: https://otlp.example/v1/logs
`)))
	if err != nil {
		t.Fatal(err)
	}
	x := p.Agent.Export
	if len(x) != 2 || x[0].Filter.MinSeverity != "alert" || x[0].BatchInterval.Duration != 250*time.Millisecond ||
		x[0].Headers["authorization"] != "Bearer t" || x[1].Protocol != "http" || x[0].TLS.CAFile != "/etc/watcher/ca.pem" ||
		x[0].MetricsInterval.Duration != 30*time.Second {
		t.Fatalf("export %+v", x)
	}
	for _, tc := range []struct{ yaml, want string }{
		{"    - name: c\n", "export[0].endpoint: required"},
		{"    - name: c\n      endpoint: nohost\n", "export[0].endpoint"},
		{"    - name: c\n      protocol: http\n      endpoint: 127.0.0.1:4318\n", "want http(s)://"},
		{"    - name: c\n      protocol: kafka\n      endpoint: h:1\n", "export[0].protocol"},
		{"    - name: c\n      endpoint: h:1\n      filter: {kinds: [opne]}\n", `"opne" is not an event kind`},
		{"    - name: c\n      endpoint: h:1\n      filter: {min_severity: high}\n", "min_severity"},
		{"    - name: c\n      endpoint: h:1\n      tls: {cert_file: /c.pem}\n", "go together"},
		{"    - name: c\n      endpoint: h:1\n    - name: c\n      endpoint: h:2\n", "listed twice"},
		{"    - endpoint: h:1\n", "export[0].name: required"},
		{"    - name: c\n      endpoint: h:1\n      rate_limit: -1\n", "rate_limit"},
		{"    - name: c\n      endpoint: h:1\n      metrics_interval: 10ms\n", "minimum of 1s"},
	} {
		_, err := Parse("e.yaml", []byte(exportPolicy(tc.yaml)))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want %q", tc.yaml, err, tc.want)
		}
	}
}

func TestSelectLabels(t *testing.T) {
	p, err := Parse("l.yaml", []byte(`version: 1
agent:
  docker_socket: /run/docker.sock
sandboxes:
  - name: pods
    select:
      labels: {io.kubernetes.pod.namespace: agents, app: "*"}
`))
	if err != nil {
		t.Fatal(err)
	}
	ts := p.WatchTargets()
	if len(ts) != 1 || ts[0].Name != "pods" || ts[0].Labels["io.kubernetes.pod.namespace"] != "agents" || p.Agent.DockerSocket != "/run/docker.sock" {
		t.Fatalf("targets %+v", ts)
	}
	_, err = Parse("l.yaml", []byte("version: 1\nsandboxes:\n  - name: p\n    select:\n      labels: {app: \"\"}\n"))
	if err == nil || !strings.Contains(err.Error(), "select.labels") {
		t.Fatalf("empty label value: %v", err)
	}
}
