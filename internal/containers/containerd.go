package containers

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"

	ctrapi "github.com/containerd/containerd/api/services/containers/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// DefaultContainerdSocket is containerd's usual API socket.
const DefaultContainerdSocket = "/run/containerd/containerd.sock"

// sandboxIDAnnotation is the OCI annotation containerd's CRI plugin puts on
// a Kubernetes container's spec: the id of its pod's sandbox container,
// whose labels are the pod's labels.
const sandboxIDAnnotation = "io.kubernetes.cri.sandbox-id"

// ContainerdLabels reads labels from containerd's API (the containers
// service) on its socket. For a CRI container (namespace k8s.io) the
// labels are kubelet's container labels merged over its pod's labels
// (those of the pod's sandbox container), so selectors can name pod
// labels. Labels are cached by id.
type ContainerdLabels struct {
	// Socket is containerd's API socket (default DefaultContainerdSocket).
	Socket string
	// Namespaces are searched in order when the cgroup name does not say
	// (default k8s.io, moby, default).
	Namespaces []string

	once    sync.Once
	conn    *grpc.ClientConn
	client  ctrapi.ContainersClient
	initErr error
	mu      sync.Mutex
	cache   map[string]map[string]string
}

func (c *ContainerdLabels) init() {
	if c.Socket == "" {
		c.Socket = DefaultContainerdSocket
	}
	if len(c.Namespaces) == 0 {
		c.Namespaces = []string{"k8s.io", "moby", "default"}
	}
	c.cache = map[string]map[string]string{}
	c.conn, c.initErr = grpc.NewClient("unix://"+c.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if c.initErr == nil {
		c.client = ctrapi.NewContainersClient(c.conn)
	}
}

// Labels implements LabelSource for containerd containers (and bare ids
// whose runtime the cgroup name does not tell).
func (c *ContainerdLabels) Labels(ctx context.Context, info Info) (map[string]string, bool, error) {
	c.once.Do(c.init)
	if c.initErr != nil {
		return nil, false, fmt.Errorf("containerd labels: %w", c.initErr)
	}
	if info.ContainerID == "" || (info.Runtime != Containerd && info.Runtime != "") {
		return nil, false, nil
	}
	c.mu.Lock()
	l, ok := c.cache[info.ContainerID]
	c.mu.Unlock()
	if ok {
		return l, true, nil
	}
	nss := c.Namespaces
	if info.Namespace != "" {
		nss = []string{info.Namespace}
	}
	for _, ns := range nss {
		ctr, err := c.get(ctx, ns, info.ContainerID)
		if err != nil {
			return nil, false, err
		}
		if ctr == nil {
			continue
		}
		l = map[string]string{}
		if sb := sandboxOf(ctr); sb != "" && sb != ctr.ID {
			if pod, err := c.get(ctx, ns, sb); err == nil && pod != nil {
				for k, v := range pod.Labels {
					l[k] = v
				}
			}
		}
		for k, v := range ctr.Labels {
			l[k] = v
		}
		c.mu.Lock()
		c.cache[info.ContainerID] = l
		c.mu.Unlock()
		return l, true, nil
	}
	return nil, false, nil
}

// get returns the container, nil when the namespace does not hold it.
func (c *ContainerdLabels) get(ctx context.Context, ns, id string) (*ctrapi.Container, error) {
	ctx = metadata.AppendToOutgoingContext(ctx, "containerd-namespace", ns)
	resp, err := c.client.Get(ctx, &ctrapi.GetContainerRequest{ID: id})
	if status.Code(err) == codes.NotFound {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("containerd labels of %.12s: %w", id, err)
	}
	return resp.Container, nil
}

// sandboxOf reads the pod sandbox id from the container's OCI spec.
func sandboxOf(c *ctrapi.Container) string {
	if c.Spec == nil {
		return ""
	}
	var spec struct {
		Annotations map[string]string `json:"annotations"`
	}
	if json.Unmarshal(c.Spec.Value, &spec) != nil {
		return ""
	}
	return spec.Annotations[sandboxIDAnnotation]
}

// Forget drops a container's cached labels (it is gone).
func (c *ContainerdLabels) Forget(id string) {
	c.once.Do(c.init)
	c.mu.Lock()
	delete(c.cache, id)
	c.mu.Unlock()
}

// Close closes the connection.
func (c *ContainerdLabels) Close() error {
	if c.conn != nil {
		return c.conn.Close()
	}
	return nil
}

// Runtimes tries label sources in order: the first that knows the
// container answers.
type Runtimes []LabelSource

// Labels implements LabelSource.
func (rs Runtimes) Labels(ctx context.Context, info Info) (map[string]string, bool, error) {
	var errs []error
	for _, r := range rs {
		l, ok, err := r.Labels(ctx, info)
		if ok {
			return l, true, nil
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return nil, false, errs[0]
	}
	return nil, false, nil
}
