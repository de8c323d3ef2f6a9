package agent

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/control"
	"github.com/watcherhq/watcher/internal/plan"
	"github.com/watcherhq/watcher/internal/policy"
)

// The control handler (control.Handler, served on the control socket) and
// the accessors the commands use: status, reload, thaw (escape.go), the
// first watcher exec's PrepareExec.

// Layers says which mechanism enforces each rule on this host.
func (a *Agent) Layers() []control.Layer {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.plan.Layers
}

// DNSAddr is where the DNS proxy listens.
func (a *Agent) DNSAddr() netip.AddrPort { return a.dnsAddr }

// Policy returns the policy in force.
func (a *Agent) Policy() *policy.Policy {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.pol
}

// Plan returns the compiled policy in force.
func (a *Agent) Plan() *plan.Plan {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.plan
}

// PrepareExec makes sure refusals by the seccomp filter and Landlock
// ruleset of `watcher exec` are recorded before a command runs
// (control.Handler): it attaches the sys_enter/sys_exit tracepoints when
// they are not attached; they are detached again once no command has run
// for a while (recording.go).
func (a *Agent) PrepareExec() error {
	a.exec.lastPrepare.Store(time.Now().UnixNano())
	if err := a.syncRecording(); err != nil {
		return fmt.Errorf("record exec denials: %w", err)
	}
	return nil
}

// Reload rereads the policy file. A policy that does not load or compile is
// refused and the one in force stays (control.Handler, SIGHUP; changes to
// the file are picked up by the reloader on their own).
func (a *Agent) Reload() error {
	if a.reloader == nil {
		return errors.New("no policy file to reload (running on the built-in default)")
	}
	_, changed, err := a.reloader.Reload()
	if err != nil {
		a.refused(err)
		return fmt.Errorf("reload refused, previous policy stays: %w", err)
	}
	if !changed {
		return nil
	}
	a.mu.Lock()
	err = a.applyErr
	a.mu.Unlock()
	return err
}

func (a *Agent) refused(err error) {
	a.emit(audit.Event{Kind: audit.KindAgent, Verdict: audit.VerdictRecorded, Severity: audit.SeverityAlert,
		Message: "policy reload refused, the previous policy stays: " + err.Error()})
}

// Status reports the agent's health (control.Handler).
func (a *Agent) Status() control.Status {
	ks := Kernel()
	st := a.lsmStatus()
	ks.BPFLSM = a.lsm.LSM != nil && anyLoaded(st)
	if a.lsm.LSM != nil {
		ks.LSMLayer = map[string]int{}
		for _, m := range a.lsm.Mechanisms() {
			ks.LSMLayer[m]++
		}
	}
	if !ks.BPFLSM {
		ks.BPFLSMWhy = bpfLSMReason(ks.LSMList, firstErr(st))
	} else {
		ks.BPFLSMWhy = ""
	}
	// Events and losses are the pipeline's counts, the ones /metrics exports.
	s := control.Status{PID: os.Getpid(), Started: a.started, Version: Version, Kernel: ks,
		Losses: a.metrics.LossesByStage(), Policy: a.opts.PolicyPath}
	for _, x := range a.exporters {
		st := x.Stats()
		s.Exports = append(s.Exports, control.ExportStatus{Name: x.Name(), Endpoint: x.Endpoint(), Sent: st.Sent,
			Queued: st.Queued, Filtered: st.Filtered, Throttled: st.Throttled, Dropped: st.Dropped,
			Rejected: st.Rejected, Failures: st.Failures, LastError: st.LastError})
	}
	events := a.metrics.EventsBySandbox()
	a.mu.Lock()
	s.Layers, s.Missing = append(append([]control.Layer(nil), a.plan.Layers...), limitLayers(a.pol)...), a.plan.Missing
	for cg, r := range a.roots {
		ss := control.SandboxStatus{Name: r.sandbox, CgroupID: cg, Path: r.path, Mode: "enforce", Events: map[string]uint64{}}
		if sb := a.pol.Sandbox(r.sandbox); sb != nil && sb.Mode != "" {
			ss.Mode = string(sb.Mode)
		}
		for v, n := range events[r.sandbox] {
			ss.Events[string(v)] = n
		}
		ss.Frozen = a.frozen.any(r.sandbox)
		if id, ok := a.ctrLabels.Load(cg); ok {
			ss.Member = maps.Clone(id.(map[string]string))
		}
		ss.Canary = a.canaryReport(r.sandbox)
		ss.Usage = rootUsage(a.pol, a.pol.Sandbox(r.sandbox), r.path)
		ss.Posture = a.posture.recorded(r.path)
		s.Sandboxes = append(s.Sandboxes, ss)
	}
	dir := a.pol.Agent.LedgerDir
	a.mu.Unlock()
	// The scorer calls back into the agent for limits: no lock held here.
	for i := range s.Sandboxes {
		s.Sandboxes[i].Escape = a.escape.Score(s.Sandboxes[i].Name)
	}
	ls := a.ledger.Stats()
	seq, hash := a.ledger.Head()
	s.Ledger = control.LedgerStatus{Dir: dir, Records: ls.Records, HeadSeq: seq, HeadHash: hash.String(), WriteFailures: ls.WriteFailures}
	if cp := a.ledger.LastCheckpoint(); cp != nil {
		s.Ledger.LastCheckpoint = cp.Time
	}
	return s
}

// lsmStatus is the LSM load status; without loaded LSM programs, the
// probe made at start (probing loads programs: not on every status call).
func (a *Agent) lsmStatus() map[string]error { return a.lsm.hookStatus() }

// lsmMechanisms is lsmStatus's companion: the mechanism per hook.
func (a *Agent) lsmMechanisms() map[string]string { return a.lsm.hookMechanisms() }
