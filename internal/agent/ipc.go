package agent

import (
	"github.com/watcherhq/watcher/internal/plan"
	"github.com/watcherhq/watcher/internal/policy"
)

// ipcTracking says whether IPC objects need following: some sandbox with
// an overlay workspace (which `watcher workspace rollback` empties) is
// placed by a runtime, and may share the host's IPC namespace and
// /dev/shm. `watcher exec` commands get namespaces of their own; their
// objects die with them.
func ipcTracking(pol *policy.Policy) bool {
	for i := range pol.Sandboxes {
		sb := &pol.Sandboxes[i]
		if sb.WorkspaceOptions.Mode == policy.WorkspaceOverlay &&
			(len(sb.Select.Cgroups) > 0 || len(sb.Select.Globs) > 0 || len(sb.Select.Containers) > 0 || len(sb.Select.Labels) > 0) {
			return true
		}
	}
	return false
}

// ipcWanted says whether p needs the IPC tracepoints (ipcLayer.apply
// attaches them while it does: any syscall tracepoint slows every task of
// the host): for rollbacks, and where the backstop tells a sandbox's own
// System V objects by their creator (no LSM ipc hooks).
func (a *Agent) ipcWanted(p *plan.Plan) bool {
	return ipcTracking(a.pol) || a.backstop.Backstop != nil && p.Backstop.NeedsIPCCreators()
}

// nameIPCRoot records the sandbox of a root cgroup for rollbacks.
func (a *Agent) nameIPCRoot(cg uint64, sandbox string) error {
	if a.ipc.Tracker == nil {
		return nil
	}
	return a.ipc.NameRoot(cg, sandbox)
}
