// Package containers maps container runtimes' ids to cgroup v2 paths and
// notices matching cgroups that appear later.
//
// Resolution relies only on the cgroup names the runtimes document, so it
// needs no runtime socket or API:
//
//	Docker, systemd driver      /system.slice/docker-<id>.scope
//	Docker, cgroupfs driver     /docker/<id>
//	containerd (ctr, cgroupfs)  /<namespace>/<id>          e.g. /default/<id>
//	nerdctl, systemd driver     /system.slice/nerdctl-<id>.scope
//	Kubernetes, systemd driver  /kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid, '-' as '_'>.slice/<container>
//	                            (Guaranteed pods: /kubepods.slice/kubepods-pod<uid>.slice/<container>)
//	  containerd container      cri-containerd-<id>.scope
//	  CRI-O container           crio-<id>.scope   (conmon: crio-conmon-<id>.scope)
//	  Docker (cri-dockerd)      docker-<id>.scope
//	Kubernetes, cgroupfs driver /kubepods/<qos>/pod<uid>/<container>
//	                            (Guaranteed pods: /kubepods/pod<uid>/<container>)
//	  containerd or Docker      <id>
//	  CRI-O container           crio-<id>
//
// where <qos> is burstable or besteffort. Kubelets configured with another
// cgroup root (kind nodes, k3s) put the same names below it, so resolution
// looks for the names anywhere in the hierarchy, not only at these paths.
package containers

import (
	"fmt"
	"regexp"
	"strings"
)

// Runtime names a container runtime as it appears in runtime-qualified ids
// (Kubernetes' containerStatuses[].containerID uses the same prefixes).
type Runtime string

// Supported runtimes.
const (
	Docker     Runtime = "docker"
	Containerd Runtime = "containerd"
	CRIO       Runtime = "cri-o"
)

// Driver is the cgroup manager that named a cgroup.
type Driver string

// Cgroup drivers.
const (
	DriverSystemd  Driver = "systemd"
	DriverCgroupfs Driver = "cgroupfs"
)

// QoS is a Kubernetes pod's quality-of-service class.
type QoS string

// Kubernetes QoS classes.
const (
	QoSGuaranteed QoS = "guaranteed"
	QoSBurstable  QoS = "burstable"
	QoSBestEffort QoS = "besteffort"
)

// Info is what a cgroup's path says about the container or pod in it.
type Info struct {
	// Runtime that created the container cgroup. Empty when the name does
	// not tell (a bare id inside a cgroupfs-driver pod can be containerd's
	// or Docker's).
	Runtime Runtime `json:"runtime,omitempty"`
	// ContainerID is the full container id, empty for a pod-level cgroup.
	ContainerID string `json:"container_id,omitempty"`
	// PodUID is the Kubernetes pod uid (with dashes), empty outside pods.
	PodUID string `json:"pod_uid,omitempty"`
	// QoS is the pod's QoS class, empty outside pods.
	QoS QoS `json:"qos,omitempty"`
	// Driver is the cgroup driver whose naming the path follows.
	Driver Driver `json:"driver,omitempty"`
	// Namespace is the containerd namespace for ctr-style cgroupfs paths.
	Namespace string `json:"namespace,omitempty"`
}

var (
	fullID         = regexp.MustCompile(`^[0-9a-f]{64}$`)
	systemdScope   = regexp.MustCompile(`^(docker|cri-containerd|crio|nerdctl)-([0-9a-f]{64})\.scope$`)
	crioCgroupfs   = regexp.MustCompile(`^crio-([0-9a-f]{64})$`)
	systemdPod     = regexp.MustCompile(`^(?:[a-z0-9]+-)?kubepods(?:-(burstable|besteffort))?-pod([0-9a-f_]{36})\.slice$`)
	cgroupfsPod    = regexp.MustCompile(`^pod([0-9a-f-]{36})$`)
	podUIDPattern  = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	scopeRuntimeOf = map[string]Runtime{
		"docker":         Docker,
		"cri-containerd": Containerd,
		"crio":           CRIO,
		"nerdctl":        Containerd,
	}
)

