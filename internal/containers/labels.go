package containers

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"
)

// LabelSource reads a container's labels from its runtime. For a
// Kubernetes container the labels include those kubelet sets
// (io.kubernetes.pod.namespace, io.kubernetes.pod.name,
// io.kubernetes.container.name, io.kubernetes.pod.uid).
type LabelSource interface {
	// Labels returns the labels of the container info names; ok is false
	// when the source does not know the container (another runtime).
	Labels(ctx context.Context, info Info) (labels map[string]string, ok bool, err error)
}

// DockerLabels reads labels from dockerd's Engine API on its unix socket.
// A container's labels never change, so they are cached by id.
type DockerLabels struct {
	// Socket is dockerd's API socket (default /var/run/docker.sock).
	Socket string

	once   sync.Once
	client *http.Client
	mu     sync.Mutex
	cache  map[string]map[string]string
}

// DefaultDockerSocket is dockerd's usual API socket.
const DefaultDockerSocket = "/var/run/docker.sock"

func (d *DockerLabels) init() {
	if d.Socket == "" {
		d.Socket = DefaultDockerSocket
	}
	sock := d.Socket
	d.client = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var dl net.Dialer
			return dl.DialContext(ctx, "unix", sock)
		}}}
	d.cache = map[string]map[string]string{}
}

// Labels implements LabelSource for Docker containers (and bare ids
// whose runtime the cgroup name does not tell).
func (d *DockerLabels) Labels(ctx context.Context, info Info) (map[string]string, bool, error) {
	d.once.Do(d.init)
	if info.ContainerID == "" || (info.Runtime != Docker && info.Runtime != "") {
		return nil, false, nil
	}
	d.mu.Lock()
	l, ok := d.cache[info.ContainerID]
	d.mu.Unlock()
	if ok {
		return l, true, nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://docker/containers/"+url.PathEscape(info.ContainerID)+"/json", nil)
	if err != nil {
		return nil, false, err
	}
	resp, err := d.client.Do(req)
	if err != nil {
		return nil, false, fmt.Errorf("docker labels of %.12s: %w", info.ContainerID, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return nil, false, nil
	}
	if resp.StatusCode != http.StatusOK {
		return nil, false, fmt.Errorf("docker labels of %.12s: %s", info.ContainerID, resp.Status)
	}
	var c struct {
		Name   string
		Config struct{ Labels map[string]string }
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4<<20)).Decode(&c); err != nil {
		return nil, false, fmt.Errorf("docker labels of %.12s: %w", info.ContainerID, err)
	}
	l = c.Config.Labels
	if l == nil {
		l = map[string]string{}
	}
	d.mu.Lock()
	d.cache[info.ContainerID] = l
	d.mu.Unlock()
	return l, true, nil
}

// Forget drops a container's cached labels (it is gone).
func (d *DockerLabels) Forget(id string) {
	d.once.Do(d.init)
	d.mu.Lock()
	delete(d.cache, id)
	d.mu.Unlock()
}

// MatchLabels reports whether labels has every key of want with its
// value; a wanted value "*" only needs the key.
func MatchLabels(want, labels map[string]string) bool {
	for k, v := range want {
		got, ok := labels[k]
		if !ok || (v != "*" && got != v) {
			return false
		}
	}
	return true
}
