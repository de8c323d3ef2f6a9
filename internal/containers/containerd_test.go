package containers_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	ctrapi "github.com/containerd/containerd/api/services/containers/v1"
	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/containers"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/anypb"
)

// startContainerd runs a private containerd (Debian's) for the test and
// returns its socket.
func startContainerd(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: starts containerd")
	}
	bin, err := exec.LookPath("containerd")
	if err != nil {
		t.Skip("containerd not installed (docker.io depends on it; scripts/setup.sh installs it)")
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, "containerd.sock")
	cfg := fmt.Sprintf("version = 2\nroot = %q\nstate = %q\ndisabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n[grpc]\n  address = %q\n",
		filepath.Join(dir, "root"), filepath.Join(dir, "state"), sock)
	cfgFile := filepath.Join(dir, "config.toml")
	os.WriteFile(cfgFile, []byte(cfg), 0o600)
	log, _ := os.Create(filepath.Join(dir, "containerd.log"))
	cmd := exec.Command(bin, "--config", cfgFile)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait(); log.Close() })
	waitUntil(t, "containerd's socket", func() bool { _, err := os.Stat(sock); return err == nil })
	return sock
}

// createContainer records a container in containerd as the CRI plugin
// would: labels, and the pod sandbox id as an OCI spec annotation.
func createContainer(t *testing.T, client ctrapi.ContainersClient, ns, id string, labels map[string]string, sandbox string) {
	t.Helper()
	spec, _ := json.Marshal(map[string]any{"ociVersion": "1.0.2", "annotations": map[string]string{"io.kubernetes.cri.sandbox-id": sandbox}})
	ctx := metadata.AppendToOutgoingContext(context.Background(), "containerd-namespace", ns)
	_, err := client.Create(ctx, &ctrapi.CreateContainerRequest{Container: &ctrapi.Container{
		ID: id, Labels: labels, Runtime: &ctrapi.Container_Runtime{Name: "io.containerd.runc.v2"},
		Spec: &anypb.Any{TypeUrl: "types.containerd.io/opencontainers/runtime-spec/1/Spec", Value: spec}}})
	if err != nil {
		t.Fatalf("create container %s: %v", id, err)
	}
}

func hexID(c byte) string {
	b := make([]byte, 64)
	for i := range b {
		b[i] = c
	}
	return string(b)
}

// TestContainerdLabelTargets: containers recorded in a real containerd
// with the labels kubelet's CRI calls leave (container labels, pod labels
// on the sandbox) are selected by pod namespace and a pod label when
// their cgroup (ctr's cgroupfs naming, /NAMESPACE/ID) appears; one of
// another namespace is not.
func TestContainerdLabelTargets(t *testing.T) {
	sock := startContainerd(t)
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := ctrapi.NewContainersClient(conn)
	ns := "wtest" + fmt.Sprint(os.Getpid()%100000)
	pod, ctr, pod2, other := hexID('a'), hexID('b'), hexID('c'), hexID('d')
	createContainer(t, client, ns, pod, map[string]string{"io.cri-containerd.kind": "sandbox", "app": "coder",
		"io.kubernetes.pod.namespace": "agents", "io.kubernetes.pod.name": "coder-0"}, pod)
	createContainer(t, client, ns, ctr, map[string]string{"io.cri-containerd.kind": "container",
		"io.kubernetes.pod.namespace": "agents", "io.kubernetes.pod.name": "coder-0", "io.kubernetes.container.name": "agent"}, pod)
	createContainer(t, client, ns, pod2, map[string]string{"io.cri-containerd.kind": "sandbox", "app": "coder",
		"io.kubernetes.pod.namespace": "other"}, pod2)
	createContainer(t, client, ns, other, map[string]string{"io.cri-containerd.kind": "container",
		"io.kubernetes.pod.namespace": "other", "io.kubernetes.container.name": "agent"}, pod2)

	root, err := cgroupfs.Mountpoint()
	if err != nil {
		t.Skipf("no cgroup2 hierarchy: %v", err)
	}
	nsDir := filepath.Join(root, ns)
	if err := os.Mkdir(nsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		os.Remove(filepath.Join(nsDir, ctr))
		os.Remove(filepath.Join(nsDir, other))
		os.Remove(nsDir)
	})
	src := &containers.ContainerdLabels{Socket: sock}
	defer src.Close()
	var mu sync.Mutex
	var got []containers.Event
	var errs []error
	w, err := containers.NewWatcher(containers.WatcherConfig{
		Targets: []containers.Target{{Name: "agents", Labels: map[string]string{"io.kubernetes.pod.namespace": "agents", "app": "coder"}}},
		Labels:  containers.Runtimes{&containers.DockerLabels{Socket: filepath.Join(t.TempDir(), "no-docker.sock")}, src},
		OnError: func(err error) { mu.Lock(); errs = append(errs, err); mu.Unlock() },
		OnEvent: func(ev containers.Event) { mu.Lock(); got = append(got, ev); mu.Unlock() },
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	time.Sleep(200 * time.Millisecond)
	for _, id := range []string{other, ctr} {
		if err := os.Mkdir(filepath.Join(nsDir, id), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, "the agents container reported", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) > 0
	})
	time.Sleep(200 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1 || got[0].Info.ContainerID != ctr || got[0].Info.Namespace != ns || got[0].Target != "agents" {
		t.Fatalf("events %+v, want the agents container alone", got)
	}
	l, ok, err := src.Labels(context.Background(), got[0].Info)
	if err != nil || !ok || l["app"] != "coder" || l["io.kubernetes.container.name"] != "agent" || l["io.cri-containerd.kind"] != "container" {
		t.Fatalf("labels %v %v %v: want the container's over its pod's", l, ok, err)
	}
	if len(errs) > 0 {
		t.Errorf("lookups failed: %v", errs)
	}
}