// Identify reads the runtime naming in a cgroup path relative to the
// hierarchy root ("/kubepods.slice/.../cri-containerd-<id>.scope"). It
// reports false when the path names neither a container nor a pod.
func Identify(rel string) (Info, bool) {
	parts := splitPath(rel)
	if len(parts) == 0 {
		return Info{}, false
	}
	var info Info
	podAt := -1
	for i, p := range parts {
		if m := systemdPod.FindStringSubmatch(p); m != nil && strings.Contains(parentOf(parts, i), "kubepods") {
			info.PodUID = strings.ReplaceAll(m[2], "_", "-")
			info.QoS = qosOf(m[1])
			info.Driver = DriverSystemd
			podAt = i
		} else if m := cgroupfsPod.FindStringSubmatch(p); m != nil && podUIDPattern.MatchString(m[1]) {
			parent := parentOf(parts, i)
			grand := ""
			if i >= 2 {
				grand = parts[i-2]
			}
			switch {
			case parent == "kubepods":
				info.QoS = QoSGuaranteed
			case (parent == "burstable" || parent == "besteffort") && grand == "kubepods":
				info.QoS = qosOf(parent)
			default:
				continue
			}
			info.PodUID = m[1]
			info.Driver = DriverCgroupfs
			podAt = i
		}
	}
	last := parts[len(parts)-1]
	switch {
	case systemdScope.MatchString(last):
		m := systemdScope.FindStringSubmatch(last)
		info.Runtime = scopeRuntimeOf[m[1]]
		info.ContainerID = m[2]
		info.Driver = DriverSystemd
		return info, true
	case crioCgroupfs.MatchString(last):
		info.Runtime = CRIO
		info.ContainerID = crioCgroupfs.FindStringSubmatch(last)[1]
		info.Driver = DriverCgroupfs
		return info, true
	case fullID.MatchString(last):
		info.ContainerID = last
		info.Driver = DriverCgroupfs
		parent := parentOf(parts, len(parts)-1)
		switch {
		case podAt == len(parts)-2:
			// Inside a pod both containerd and Docker use the bare id.
		case parent == "docker" && len(parts) == 2:
			info.Runtime = Docker
		case len(parts) == 2:
			info.Runtime = Containerd
			info.Namespace = parent
		default:
			return Info{}, false
		}
		return info, true
	case podAt == len(parts)-1:
		return info, true
	}
	return Info{}, false
}

func qosOf(s string) QoS {
	switch s {
	case "burstable":
		return QoSBurstable
	case "besteffort":
		return QoSBestEffort
	}
	return QoSGuaranteed
}

func parentOf(parts []string, i int) string {
	if i == 0 {
		return ""
	}
	return parts[i-1]
}

func splitPath(rel string) []string {
	var out []string
	for _, p := range strings.Split(rel, "/") {
		if p != "" && p != "." {
			out = append(out, p)
		}
	}
	return out
}

// ContainerPaths returns the cgroup paths, relative to the hierarchy root,
// where the runtime puts a container with this full id outside Kubernetes
// (inside a pod the path depends on the pod uid: Resolve searches for it).
func ContainerPaths(rt Runtime, id string) []string {
	switch rt {
	case Docker:
		return []string{"/system.slice/docker-" + id + ".scope", "/docker/" + id}
	case Containerd:
		return []string{"/system.slice/nerdctl-" + id + ".scope", "/default/" + id, "/k8s.io/" + id}
	}
	// CRI-O runs only Kubernetes pods.
	return nil
}

// PodPaths returns the pod cgroup paths (relative to the hierarchy root)
// Kubernetes uses for a pod uid under the default cgroup root, for both
// drivers and every QoS class.
func PodPaths(uid string) []string {
	u := strings.ReplaceAll(uid, "-", "_")
	return []string{
		"/kubepods.slice/kubepods-pod" + u + ".slice",
		"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + u + ".slice",
		"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + u + ".slice",
		"/kubepods/pod" + uid,
		"/kubepods/burstable/pod" + uid,
		"/kubepods/besteffort/pod" + uid,
	}
}

// Ref names a container (or a Kubernetes pod) the way runtimes and
// Kubernetes print it: "docker://<id>", "containerd://<id>",
// "cri-o://<id>", or "pod://<uid>".
type Ref struct {
	// Runtime is empty for a pod reference.
	Runtime Runtime
	// ID is the container id (12 to 64 lowercase hex digits; a prefix of at
	// least 12 digits, as `docker ps` shows, is accepted) or the pod uid.
	ID string
	// Pod is set for pod:// references.
	Pod bool
}

// String returns the runtime-qualified form.
func (r Ref) String() string {
	if r.Pod {
		return "pod://" + r.ID
	}
	return string(r.Runtime) + "://" + r.ID
}

var shortID = regexp.MustCompile(`^[0-9a-f]{12,64}$`)

// ParseRef parses a runtime-qualified container id or pod:// uid.
func ParseRef(s string) (Ref, error) {
	scheme, id, ok := strings.Cut(s, "://")
	if !ok {
		return Ref{}, fmt.Errorf("container id %q: want runtime://id (docker, containerd, cri-o) or pod://uid", s)
	}
	switch scheme {
	case "pod":
		if !podUIDPattern.MatchString(id) {
			return Ref{}, fmt.Errorf("pod uid %q: want a lowercase UUID", id)
		}
		return Ref{ID: id, Pod: true}, nil
	case "docker", "containerd", "cri-o", "crio":
		if scheme == "crio" {
			scheme = string(CRIO)
		}
		if !shortID.MatchString(id) {
			return Ref{}, fmt.Errorf("container id %q: want 12 to 64 lowercase hex digits", id)
		}
		return Ref{Runtime: Runtime(scheme), ID: id}, nil
	}
	return Ref{}, fmt.Errorf("container id %q: unknown runtime %q (want docker, containerd, cri-o or pod)", s, scheme)
}

// Matches reports whether a cgroup described by info is the referenced
// container or pod. Container ids match by prefix.
func (r Ref) Matches(info Info) bool {
	if r.Pod {
		return info.PodUID == r.ID && info.ContainerID == ""
	}
	if info.ContainerID == "" || !strings.HasPrefix(info.ContainerID, r.ID) {
		return false
	}
	if info.Runtime == "" {
		return r.Runtime == Docker || r.Runtime == Containerd
	}
	return info.Runtime == r.Runtime
}
