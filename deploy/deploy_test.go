// Package deploy holds the packaging files (Prometheus rules, systemd unit,
// Kubernetes manifests); its tests check them with the tools that consume
// them.
package deploy

import (
	"bytes"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/watcherhq/watcher/internal/policy"
)

func lookTool(t *testing.T, name, pkg string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Skipf("%s not installed (Debian package %s; CI installs it)", name, pkg)
	}
	return p
}

func run(t *testing.T, dir, bin string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func TestPrometheusRules(t *testing.T) {
	r := promRules(t, "alerts")
	// Every alert the agent's operators rely on exists and is tested.
	for _, alert := range []string{"WatcherDenialsSpike", "WatcherEventLoss", "WatcherSandboxFrozen", "WatcherLedgerStalled", "WatcherAgentDown"} {
		if !bytes.Contains(r.rules, []byte("alert: "+alert+"\n")) {
			t.Errorf("alerts.yml lacks %s", alert)
		}
	}
	r.requireTested(t)
	// The tests can fail: the same tests against a broken rule do.
	r.mustCatch(t, "WatcherSandboxFrozen", "expr: watcher_sandbox_frozen == 1", "expr: watcher_sandbox_frozen == 2")
}

// unitFor returns the unit text with its ExecStart binary replaced by an
// executable that exists here (systemd-analyze checks that it does).
func unitFor(t *testing.T, unit []byte) []byte {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return bytes.ReplaceAll(unit, []byte("ExecStart=/usr/local/bin/watcher "), []byte("ExecStart="+self+" "))
}

func TestSystemdUnit(t *testing.T) {
	unit, err := os.ReadFile("systemd/watcher.service")
	if err != nil {
		t.Fatal(err)
	}
	// What a privileged BPF agent needs, and hardening that would break it.
	directives := map[string]string{}
	for _, line := range strings.Split(string(unit), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(line, "#") {
			directives[k] = v
		}
	}
	for k, want := range map[string]string{
		"ExecReload":      "/bin/kill -HUP $MAINPID",
		"Restart":         "always",
		"LimitMEMLOCK":    "infinity",
		"ProtectSystem":   "strict",
		"NoNewPrivileges": "yes",
	} {
		if directives[k] != want {
			t.Errorf("%s=%q, want %q", k, directives[k], want)
		}
	}
	caps := strings.Fields(directives["CapabilityBoundingSet"])
	for _, c := range []string{"CAP_BPF", "CAP_PERFMON", "CAP_SYS_ADMIN", "CAP_NET_ADMIN", "CAP_SYS_RESOURCE"} {
		if !slices.Contains(caps, c) {
			t.Errorf("CapabilityBoundingSet lacks %s", c)
		}
	}
	for _, k := range []string{"ProtectKernelTunables", "ProtectControlGroups", "PrivateNetwork"} {
		if _, set := directives[k]; set {
			t.Errorf("%s would stop the agent from working", k)
		}
	}
	if !strings.HasPrefix(directives["ExecStart"], "/usr/local/bin/watcher run") {
		t.Errorf("ExecStart=%s", directives["ExecStart"])
	}
	checkRestarts(t, unit)

	analyze := lookTool(t, "systemd-analyze", "systemd")
	dir := t.TempDir()
	good := filepath.Join(dir, "watcher.service")
	os.WriteFile(good, unitFor(t, unit), 0o644)
	out, err := run(t, dir, analyze, "verify", good)
	// verify exits 0 even for unknown keys: any output is a finding.
	if err != nil || strings.TrimSpace(out) != "" {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
	// The check can fail: a misspelt directive is reported.
	bad := filepath.Join(dir, "bad.service")
	os.WriteFile(bad, bytes.Replace(unitFor(t, unit), []byte("ProtectSystem=strict"), []byte("ProtectSystm=strict"), 1), 0o644)
	if out, _ := run(t, dir, analyze, "verify", bad); !strings.Contains(out, "ProtectSystm") {
		t.Fatalf("systemd-analyze did not flag a misspelt directive:\n%s", out)
	}
}

// checkRestarts: a killed agent is restarted promptly and forever. A
// sandbox that kills the agent each time it comes up (where no BPF LSM hook
// refuses a file owner's SIGKILL) must not exhaust a start limit and leave
// the unit failed with no agent: StartLimitIntervalSec=0 in [Unit] turns
// the limit off (in [Service] systemd ignores it).
func checkRestarts(t *testing.T, unit []byte) {
	t.Helper()
	sections := map[string]map[string]string{}
	var cur string
	for _, line := range strings.Split(string(unit), "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]") {
			cur = strings.Trim(line, "[]")
			sections[cur] = map[string]string{}
		} else if k, v, ok := strings.Cut(line, "="); ok && cur != "" && !strings.HasPrefix(line, "#") {
			sections[cur][k] = v
		}
	}
	if v := sections["Unit"]["StartLimitIntervalSec"]; v != "0" {
		t.Errorf("[Unit] StartLimitIntervalSec=%q, want 0: the default (5 starts in 10 s) gives up on an agent killed at each start", v)
	}
	for _, k := range []string{"StartLimitIntervalSec", "StartLimitInterval", "StartLimitBurst"} {
		if _, set := sections["Service"][k]; set {
			t.Errorf("%s in [Service]: it belongs in [Unit]", k)
		}
	}
	if _, set := sections["Unit"]["StartLimitAction"]; set {
		t.Error("StartLimitAction set: no start limit should act")
	}
	if sections["Service"]["Restart"] != "always" {
		t.Errorf("Restart=%q, want always (a SIGKILL is an abnormal end)", sections["Service"]["Restart"])
	}
	d, err := time.ParseDuration(sections["Service"]["RestartSec"])
	if err != nil || d <= 0 || d > 5*time.Second {
		t.Errorf("RestartSec=%q (%v): want a few seconds at most, each death costs that much recording", sections["Service"]["RestartSec"], err)
	}
}

// decodeManifests splits a multi-document manifest and decodes each
// document strictly (unknown or misspelt fields are errors) into its
// Kubernetes API type.
func decodeManifests(t *testing.T, data []byte) []any {
	t.Helper()
	var objs []any
	for i, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(data), -1) {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			t.Fatalf("document %d: %v", i, err)
		}
		var obj any
		switch tm.APIVersion + "/" + tm.Kind {
		case "v1/Namespace":
			obj = &corev1.Namespace{}
		case "v1/ServiceAccount":
			obj = &corev1.ServiceAccount{}
		case "v1/ConfigMap":
			obj = &corev1.ConfigMap{}
		case "apps/v1/DaemonSet":
			obj = &appsv1.DaemonSet{}
		default:
			t.Fatalf("document %d: unexpected %s %s", i, tm.APIVersion, tm.Kind)
		}
		if err := strictDecode([]byte(doc), obj); err != nil {
			t.Fatalf("document %d (%s): %v", i, tm.Kind, err)
		}
		objs = append(objs, obj)
	}
	return objs
}

