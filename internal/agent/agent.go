// Package agent ties watcher's parts into the running agent: it writes the
// plan (internal/plan) into each enforcement layer, loads and pins the BPF programs (or
// adopts a previous agent's pins), registers the sandbox cgroups (including
// ones that appear later), runs the DNS proxy, and fans every event out to
// the ledger, the live tail, Prometheus and the escape watch.
//
// The package never logs: what an operator must see becomes an event of
// kind "agent" (which reaches the ledger and the tail), and Start returns the
// enforcement layers so the command can print them.
package agent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/containers"
	"github.com/watcherhq/watcher/internal/control"
	"github.com/watcherhq/watcher/internal/dnsproxy"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/backstop"
	"github.com/watcherhq/watcher/internal/enforce/egress/dnsbind"
	"github.com/watcherhq/watcher/internal/enforce/recorder"
	"github.com/watcherhq/watcher/internal/escape"
	"github.com/watcherhq/watcher/internal/gateway"
	"github.com/watcherhq/watcher/internal/launch/ia32"
	"github.com/watcherhq/watcher/internal/ledger"
	"github.com/watcherhq/watcher/internal/metrics"
	"github.com/watcherhq/watcher/internal/namerelay"
	"github.com/watcherhq/watcher/internal/otlpexport"
	"github.com/watcherhq/watcher/internal/pipeline"
	"github.com/watcherhq/watcher/internal/plan"
	"github.com/watcherhq/watcher/internal/policy"
	"github.com/watcherhq/watcher/internal/tail"
	"github.com/watcherhq/watcher/internal/witness"
)

// Version is reported in status and the agent's start record.
var Version = "dev"

// Options configure an agent beyond its policy.
type Options struct {
	// PolicyPath is the policy file; empty means the built-in default.
	PolicyPath string
	// Policy, when set, is used instead of reading PolicyPath (tests, demo).
	Policy *policy.Policy
	// RequireLSM refuses to start when a blocking rule has no BPF LSM
	// program to enforce it (also settable in the policy).
	RequireLSM bool
	// OnEvent, when set, sees every event after the fan-out (the command
	// logs agent events with it).
	OnEvent func(audit.Event)
	// RecordExecDenials attaches the recording of seccomp and Landlock
	// refusals at start instead of at the first PrepareExec (a private
	// agent started by `watcher exec`).
	RecordExecDenials bool
	// Containers are extra runtime-qualified container ids (docker://ID,
	// containerd://ID, cri-o://ID, pod://UID) added to the first sandbox's
	// selectors, so `watcher run --container ID` cages a container without
	// editing the policy. They survive reloads.
	Containers []string
	// NoCanary turns the canary off (private `watcher exec` agents: each
	// command would pay for a run).
	NoCanary bool
}

