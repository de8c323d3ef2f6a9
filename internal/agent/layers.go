package agent

import (
	"fmt"
	"sync/atomic"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/backstop"
	"github.com/watcherhq/watcher/internal/enforce/cgroupbpf"
	"github.com/watcherhq/watcher/internal/enforce/egress"
	"github.com/watcherhq/watcher/internal/enforce/egress/dnsbind"
	"github.com/watcherhq/watcher/internal/enforce/ipcobj"
	"github.com/watcherhq/watcher/internal/enforce/lsm"
	"github.com/watcherhq/watcher/internal/enforce/recorder"
	"github.com/watcherhq/watcher/internal/plan"
)

// layer is one group of BPF programs as the agent drives it. Start and a
// reload take the same steps over every layer (loadLayers, applyPlan,
// closeLayers); what only one layer does (attaching per sandbox cgroup,
// admitting DNS answers) goes through its typed field.
type layer interface {
	// load loads the programs, adopting a previous agent's pins. first is
	// the first plan, nil for the layers loaded before it is compiled.
	load(eng *enforce.Engine, first *plan.Plan) error
	// register sets the reader's decoders for the layer's events.
	register(r *enforce.Reader)
	// apply writes the plan's rules; new rules before old ones go, so a
	// reload leaves no gap.
	apply(p *plan.Plan) error
	// close releases descriptors: pinned links keep enforcing.
	close() error
}

// layers are the agent's layers by kind. Each field embeds the loaded
// group (nil until loaded; the LSM's stays nil where none of its programs
// loads).
type layers struct {
	lsm      lsmLayer
	cgroups  cgroupLayer
	recorder recorderLayer
	egress   egressLayer
	ipc      ipcLayer
	backstop backstopLayer
}

// layerStep is a layer in the start order, with the start step that
// loads it.
type layerStep struct {
	layer
	step string // startup stage name
	// beforePlan: loaded before the first plan is compiled (the LSM's
	// status shapes the plan); the others after it (egress needs it).
	beforePlan bool
}

// steps lists the layers in start order, which is also the order plans
// are written in: IPC creations are recorded before the backstop judges
// objects by them.
func (l *layers) steps() []layerStep {
	return []layerStep{
		{&l.lsm, "load lsm", true},
		{&l.cgroups, "load cgroup programs", true},
		// Exec and exit records (sched tracepoints: no syscall slow
		// path); the sampled syscall stream only when a sandbox asks for
		// it, since any syscall tracepoint slows every task on the host.
		{&l.recorder, "load recorder", true},
		{&l.egress, "load egress", false},
		{&l.ipc, "load ipc tracking", false},
		// The backstop is loaded whatever the first plan needs: a reload
		// may add rules only it enforces, and its syscall tracepoints
		// (the costly part) attach only while its rules need them.
		{&l.backstop, "load backstop", false},
	}
}

// loadLayers loads the layers of one side of the first plan (first nil:
// the ones before it) and registers their events.
func (a *Agent) loadLayers(first *plan.Plan) error {
	for _, s := range a.steps() {
		if s.beforePlan != (first == nil) {
			continue
		}
		if err := s.load(a.eng, first); err != nil {
			return err
		}
		s.register(a.reader)
		a.startup.done(s.step)
	}
	return nil
}