// strictDecode decodes YAML the way the API server reads JSON: field names
// are case-sensitive, and unknown or duplicate fields are errors.
// (encoding/json, under sigs.k8s.io/yaml's UnmarshalStrict, would accept
// "hostPid" for hostPID.)
func strictDecode(doc []byte, obj any) error {
	js, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return err
	}
	strict, err := kjson.UnmarshalStrict(js, obj)
	if err != nil {
		return err
	}
	if len(strict) > 0 {
		return errors.Join(strict...)
	}
	return nil
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

func TestKubernetesDaemonSet(t *testing.T) {
	data, err := os.ReadFile("kubernetes/daemonset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var ds *appsv1.DaemonSet
	var cm *corev1.ConfigMap
	var sa *corev1.ServiceAccount
	for _, o := range decodeManifests(t, data) {
		switch v := o.(type) {
		case *appsv1.DaemonSet:
			ds = v
		case *corev1.ConfigMap:
			cm = v
		case *corev1.ServiceAccount:
			sa = v
		}
	}
	if ds == nil || cm == nil || sa == nil {
		t.Fatalf("manifest lacks the DaemonSet, ConfigMap or ServiceAccount")
	}

	// Fields the API server requires, checked as its validation does.
	for _, name := range []string{ds.Name, ds.Namespace, cm.Name, sa.Name} {
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			t.Errorf("name %q: %v", name, errs)
		}
	}
	if ds.Spec.Selector == nil || len(ds.Spec.Selector.MatchLabels) == 0 {
		t.Fatal("DaemonSet has no selector")
	}
	sel, err := metav1.LabelSelectorAsSelector(ds.Spec.Selector)
	if err != nil || !sel.Matches(labels.Set(ds.Spec.Template.Labels)) {
		t.Errorf("selector %v does not match the template labels %v (%v)", ds.Spec.Selector, ds.Spec.Template.Labels, err)
	}
	pod := ds.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers", len(pod.Containers))
	}
	c := pod.Containers[0]
	if errs := validation.IsDNS1123Label(c.Name); len(errs) > 0 || c.Image == "" {
		t.Errorf("container name %q (%v) image %q", c.Name, errs, c.Image)
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		if errs := validation.IsDNS1123Label(v.Name); len(errs) > 0 {
			t.Errorf("volume %q: %v", v.Name, errs)
		}
		if _, dup := volumes[v.Name]; dup {
			t.Errorf("volume %q twice", v.Name)
		}
		volumes[v.Name] = v
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		if _, ok := volumes[m.Name]; !ok {
			t.Errorf("mount %s names no volume", m.Name)
		}
		mounts[m.MountPath] = m
	}

	// What the agent needs on a node.
	if !pod.HostPID {
		t.Error("hostPID is off: the agent must see every process")
	}
	if c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
		t.Error("container not privileged")
	}
	for path, hostPath := range map[string]string{
		"/sys/fs/bpf": "/sys/fs/bpf", "/sys/fs/cgroup": "/sys/fs/cgroup", "/run/watcher": "/run/watcher", "/var/lib/watcher": "/var/lib/watcher",
	} {
		m, ok := mounts[path]
		if !ok {
			t.Errorf("no mount at %s", path)
			continue
		}
		v := volumes[m.Name]
		if v.HostPath == nil || v.HostPath.Path != hostPath {
			t.Errorf("mount %s is not the host's %s: %+v", path, hostPath, v.VolumeSource)
		}
		if m.ReadOnly {
			t.Errorf("mount %s is read-only", path)
		}
	}
	if m := mounts["/sys/fs/bpf"]; m.MountPropagation == nil || *m.MountPropagation != corev1.MountPropagationBidirectional {
		t.Error("bpffs mount must propagate (Bidirectional) so pins outlive the pod")
	}
	var metricsPort int32
	for _, p := range c.Ports {
		if p.Name == "metrics" {
			metricsPort = p.ContainerPort
			// With hostNetwork the API server requires hostPort == containerPort.
			if pod.HostNetwork && p.HostPort != 0 && p.HostPort != p.ContainerPort {
				t.Errorf("hostPort %d != containerPort %d under hostNetwork", p.HostPort, p.ContainerPort)
			}
		}
	}
	if metricsPort == 0 {
		t.Fatal("no metrics port")
	}
	for name, pr := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		if pr == nil || pr.Exec == nil || len(pr.Exec.Command) < 2 || filepath.Base(pr.Exec.Command[0]) != "watcher" || pr.Exec.Command[1] != "status" {
			t.Errorf("%s probe is not `watcher status`: %+v", name, pr)
		}
	}
	if lim, ok := c.Resources.Limits[corev1.ResourceMemory]; !ok || lim.IsZero() {
		t.Error("no memory limit")
	}
	// A DaemonSet's pods restart in place: a killed agent comes back.
	if pod.RestartPolicy != "" && pod.RestartPolicy != corev1.RestartPolicyAlways {
		t.Errorf("restartPolicy %q: a killed agent must be restarted", pod.RestartPolicy)
	}
	if sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
		t.Error("the agent needs no API token; it must not be mounted")
	}

	// The policy in the ConfigMap loads, and serves metrics on the port the
	// DaemonSet exposes.
	text, ok := cm.Data["policy.yaml"]
	if !ok {
		t.Fatal("ConfigMap has no policy.yaml")
	}
	p, err := policy.Parse("daemonset.yaml:policy.yaml", []byte(text))
	if err != nil {
		t.Fatalf("shipped policy: %v", err)
	}
	// Pods are chosen by namespace and label, read from containerd's
	// socket, which the DaemonSet mounts where the agent looks.
	var byLabel bool
	for _, sb := range p.Sandboxes {
		byLabel = byLabel || (sb.Select.Labels["io.kubernetes.pod.namespace"] != "" && len(sb.Select.Labels) > 1)
	}
	if !byLabel {
		t.Error("no sandbox selects pods by namespace and label")
	}
	if m, ok := mounts["/run/containerd/containerd.sock"]; !ok || volumes[m.Name].HostPath == nil ||
		volumes[m.Name].HostPath.Path != "/run/containerd/containerd.sock" {
		t.Error("containerd's socket is not mounted for the label selectors")
	}
	_, port, err := net.SplitHostPort(p.Agent.MetricsAddr)
	if err != nil || port != strconv.Itoa(int(metricsPort)) {
		t.Errorf("policy metrics_addr %q, DaemonSet port %d", p.Agent.MetricsAddr, metricsPort)
	}
	if args := strings.Join(c.Args, " "); !strings.Contains(args, "--policy /etc/watcher/policy.yaml") || mounts["/etc/watcher"].Name != "policy" {
		t.Errorf("agent args %q do not load the mounted policy", args)
	}

	// Strict decoding is what makes this a schema check: a misspelt field
	// is an error.
	for _, typo := range [][2]string{
		{"hostPID: true", "hostPid: true"},
		{"mountPropagation: Bidirectional", "propagation: Bidirectional"},
		{"privileged: true", "privileged: yes-please"},
	} {
		bad := bytes.Replace(data, []byte(typo[0]), []byte(typo[1]), 1)
		docs := regexp.MustCompile(`(?m)^---\s*$`).Split(string(bad), -1)
		var ds appsv1.DaemonSet
		if err := strictDecode([]byte(docs[len(docs)-1]), &ds); err == nil {
			t.Errorf("%q accepted", typo[1])
		}
	}
}