// Agent is a running watcher agent.
type Agent struct {
	opts    Options
	started time.Time

	mu sync.Mutex // guards policy, plan, sandboxes
	// applyMu serialises writing rules into the layers (a reload, and
	// inode entries following the files: inodewatch.go).
	applyMu sync.Mutex
	inodes  *inodeWatch
	pol     *policy.Policy
	plan    *plan.Plan
	rules   *plan.RuleTable
	roots   map[uint64]*root // registered sandbox roots by cgroup id
	labels  sync.Map         // cgroup id -> leaf label (watcher exec)

	eng    *enforce.Engine
	reader *enforce.Reader
	layers // the BPF program groups (layers.go)

	sigSeen    sync.Map    // syscall.Signal -> uint64: operator-sent count already seen
	sigCounted atomic.Bool // the kernel counts the operator's signals (watchSignals)
	dns        *dnsproxy.Server
	dnsAddr    netip.AddrPort
	dnsAddr6   netip.AddrPort
	// Name binding (names.go).
	relay       *namerelay.Relay
	relayErr    error
	relayPols   atomic.Pointer[map[uint32]*namerelay.Policy]
	answers     *namerelay.Answers
	netnsCookie uint64
	netns       netnsState // listeners in sandboxes' own network namespaces (netns.go)
	casMu       sync.Mutex
	cas         map[string]*namerelay.CA // credential-broker CA per sandbox name

	ledger   *ledger.Ledger
	cosigner *witness.Cosigner // nil without witnesses
	// dockerLabels and containerdLabels read containers' labels for
	// label selectors (labelSource tries both); ctrLabels maps a container sandbox root's cgroup id to the
	// container and Kubernetes identity its events carry.
	dockerLabels     *containers.DockerLabels
	containerdLabels *containers.ContainerdLabels
	labelSource      containers.LabelSource
	ctrLabels        sync.Map
	labelErrs        sync.Map
	// exporters send the ledger's records over OTLP (agent.export).
	exporters []*otlpexport.Exporter
	pipe      *pipeline.Pipeline
	tail      *tail.Server
	metrics   *metrics.Metrics
	bpfStats  *metrics.BPFStats
	httpSrv   *http.Server
	control   *control.Server
	gateway   *gateway.Manager
	escape    *escape.Scorer
	watcher   *containers.Watcher

	reloader  *policy.Reloader
	applyErr  error                             // of the last policy applied by the reloader
	names     atomic.Pointer[map[uint32]string] // sandbox id -> name, per plan
	prepMu    sync.Mutex
	frozen    frozenLeaves
	canary    canaryState
	startup   *startupClock
	leaves    sync.Map // process cgroup id -> leafInfo (escape watch)
	leafCount atomic.Int64
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	stopOnce  sync.Once
	stopErr   error

	life    *life        // the life file and a predecessor's death (gap.go)
	exec    execActivity // watcher exec commands running (recording.go)
	posture postureWatch // each root's hardening (posture.go)
}

type root struct {
	sandbox string
	id      uint32
	path    string
	exact   bool // named by the policy (not found by a glob or container id)
}

