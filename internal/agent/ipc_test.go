package agent

import (
	"testing"

	"github.com/watcherhq/watcher/internal/policy"
)

// TestIPCTracking: the IPC tracepoints are wanted only for a sandbox with
// an overlay workspace that a runtime places (cgroups, globs, containers);
// watcher exec commands have IPC namespaces of their own.
func TestIPCTracking(t *testing.T) {
	overlay := policy.WorkspaceOptions{Mode: policy.WorkspaceOverlay}
	for _, c := range []struct {
		name string
		sb   policy.Sandbox
		want bool
	}{
		{"exec only, overlay", policy.Sandbox{Name: "a", WorkspaceOptions: overlay}, false},
		{"runtime cgroup, no overlay", policy.Sandbox{Name: "a", Select: policy.Selector{Cgroups: []string{"/x"}}}, false},
		{"runtime cgroup, overlay", policy.Sandbox{Name: "a", WorkspaceOptions: overlay, Select: policy.Selector{Cgroups: []string{"/x"}}}, true},
		{"glob, overlay", policy.Sandbox{Name: "a", WorkspaceOptions: overlay, Select: policy.Selector{Globs: []string{"/docker/*"}}}, true},
		{"container, overlay", policy.Sandbox{Name: "a", WorkspaceOptions: overlay, Select: policy.Selector{Containers: []string{"docker://x"}}}, true},
	} {
		if got := ipcTracking(&policy.Policy{Sandboxes: []policy.Sandbox{c.sb}}); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
