package agent

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/containers"
	"github.com/watcherhq/watcher/internal/policy"
)

// The sandbox registry: which cgroups belong to which sandbox (the policy's
// exact cgroups, exec parents, and cgroups found later by glob or container
// id), the per-cgroup programs attached to them, and the exec leaves'
// labels.

// registerSandboxes registers every cgroup the policy names exactly, and
// the exec parent of each sandbox (created if missing).
func (a *Agent) registerSandboxes() error {
	for _, sb := range a.pol.Sandboxes {
		for _, cg := range ExecParents(a.pol, &sb) {
			abs, err := cgroupfs.Abs(cg)
			if err != nil {
				return err
			}
			if err := cgroupfs.Create(abs); err != nil {
				return err
			}
			if err := a.addRoot(sb.Name, abs, true); err != nil {
				return err
			}
		}
	}
	return nil
}

// ExecParents returns the cgroups under which `watcher exec` creates leaves
// for a sandbox: its exact cgroups, or ExecCgroup/NAME when it has none.
func ExecParents(p *policy.Policy, sb *policy.Sandbox) []string {
	if len(sb.Select.Cgroups) > 0 {
		return sb.Select.Cgroups
	}
	return []string{filepath.Join(p.Agent.ExecCgroup, sb.Name)}
}

// addRoot registers the cgroup at abs as a root of the named sandbox and
// attaches the per-cgroup programs.
func (a *Agent) addRoot(sandbox, abs string, exact bool) error {
	a.mu.Lock()
	id, ok := a.plan.SandboxIDs[sandbox]
	flags := a.plan.Flags[id]
	a.mu.Unlock()
	if !ok {
		return fmt.Errorf("unknown sandbox %q", sandbox)
	}
	cg, err := a.eng.AddSandbox(abs, id, flags)
	if err != nil {
		return err
	}
	if err := a.nameIPCRoot(cg, sandbox); err != nil {
		return fmt.Errorf("sandbox %s: %w", sandbox, err)
	}
	if _, err := a.cgroups.Attach(abs); err != nil {
		return fmt.Errorf("sandbox %s: %w", sandbox, err)
	}
	a.applyLimits(sandbox, abs)
	if err := a.egress.Attach(abs); err != nil {
		return fmt.Errorf("sandbox %s: %w", sandbox, err)
	}
	a.mu.Lock()
	a.roots[cg] = &root{sandbox: sandbox, id: id, path: abs, exact: exact}
	a.mu.Unlock()
	return nil
}

// pruneRoots unregisters the cgroups the policy no longer names: roots of
// sandboxes that are gone, and exact cgroups dropped from a selector (the
// watcher reports glob and container matches that no longer apply).
func (a *Agent) pruneRoots() {
	want := map[string]bool{}
	for _, sb := range a.pol.Sandboxes {
		for _, cg := range ExecParents(a.pol, &sb) {
			if abs, err := cgroupfs.Abs(cg); err == nil {
				want[sb.Name+"\x00"+abs] = true
			}
		}
	}
	a.mu.Lock()
	var stale []string
	for _, r := range a.roots {
		_, known := a.plan.SandboxIDs[r.sandbox]
		if !known || (r.exact && !want[r.sandbox+"\x00"+r.path]) {
			stale = append(stale, r.path)
		}
	}
	a.mu.Unlock()
	for _, p := range stale {
		a.removeRoot(p)
		a.emit(audit.Event{Kind: audit.KindAgent, Verdict: audit.VerdictRecorded, Severity: audit.SeverityAlert,
			Message: "cgroup " + p + " left the sandboxes with the new policy"})
	}
}

func (a *Agent) removeRoot(abs string) {
	a.mu.Lock()
	var cg uint64
	for id, r := range a.roots {
		if r.path == abs {
			cg = id
		}
	}
	delete(a.roots, cg)
	a.mu.Unlock()
	if cg != 0 {
		a.eng.RemoveSandbox(cg)
		a.cgroups.Detach(cg)
		a.egress.Detach(strconv.FormatUint(cg, 10))
	}
}