// Start brings the agent up. On error everything started is stopped again;
// pins of a previous agent are left in place (enforcement continues).
func Start(ctx context.Context, opts Options) (a *Agent, err error) {
	pol, reloader, err := startPolicy(opts)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	a = &Agent{opts: opts, started: now, pol: pol, rules: plan.NewRuleTable(), roots: map[uint64]*root{}, reloader: reloader,
		canary: newCanaryState(), startup: newStartupClock(now)}
	// What the layers call back into the agent for.
	a.egress.dirs, a.egress.notify = dnsbind.NewDirectory(), a.emit
	a.ipc.wanted, a.backstop.onMount = a.ipcWanted, a.onMountKill
	ctx, a.cancel = context.WithCancel(ctx)
	defer func() {
		if err != nil {
			a.Stop()
			a = nil
		}
	}()
	if _, err := MountPseudoFS(); err != nil {
		return a, err
	}
	if err := CheckCapabilities(); err != nil {
		return a, err
	}
	oomWas, oomLowered, oomErr := lowerOOMScore("/proc/self/oom_score_adj", agentOOMScoreAdj)
	ag := pol.Agent

	// Sinks first, so nothing the layers report is lost.
	if a.ledger, err = ledger.Open(ag.LedgerDir, ledgerOptions(pol)); err != nil {
		return a, fmt.Errorf("open ledger: %w", err)
	}
	a.metrics = metrics.New()
	if ag.MetricsAddr != "" {
		if a.httpSrv, _, err = a.metrics.Serve(ag.MetricsAddr); err != nil {
			return a, err
		}
	}
	if a.tail, err = tail.Listen(filepath.Join(ag.SocketDir, "events.sock"), 4096); err != nil {
		return a, err
	}
	a.startup.done("open sinks")
	a.escape = escape.New(escape.Config{Limits: a.escapeLimits, Leaf: a.escapeLeaf})
	a.pipe = a.newPipeline()
	// Exporters start before the first event so the startup's records
	// are exported too.
	if err := a.startExport(pol); err != nil {
		return a, fmt.Errorf("export: %w", err)
	}
	switch {
	case oomErr != nil:
		// Root without CAP_SYS_RESOURCE (this project's CI machines) may
		// not lower it: said once, not an alert.
		a.emit(audit.Event{Kind: audit.KindAgent, Verdict: audit.VerdictRecorded,
			Message: fmt.Sprintf("oom_score_adj stays %d (%v): the OOM killer may pick the agent before the sandboxes' processes", oomWas, oomErr)})
	case oomLowered:
		a.emit(audit.Event{Kind: audit.KindAgent, Verdict: audit.VerdictRecorded,
			Message: fmt.Sprintf("oom_score_adj lowered from %d to %d: the OOM killer takes the agent last", oomWas, agentOOMScoreAdj)})
	}
	if a.cosigner, err = startWitnessing(pol, a.ledger, a.emit); err != nil {
		return a, fmt.Errorf("witnesses: %w", err)
	}

	// The kernel side.
	if err := a.openEngine(); err != nil {
		return a, err
	}
	if err := a.loadLayers(nil); err != nil {
		return a, err
	}
	// The DNS proxy starts refusing everything, so its real addresses (port
	// 0 picks one) are known before the policy is compiled with them.
	if err := a.startDNS(); err != nil {
		return a, err
	}
	a.startup.done("start dns proxy")
	if a.plan, err = a.compilePlan(pol); err != nil {
		return a, err
	}
	a.startup.done("plan")
	if err := a.loadLayers(a.plan); err != nil {
		return a, err
	}
	a.startRelay()
	a.startup.done("start name relay")
	// Before any queued event is read: a predecessor that died left them.
	a.beginLife()
	a.startup.done("read life file")
	if a.inodes, err = newInodeWatch(); err != nil {
		return a, fmt.Errorf("inode watch: %w", err)
	}
	a.startup.done("inode watch")
	if err := a.enforceFirstPlan(); err != nil {
		return a, err
	}
	// Sandboxes, then what serves them.
	if err := a.startSandboxes(); err != nil {
		return a, err
	}
	if err := a.run(ctx); err != nil {
		return a, err
	}
	a.recordStart(pol)
	return a, nil
}

// startPolicy is the policy Start begins with, and the reloader that
// follows its file (nil for a given or built-in policy).
func startPolicy(opts Options) (*policy.Policy, *policy.Reloader, error) {
	pol := opts.Policy
	var reloader *policy.Reloader
	if pol == nil {
		if opts.PolicyPath == "" {
			pol = policy.Default()
		} else {
			var err error
			if reloader, err = policy.NewReloader(opts.PolicyPath); err != nil {
				return nil, nil, err
			}
			pol = reloader.Current()
		}
	}
	pol, err := withContainers(pol, opts.Containers)
	if err != nil {
		return nil, nil, err
	}
	return pol, reloader, nil
}

// openEngine opens the shared maps and the event reader.
func (a *Agent) openEngine() (err error) {
	if a.eng, err = enforce.Open(enforce.Options{PinDir: a.pol.Agent.PinDir}); err != nil {
		return err
	}
	if err := a.eng.SetAgentPID(os.Getpid()); err != nil {
		return err
	}
	// Per-program run time and count, from the kernel's BPF statistics.
	if a.bpfStats, err = metrics.NewBPFStats(a.eng.SandboxMap()); err != nil {
		return fmt.Errorf("bpf statistics: %w", err)
	}
	a.metrics.Registry.MustRegister(a.bpfStats)
	a.metrics.Registry.MustRegister(&limitsCollector{a: a})
	a.reader = a.eng.NewReader(enforce.ReaderOptions{})
	a.startup.done("open engine")
	return nil
}