// closeLayers closes every layer loaded (in start order).
func (a *Agent) closeLayers() []error {
	var errs []error
	for _, s := range a.steps() {
		if err := s.close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// lsmLayer: BPF LSM, fmod_ret or fentry programs, one per hook.
type lsmLayer struct {
	*lsm.LSM
	// probe and probeMech are, without loaded programs, why not, hook by
	// hook, and the mechanism per hook (probing loads programs: not on
	// every status call).
	probe     map[string]error
	probeMech map[string]string
}

// load never fails the start: hooks that do not load are the plan's to
// route to other layers (or --require-lsm's to refuse).
func (l *lsmLayer) load(eng *enforce.Engine, _ *plan.Plan) error {
	// One program tells whether BPF LSM or fmod_ret works here; then Load
	// verifies them all once (probing every hook first verified each
	// program twice: 12 s of a 22 s start in the qemu guest). Where
	// nothing loads, the probe says why, hook by hook.
	usable, status, mech := lsm.Check()
	var err error
	if usable {
		l.LSM, err = lsm.Load(eng)
	}
	switch {
	case l.LSM != nil:
		status, mech = l.Status(), l.Mechanisms()
	case err != nil:
		// Nothing was set up: no hook may be planned on.
		status, mech = map[string]error{"*": err}, map[string]string{}
	}
	l.probe, l.probeMech = status, mech
	return nil
}

func (l *lsmLayer) register(r *enforce.Reader) { lsm.Register(r) }

func (l *lsmLayer) apply(p *plan.Plan) error {
	if l.LSM == nil {
		return nil
	}
	for id, r := range p.LSM {
		if err := l.SetRules(id, r); err != nil {
			return fmt.Errorf("lsm rules: %w", err)
		}
	}
	return nil
}

func (l *lsmLayer) close() error {
	if l.LSM == nil {
		return nil
	}
	return l.Close()
}

// hookStatus is the load status per hook; without loaded programs, the
// probe made at start.
func (l *lsmLayer) hookStatus() map[string]error {
	if l.LSM != nil {
		return l.Status()
	}
	return l.probe
}

// hookMechanisms is hookStatus's companion: the mechanism per hook.
func (l *lsmLayer) hookMechanisms() map[string]string {
	if l.LSM != nil {
		return l.Mechanisms()
	}
	return l.probeMech
}

// cgroupLayer: device, sysctl, socket and listener programs, attached per
// sandbox root (registry.go).
type cgroupLayer struct{ *cgroupbpf.Programs }

func (l *cgroupLayer) load(eng *enforce.Engine, _ *plan.Plan) (err error) {
	if l.Programs, err = cgroupbpf.Load(eng); err != nil {
		return fmt.Errorf("cgroup hooks: %w", err)
	}
	return nil
}

func (l *cgroupLayer) register(r *enforce.Reader) { cgroupbpf.Register(r) }

func (l *cgroupLayer) apply(p *plan.Plan) error {
	if err := l.SetDeviceRules(p.Devices); err != nil {
		return fmt.Errorf("device rules: %w", err)
	}
	if err := l.SetSysctlRules(p.Sysctl); err != nil {
		return fmt.Errorf("sysctl rules: %w", err)
	}
	if err := l.SetSocketRules(p.Sockets); err != nil {
		return fmt.Errorf("socket rules: %w", err)
	}
	if err := l.SetListenRules(p.Listen); err != nil {
		return fmt.Errorf("listen rules: %w", err)
	}
	return nil
}

func (l *cgroupLayer) close() error {
	if l.Programs == nil {
		return nil
	}
	return l.Close()
}

// recorderLayer: exec, exit and syscall records, and the refusals of
// watcher exec commands (recording.go).
type recorderLayer struct {
	*recorder.Recorder
	// denialsOn says the tracepoints recording seccomp and Landlock
	// refusals are attached.
	denialsOn atomic.Bool
}

func (l *recorderLayer) load(eng *enforce.Engine, _ *plan.Plan) (err error) {
	if l.Recorder, err = recorder.Load(eng); err != nil {
		return fmt.Errorf("tracepoints: %w", err)
	}
	return nil
}

func (l *recorderLayer) register(r *enforce.Reader) { recorder.Register(r) }

func (l *recorderLayer) apply(p *plan.Plan) error {
	tc := p.Trace
	tc.RecordDenials = l.denialsOn.Load()
	if err := l.SetConfig(tc); err != nil {
		return fmt.Errorf("trace config: %w", err)
	}
	return nil
}

func (l *recorderLayer) close() error {
	if l.Recorder == nil {
		return nil
	}
	return l.Close()
}

// egressLayer: the cgroup socket-address programs on each sandbox root
// that bind egress to DNS answers, and the directory the DNS proxy finds a
// sandbox's id in.
type egressLayer struct {
	*egress.Egress
	dirs   *dnsbind.Directory
	notify func(audit.Event)
}

func (l *egressLayer) load(eng *enforce.Engine, first *plan.Plan) (err error) {
	if l.Egress, err = egress.Load(eng, egress.Options{Notify: l.notify, Grace: first.GraceMax}); err != nil {
		return fmt.Errorf("egress: %w", err)
	}
	return nil
}

func (l *egressLayer) register(r *enforce.Reader) { l.RegisterEvents(r) }

func (l *egressLayer) apply(p *plan.Plan) error {
	for name, id := range p.SandboxIDs {
		l.dirs.Set(name, id)
		if cfg, ok := p.Egress[id]; ok {
			if err := l.SetSandbox(id, cfg); err != nil {
				return fmt.Errorf("egress rules: %w", err)
			}
		}
	}
	return nil
}

func (l *egressLayer) close() error {
	if l.Egress == nil {
		return nil
	}
	return l.Close()
}

// unixErr is why the cgroup unix socket hooks do not load: probed until
// the layer is loaded, then what its load found.
func (l *egressLayer) unixErr() error {
	if l.Egress == nil {
		return egress.ProbeUnix()
	}
	return l.UnixErr()
}

// foreignErr is why sockets made outside a sandbox are not judged: probed
// until the layer is loaded, then what its load found.
func (l *egressLayer) foreignErr() error {
	if l.Egress == nil {
		return egress.ProbeForeign()
	}
	return l.ForeignErr()
}

// ipcLayer: the IPC objects sandboxes create (workspace rollback, and the
// backstop's own-object test); see ipc.go.
type ipcLayer struct {
	*ipcobj.Tracker
	// wanted says whether a plan needs the tracepoints attached.
	wanted func(*plan.Plan) bool
}

func (l *ipcLayer) load(eng *enforce.Engine, _ *plan.Plan) (err error) {
	if l.Tracker, err = ipcobj.Load(eng); err != nil {
		return fmt.Errorf("ipc tracking: %w", err)
	}
	return nil
}

func (l *ipcLayer) register(*enforce.Reader) {} // no events of its own

// apply attaches the IPC tracepoints while the plan needs them (any
// syscall tracepoint slows every task of the host).
func (l *ipcLayer) apply(p *plan.Plan) error {
	if l.Tracker == nil {
		return nil
	}
	if err := l.SetAttached(l.wanted(p)); err != nil {
		return fmt.Errorf("ipc tracking: %w", err)
	}
	return nil
}

func (l *ipcLayer) close() error {
	if l.Tracker == nil {
		return nil
	}
	return l.Close()
}

// backstopLayer: the kill backstop (tracepoints), for what no stronger
// layer enforces on this kernel.
type backstopLayer struct {
	*backstop.Backstop
	onMount func(backstop.MountKill)
}

func (l *backstopLayer) load(eng *enforce.Engine, _ *plan.Plan) (err error) {
	if l.Backstop, err = backstop.Load(eng); err != nil {
		return fmt.Errorf("kill backstop: %w", err)
	}
	return nil
}

func (l *backstopLayer) register(r *enforce.Reader) {
	backstop.RegisterWithHandlers(r, backstop.Handlers{OnMount: l.onMount})
}

func (l *backstopLayer) apply(p *plan.Plan) error {
	if l.Backstop == nil {
		return nil
	}
	if err := l.SetRules(p.Backstop); err != nil {
		return fmt.Errorf("backstop rules: %w", err)
	}
	return nil
}

func (l *backstopLayer) close() error {
	if l.Backstop == nil {
		return nil
	}
	return l.Close()
}