// watchTargets turns the policy's globs and container ids into watcher
// targets named after their sandbox.
func (a *Agent) watchTargets() []containers.Target {
	var ts []containers.Target
	for _, sb := range a.pol.Sandboxes {
		for _, g := range sb.Select.Globs {
			if cg, err := containers.CompileGlob(g); err == nil {
				ts = append(ts, containers.Target{Name: sb.Name, Glob: cg})
			}
		}
		for _, ref := range sb.Select.Refs() {
			ts = append(ts, containers.Target{Name: sb.Name, Ref: &ref})
		}
		if len(sb.Select.Labels) > 0 {
			ts = append(ts, containers.Target{Name: sb.Name, Labels: sb.Select.Labels})
		}
		// The leaves `watcher exec` creates, to learn their labels while
		// they exist: events are often read after the leaf is gone.
		for _, parent := range ExecParents(a.pol, &sb) {
			if cg, err := containers.CompileGlob(filepath.Join(parent, "exec-*")); err == nil {
				ts = append(ts, containers.Target{Name: labelTarget + sb.Name, Glob: cg})
			}
		}
	}
	return ts
}

// labelTarget prefixes watcher targets that report exec leaves.
const labelTarget = "label:"

// leafLabel extracts LABEL from a leaf named exec-LABEL-RANDOM.
func leafLabel(name string) string {
	name = strings.TrimPrefix(name, "exec-")
	if i := strings.LastIndexByte(name, '-'); i > 0 {
		name = name[:i]
	}
	return name
}

func (a *Agent) onCgroup(ev containers.Event) {
	if strings.HasPrefix(ev.Target, labelTarget) {
		switch ev.Op {
		case containers.Appeared:
			a.labels.Store(ev.ID, leafLabel(filepath.Base(ev.Path)))
			a.execLeafAppeared(ev.ID)
		case containers.Gone:
			a.execLeafGone(ev.ID)
			// Events of the leaf may still be in the rings: forget later.
			id := ev.ID
			time.AfterFunc(time.Minute, func() { a.labels.Delete(id) })
		}
		return
	}
	switch ev.Op {
	case containers.Appeared:
		err := a.addRoot(ev.Target, ev.Abs, false)
		// After caging: a label lookup must not widen the gap.
		a.noteContainer(ev)
		msg := fmt.Sprintf("cgroup %s joined sandbox %s", ev.Path, ev.Target)
		if err != nil {
			msg = fmt.Sprintf("cgroup %s matched sandbox %s but could not be registered: %v", ev.Path, ev.Target, err)
		}
		a.emit(audit.Event{Kind: audit.KindAgent, Verdict: audit.VerdictRecorded, Sandbox: audit.Sandbox{Name: ev.Target}, Message: msg})
	case containers.Gone:
		a.removeRoot(ev.Abs)
		if ev.Info.ContainerID != "" {
			id := ev.ID
			time.AfterFunc(time.Minute, func() { a.ctrLabels.Delete(id) })
			a.dockerLabels.Forget(ev.Info.ContainerID)
			a.containerdLabels.Forget(ev.Info.ContainerID)
		}
	}
}

// sandboxName maps a kernel sandbox id to its name; it runs per event, so
// it reads a snapshot rebuilt whenever a plan is applied.
func (a *Agent) sandboxName(id uint32) string {
	if names := a.names.Load(); names != nil {
		return (*names)[id]
	}
	return ""
}

// kubeletLabels maps the labels kubelet sets on a container to the
// OpenTelemetry resource attributes events carry as sandbox labels.
var kubeletLabels = map[string]string{
	"io.kubernetes.pod.name":       "k8s.pod.name",
	"io.kubernetes.pod.namespace":  "k8s.namespace.name",
	"io.kubernetes.container.name": "k8s.container.name",
	"io.kubernetes.pod.uid":        "k8s.pod.uid",
}

// noteContainer remembers the identity of a container that joined a
// sandbox, for the enrich stage: its id and, from its runtime labels,
// its pod, namespace and container name.
func (a *Agent) noteContainer(ev containers.Event) {
	if ev.Info.ContainerID == "" {
		return
	}
	id := map[string]string{"container.id": ev.Info.ContainerID}
	if ev.Info.PodUID != "" {
		id["k8s.pod.uid"] = ev.Info.PodUID
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if labels, ok, _ := a.labelSource.Labels(ctx, ev.Info); ok {
		for k, attr := range kubeletLabels {
			if v := labels[k]; v != "" {
				id[attr] = v
			}
		}
	}
	a.ctrLabels.Store(ev.ID, id)
}

// labelError reports a failed label lookup, once per distinct message.
func (a *Agent) labelError(err error) {
	if _, seen := a.labelErrs.LoadOrStore(err.Error(), true); seen {
		return
	}
	a.emit(audit.Event{Kind: audit.KindAgent, Verdict: audit.VerdictRecorded, Severity: audit.SeverityAlert,
		Message: "container labels for sandbox selection: " + err.Error()})
}