// compilePlan compiles pol for this kernel and this agent (start and
// reload alike) and refuses a plan --require-lsm forbids.
func (a *Agent) compilePlan(pol *policy.Policy) (*plan.Plan, error) {
	prepareToolDirs(pol)
	lsmStatus := a.lsmStatus()
	env := plan.Env{LSM: lsmStatus, LSMMech: a.lsmMechanisms(), AgentFiles: agentFiles(pol, a.opts.PolicyPath),
		DNSProxy4: a.dnsAddr, DNSProxy6: a.dnsAddr6, RequireLSM: a.opts.RequireLSM || pol.Agent.RequireLSM,
		UnixSockets: a.egress.unixErr(), ForeignSockets: a.egress.foreignErr(), AbsentProbeSockets: AbsentProbeSockets(), IA32: ia32.Available()}
	p, err := plan.Compile(pol, env, a.rules)
	if err != nil {
		return nil, err
	}
	if env.RequireLSM && len(p.Missing) > 0 {
		return nil, fmt.Errorf("--require-lsm: no BPF LSM program can block %s (%s)",
			strings.Join(p.Missing, ", "), bpfLSMReason(Kernel().LSMList, firstErr(lsmStatus)))
	}
	return p, nil
}

// enforceFirstPlan writes the first plan into the layers, then attaches
// what loads detached, and hands the DNS proxy its policy.
func (a *Agent) enforceFirstPlan() error {
	// Refusals by seccomp and Landlock (commands run with watcher exec)
	// happen before any hook of ours sees them: sys_exit records them. Any
	// syscall tracepoint slows every task of the host, so they are attached
	// only while commands run (recording.go), or at once when the caller
	// asks. A predecessor's recording stays while its commands may run.
	if a.recorder.DenialsPinned() {
		a.exec.lastPrepare.Store(time.Now().UnixNano())
	}
	a.recorder.denialsOn.Store(a.wantDenials())
	if err := a.applyPlan(); err != nil {
		return err
	}
	a.startup.done("apply plan")
	if err := a.recorder.Attach(recorder.AttachOptions{Syscalls: a.plan.SyscallStream, Denials: a.recorder.denialsOn.Load()}); err != nil {
		return fmt.Errorf("tracepoints: %w", err)
	}
	// The backstop's own syscall tracepoints follow its rules (attached
	// only while a rule no stronger layer covers needs them).
	if a.backstop.Backstop != nil {
		if err := a.backstop.Attach(); err != nil {
			return fmt.Errorf("kill backstop: %w", err)
		}
		a.watchSignals()
	}
	a.startup.done("attach")
	if err := a.dns.SetPolicy(a.plan.DNS); err != nil {
		return fmt.Errorf("dns policy: %w", err)
	}
	a.startup.done("dns policy")
	return nil
}

// startSandboxes registers the sandbox cgroups: existing ones now, later
// ones as they appear (the watcher, which run starts).
func (a *Agent) startSandboxes() (err error) {
	if err := a.registerSandboxes(); err != nil {
		return err
	}
	a.dockerLabels = &containers.DockerLabels{Socket: a.pol.Agent.DockerSocket}
	a.containerdLabels = &containers.ContainerdLabels{Socket: a.pol.Agent.ContainerdSocket}
	a.labelSource = containers.Runtimes{a.dockerLabels, a.containerdLabels}
	if a.watcher, err = containers.NewWatcher(containers.WatcherConfig{Targets: a.watchTargets(), OnEvent: a.onCgroup,
		Labels: a.labelSource, OnError: a.labelError}); err != nil {
		return err
	}
	a.startup.done("register sandboxes")
	return nil
}