func TestExamplePolicyLoads(t *testing.T) {
	p, err := policy.Load("policy/example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	sb := p.Sandbox("coding-agents")
	if sb == nil || p.Sandbox("ops-agent") == nil {
		t.Fatal("example sandboxes missing")
	}
	// Every field of the example is set to something other than the zero
	// value somewhere, so a field dropped from the types fails here.
	if sb.Exec.CircuitBreaker != 3 || len(sb.Egress.Allow[0].Ports) != 2 || sb.DNS.Detection.HighCardinality[0] != "cloudfront.net" ||
		len(p.Agent.DNS.Upstreams) != 1 || sb.Egress.Loopback[0].Port != 11434 ||
		sb.Egress.AdmissionTTLCap.Duration != 5*time.Minute || len(sb.Egress.NamePorts) != 1 || sb.Egress.NamePorts[0].Name != "github.com" ||
		sb.Tools.Tool("shell").Action != "ask" || sb.Tools.Socket.GID != 1000 || sb.Tools.Exchange.OnMatch != "ask" ||
		sb.WorkspaceOptions.MaxSnapshotBytes.Bytes != 2<<30 || sb.Limits.IO[0].ReadIOPS != 2000 || sb.Limits.MemoryHigh.Bytes != 3<<29 {
		t.Errorf("example policy decoded wrongly: %+v", sb)
	}
}