// run starts the agent's goroutines, the control socket and the gateway.
func (a *Agent) run(ctx context.Context) (err error) {
	a.wg.Add(3)
	go func() { defer a.wg.Done(); a.watcher.Run(ctx) }()
	go func() { defer a.wg.Done(); a.egress.Run(ctx, 0) }()
	a.wg.Add(1)
	go func() { defer a.wg.Done(); a.expireAnswers(ctx) }()
	go func() { defer a.wg.Done(); a.pump() }()
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		if err := a.reader.Run(ctx); err != nil {
			a.emit(audit.Event{Kind: audit.KindAgent, Severity: audit.SeverityAlert, Verdict: audit.VerdictRecorded,
				Message: "kernel event reader stopped: " + err.Error()})
		}
	}()
	if a.control, err = control.Listen(filepath.Join(a.pol.Agent.SocketDir, "control.sock"), a); err != nil {
		return err
	}
	if err := a.startGateway(); err != nil {
		return err
	}
	a.wg.Add(1)
	go func() { defer a.wg.Done(); a.periodic(ctx) }()
	a.wg.Add(1)
	go func() { defer a.wg.Done(); a.runLife(ctx.Done()) }()
	a.wg.Add(1)
	go func() { defer a.wg.Done(); a.watchLimits(ctx) }()
	a.wg.Add(1)
	go func() { defer a.wg.Done(); a.watchPosture(ctx) }()
	a.startup.done("start control, gateway")
	a.startCanary(ctx)
	a.wg.Add(1)
	go func() { defer a.wg.Done(); a.followInodes() }()
	if a.reloader != nil {
		// Edits of the policy file take effect without a signal; a bad
		// edit is refused and the policy in force stays.
		a.reloader.OnReload = func(_, pol *policy.Policy) { a.applyPolicy(pol) }
		a.reloader.OnError = a.refused
		a.wg.Add(1)
		go func() { defer a.wg.Done(); a.reloader.Run(ctx) }()
	}
	a.startup.done("start canary, reloader")
	return nil
}

// recordStart records the start, and which layer enforces each rule on
// this kernel.
func (a *Agent) recordStart(pol *policy.Policy) {
	a.mu.Lock()
	byRule := a.plan.Layers
	a.mu.Unlock()
	a.emit(audit.Event{Kind: audit.KindAgent, Verdict: audit.VerdictRecorded, Severity: audit.SeverityAlert,
		Message: fmt.Sprintf("agent %s started, pid %d, policy %s (%s), in %s; %s", Version, os.Getpid(),
			policyName(a.opts.PolicyPath), short(pol.Hash), FormatStartup(a.Startup()), "rules by layer: "+control.LayerSummary(byRule))})
	// Which layer enforces each rule on this kernel, in the record too.
	var table strings.Builder
	for _, l := range byRule {
		fmt.Fprintf(&table, "%s => %s (%s)\n", l.Rule, l.Mechanism, l.Note)
	}
	a.emit(audit.Event{Kind: audit.KindAgent, Verdict: audit.VerdictRecorded, Severity: audit.SeverityAlert,
		Message: "enforcement layers on this kernel:\n" + table.String()})
}

// withContainers returns pol with extra container ids selected by its
// first sandbox (a copy: the reloader's policy is not modified).
func withContainers(pol *policy.Policy, ids []string) (*policy.Policy, error) {
	if len(ids) == 0 {
		return pol, nil
	}
	if len(pol.Sandboxes) == 0 {
		return nil, errors.New("--container: the policy has no sandbox to put the container in")
	}
	cp := *pol
	cp.Sandboxes = append([]policy.Sandbox(nil), pol.Sandboxes...)
	sel := &cp.Sandboxes[0].Select
	sel.Containers = append(append([]string(nil), sel.Containers...), ids...)
	if err := cp.Validate(); err != nil {
		return nil, fmt.Errorf("--container: %w", err)
	}
	return &cp, nil
}

// onMountKill undoes what the kill backstop could not prevent: a mount made
// by a process killed for it stays mounted, so the agent unmounts it in the
// process's mount namespace and records the outcome.
func (a *Agent) onMountKill(mk backstop.MountKill) {
	if !mk.Killed || mk.Ret != 0 || (mk.Op != "mount" && mk.Op != "move_mount") {
		return
	}
	go func() {
		ev := audit.Event{Kind: audit.KindMount, Verdict: audit.VerdictRecorded, Severity: audit.SeverityAlert,
			Mechanism: "agent", Sandbox: audit.Sandbox{CgroupID: mk.SandboxCgroup},
			Process: audit.Process{PID: mk.PID, TGID: mk.TGID, CgroupID: mk.CgroupID},
			Mount:   &audit.MountDetail{Op: "undo_" + mk.Op, Target: mk.Target}}
		if err := backstop.UndoMount(mk); err != nil {
			ev.Message = "the killed process's mount could not be undone: " + err.Error()
		} else {
			ev.Message = "the killed process's mount was undone (detached in its mount namespace)"
		}
		a.emit(ev)
	}()
}

// applyPlan writes the compiled rules into every layer, in start order
// (start and reload alike). New rules are written before old ones are
// removed by each layer, so a reload leaves no gap.
func (a *Agent) applyPlan() error {
	a.applyMu.Lock()
	defer a.applyMu.Unlock()
	p := a.plan
	if a.inodes != nil {
		defer func() { a.inodes.set(inodeWatchDirs(p, a.ownFiles())) }()
	}
	names := make(map[uint32]string, len(p.SandboxIDs))
	for name, id := range p.SandboxIDs {
		names[id] = name
	}
	a.names.Store(&names)
	for _, l := range a.steps() {
		if err := l.apply(p); err != nil {
			return err
		}
	}
	if err := a.applyNames(p); err != nil {
		return fmt.Errorf("name binding: %w", err)
	}
	return nil
}

// pump moves kernel events to the fan-out.
func (a *Agent) pump() {
	for b := range a.reader.Batches() {
		// The batch is the agent's until Release: the stages change its
		// events in place (sinks do not keep them, pipeline.Sink).
		for i := range b {
			a.pipe.Emit(&b[i])
		}
		a.reader.Release(b)
	}
}

// emit runs an event through the pipeline (telemetry.go): every producer
// (layers, the DNS proxy, the agent itself) calls it.
func (a *Agent) emit(ev audit.Event) {
	// Sinks do not keep the pointer (pipeline.Sink), so the event the
	// stages change in place is reused: no allocation per event.
	p := eventPool.Get().(*audit.Event)
	*p = ev
	a.pipe.Emit(p)
	*p = audit.Event{}
	eventPool.Put(p)
}

var eventPool = sync.Pool{New: func() any { return new(audit.Event) }}

// applyPolicy compiles pol and writes it into every layer; on failure the
// previous policy is written back and stays in force.
func (a *Agent) applyPolicy(pol *policy.Policy) {
	pol, err := withContainers(pol, a.opts.Containers)
	if err != nil {
		a.refused(err)
		return
	}
	next, err := a.compilePlan(pol)
	if err == nil {
		a.mu.Lock()
		oldPol, oldPlan := a.pol, a.plan
		a.pol, a.plan = pol, next
		a.mu.Unlock()
		if err = a.applyPlan(); err == nil {
			err = a.syncRecording() // the syscall stream may have changed
		}
		if err == nil {
			err = a.dns.SetPolicy(next.DNS)
		}
		if err == nil {
			a.revokeDropped(next)
		}
		if err == nil {
			err = a.registerSandboxes()
		}
		if err == nil {
			a.pruneRoots()
			err = a.watcher.SetTargets(a.watchTargets())
		}
		if err != nil {
			a.mu.Lock()
			a.pol, a.plan = oldPol, oldPlan
			a.mu.Unlock()
			a.applyPlan()
			a.dns.SetPolicy(oldPlan.DNS)
		}
	}
	a.mu.Lock()
	a.applyErr = err
	a.mu.Unlock()
	if err != nil {
		a.refused(err)
		return
	}
	a.applyGateway()
	a.emit(audit.Event{Kind: audit.KindAgent, Verdict: audit.VerdictRecorded, Severity: audit.SeverityAlert,
		Message: fmt.Sprintf("policy reloaded from %s (%s)", a.opts.PolicyPath, short(pol.Hash))})
	a.kickCanary("reload")
}

// Stop shuts the agent down gracefully: the programs stay pinned (and
// enforcing) for the next agent; the ledger gets a final checkpoint.
func (a *Agent) Stop() error {
	a.stopOnce.Do(func() {
		if a.ledger != nil && a.pipe != nil {
			a.finishGap() // a stop within gapSettle of the start
			a.emit(audit.Event{Kind: audit.KindAgent, Verdict: audit.VerdictRecorded, Severity: audit.SeverityAlert,
				Rule: RuleAgentStop, Message: "agent stopping; pinned programs keep enforcing"})
		}
		a.stopGateway()
		if a.control != nil {
			a.control.Close()
		}
		if a.dns != nil {
			a.dns.Close()
		}
		if a.relay != nil {
			a.relay.Close()
		}
		if a.cancel != nil {
			a.cancel()
		}
		if a.inodes != nil {
			a.inodes.close()
		}
		a.wg.Wait()
		errs := a.closeLayers()
		if a.eng != nil {
			a.eng.Close()
		}
		if a.bpfStats != nil {
			a.bpfStats.Close()
		}
		if a.httpSrv != nil {
			a.httpSrv.Close()
		}
		a.stopWitnessing()
		a.stopExport()
		if a.containerdLabels != nil {
			a.containerdLabels.Close()
		}
		if a.pipe != nil {
			errs = append(errs, a.pipe.Close()) // closes the ledger (final checkpoint) and the tail
		}
		a.endLife() // after the stop record: the next start finds a clean stop
		a.stopErr = errors.Join(errs...)
	})
	return a.stopErr
}

func ledgerOptions(p *policy.Policy) ledger.Options {
	o := ledger.Options{SummaryInterval: p.Agent.Sampling.SummaryInterval.Duration, Compress: true}
	if r := p.Agent.Sampling.Rate; r > 0 && r < 1 {
		o.SampleEvery = uint64(1/r + 0.5)
	}
	return o
}

// StateDir is where the agent and `watcher exec` keep state they trust
// across runs (the circuit breaker's counts): next to the ledger directory,
// and protected with the agent's files.
func StateDir(p *policy.Policy) string {
	return filepath.Join(filepath.Dir(filepath.Clean(p.Agent.LedgerDir)), "state")
}

// BreakerFile is the circuit breaker's state file of a sandbox.
func BreakerFile(p *policy.Policy, sandbox string) string {
	return filepath.Join(StateDir(p), "breaker-"+sandbox)
}

func agentFiles(p *policy.Policy, policyPath string) []string {
	// The state directory exists before the rules are compiled, so it is
	// protected as a directory (everything below it).
	_ = os.MkdirAll(StateDir(p), 0o700)
	files := []string{p.Agent.LedgerDir, p.Agent.SocketDir, p.Agent.PinDir, StateDir(p)}
	if policyPath != "" {
		if abs, err := filepath.Abs(policyPath); err == nil {
			files = append(files, abs)
		}
	}
	return files
}

func anyLoaded(st map[string]error) bool {
	for _, err := range st {
		if err == nil {
			return true
		}
	}
	return false
}

func firstErr(st map[string]error) error {
	for _, err := range st {
		if err != nil {
			return err
		}
	}
	return nil
}

func policyName(path string) string {
	if path == "" {
		return "built-in default"
	}
	return path
}

func short(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	return h
}

// resolvConfServers reads the host's nameservers for upstreams.
func resolvConfServers() []string {
	data, err := os.ReadFile("/etc/resolv.conf")
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "nameserver" {
			if ip, err := netip.ParseAddr(f[1]); err == nil {
				out = append(out, netip.AddrPortFrom(ip, 53).String())
			}
		}
	}
	return out
}
