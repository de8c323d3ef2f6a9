// Package lsm loads, attaches and pins watcher's BPF LSM programs
// (bpf/lsm.c): the hooks that refuse dangerous operations from sandbox
// cgroups with EPERM before they happen (ptrace, the mount family, kernel
// code loading, bpf(2), suspicious opens, signals to the agent, capability
// use), and record them when a rule asks.
//
// Kernels that refuse BPF LSM programs (no `bpf` in the active LSM list, or
// a kernel that denies BPF trampolines, like this project's development
// machines) are reported per hook: Probe says which hooks can load, and
// Load returns a *LoadError naming each hook that could not be attached,
// together with whatever did attach, so the agent can decide.
//
// Links are pinned under enforce.LinkPinDir(pinDir, "lsm"), one per hook,
// and the rule maps by name with the shared maps, so enforcement continues
// while the agent restarts. Load adopts pinned links whose program is the
// one it would load, and replaces others by attaching the new link before
// dropping the old one: there is never a window without the hook.
package lsm

import (
	"errors"
	"fmt"
	stdmaps "maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/rules/lsmrules"
)

// Group is the hook group name used for the link pin directory.
const Group = "lsm"

// LoadError lists the hooks that could not be loaded or attached.
type LoadError struct {
	// Hooks maps an LSM hook name (e.g. "file_open") to why it failed.
	Hooks map[string]error
}

func (e *LoadError) Error() string {
	names := make([]string, 0, len(e.Hooks))
	for n := range e.Hooks {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	fmt.Fprintf(&b, "%d BPF LSM hook(s) unavailable:", len(names))
	for _, n := range names {
		fmt.Fprintf(&b, "\n  lsm/%s: %v", n, e.Hooks[n])
	}
	return b.String()
}

// Unwrap returns the per-hook errors, so errors.Is(err, unix.EPERM) works.
func (e *LoadError) Unwrap() []error {
	out := make([]error, 0, len(e.Hooks))
	for _, err := range e.Hooks {
		out = append(out, err)
	}
	return out
}

// LSM is the loaded hook group. Close releases its file descriptors and
// keeps the pins (enforcement continues); Detach removes the link pins.
type LSM struct {
	pinDir  string
	linkDir string
	maps    *ebpf.Collection
	links   map[string]link.Link
	adopted map[string]bool
	status  map[string]error
	mech    map[string]string
}

// Hooks lists the LSM hooks this group attaches to, sorted.
func Hooks() []string {
	spec, err := loadLsm()
	if err != nil {
		return nil
	}
	return hookNames(spec)
}

func hookNames(spec *ebpf.CollectionSpec) []string {
	var out []string
	for hook := range programsByHook(spec) {
		out = append(out, hook)
	}
	sort.Strings(out)
	return out
}

// hookPrograms are the two programs of one hook in the spec.
type hookPrograms map[string]string // mechanism -> program name

// programsByHook maps hook name -> mechanism -> program name: lsm_<hook>
// is the lsm/ program, fmod_<hook> the fmod_ret/ one.
func programsByHook(spec *ebpf.CollectionSpec) map[string]hookPrograms {
	out := map[string]hookPrograms{}
	for name := range spec.Programs {
		mech, hook := lsmrules.MechLSM, ""
		switch {
		case strings.HasPrefix(name, "lsm_"):
			hook = strings.TrimPrefix(name, "lsm_")
		case strings.HasPrefix(name, "fmod_"):
			mech, hook = lsmrules.MechFmodRet, strings.TrimPrefix(name, "fmod_")
		case strings.HasPrefix(name, "entry_"):
			mech, hook = lsmrules.MechFentry, strings.TrimPrefix(name, "entry_")
		case strings.HasPrefix(name, "exit_"): // fexit, same family
			mech, hook = lsmrules.MechFentry, strings.TrimPrefix(name, "exit_")
		default:
			continue
		}
		if out[hook] == nil {
			out[hook] = hookPrograms{}
		}
		out[hook][mech] = name
	}
	return out
}

// ErrHookAbsent marks a hook this kernel does not have at all (neither
// bpf_lsm_<hook> nor its security_* function in the kernel's BTF), such as
// file_truncate before 6.2: the hook is optional, another hook covers the
// operation there, and Load does not count it as a failure.
var ErrHookAbsent = errors.New("hook not in this kernel")

// absent reports whether neither program of the hook has an attach target
// in the running kernel's BTF (kspec; nil: unknown, never absent).
func absent(kspec *btf.Spec, spec *ebpf.CollectionSpec, progs hookPrograms) bool {
	if kspec == nil {
		return false
	}
	for mech, name := range progs {
		target := spec.Programs[name].AttachTo
		if mech == lsmrules.MechLSM {
			target = "bpf_lsm_" + target
		}
		var fn *btf.Func
		if kspec.TypeByName(target, &fn) == nil {
			return false
		}
	}
	return true
}

// mechanismOrder is the order in which Load tries the mechanisms: BPF LSM
// first where `bpf` is in the active LSM list. Elsewhere lsm/ programs
// load and attach but never run (the kernel never calls the bpf LSM's
// hooks), so they are not tried at all. fentry programs have their own
// hooks (syscall entry points), tried last.
func mechanismOrder() ([]string, string) {
	lsms, err := os.ReadFile("/sys/kernel/security/lsm")
	if err != nil {
		return []string{lsmrules.MechFmodRet, lsmrules.MechFentry}, fmt.Sprintf("active LSM list unknown (%v): BPF LSM programs might never run", err)
	}
	list := strings.TrimSpace(string(lsms))
	if slices.Contains(strings.Split(list, ","), "bpf") {
		return []string{lsmrules.MechLSM, lsmrules.MechFmodRet, lsmrules.MechFentry}, ""
	}
	return []string{lsmrules.MechFmodRet, lsmrules.MechFentry}, fmt.Sprintf("`bpf` is not in the active LSM list %q", list)
}

// Load loads the programs with the engine's shared maps, one per hook:
// BPF LSM where it runs, else fmod_ret on the security_* function. It
// attaches them (or adopts the pinned links) and pins the links. It
// returns the group even when some hooks failed; the error is then a
// *LoadError. It returns a nil group only when nothing could be set up
// (the rule maps).
func Load(eng *enforce.Engine) (*LSM, error) {
	spec, err := loadLsm()
	if err != nil {
		return nil, fmt.Errorf("load lsm spec: %w", err)
	}
	maps, err := loadMaps(spec, eng.CollectionOptions())
	if err != nil {
		return nil, err
	}
	l := &LSM{
		pinDir:  eng.PinDir(),
		linkDir: enforce.LinkPinDir(eng.PinDir(), Group),
		maps:    maps,
		links:   map[string]link.Link{},
		adopted: map[string]bool{},
		status:  map[string]error{},
		mech:    map[string]string{},
	}
	if err := os.MkdirAll(l.linkDir, 0o700); err != nil {
		maps.Close()
		return nil, fmt.Errorf("create lsm link pin dir: %w", err)
	}
	if err := writeSyscallChecks(maps); err != nil {
		maps.Close()
		return nil, err
	}
	if err := writeMmapMinAddr(maps); err != nil {
		maps.Close()
		return nil, err
	}
	status, mechs := pick(spec, maps, func(hook, mech string, p *ebpf.Program) error {
		defer p.Close() // the link holds the program
		return l.attach(hook, mech, p)
	})
	l.mech = mechs
	failed := map[string]error{}
	for hook, err := range status {
		l.status[hook] = err
		if err != nil && !errors.Is(err, ErrHookAbsent) {
			failed[hook] = err
		}
	}
	if len(failed) > 0 {
		return l, &LoadError{Hooks: failed}
	}
	return l, nil
}

// pick tries each mechanism in order for the hooks still without one:
// it loads their programs and hands each to use (attach, or nothing for a
// probe), which takes ownership of the program. It returns every hook's
// outcome and the mechanism of each hook that succeeded.
func pick(spec *ebpf.CollectionSpec, maps *ebpf.Collection, use func(hook, mech string, p *ebpf.Program) error) (map[string]error, map[string]string) {
	order, why := mechanismOrder()
	byHook := programsByHook(spec)
	out := map[string]error{}
	mechs := map[string]string{}
	errs := map[string][]error{}
	// One copy of the kernel's BTF for every lookup: each copy decodes
	// the types it is asked for again (minutes under emulation).
	kspec, err := btf.LoadKernelSpec()
	if err != nil {
		kspec = nil
	}
	for hook, progs := range byHook {
		if absent(kspec, spec, progs) {
			out[hook] = ErrHookAbsent
		} else if why != "" && progs[lsmrules.MechLSM] != "" {
			errs[hook] = append(errs[hook], fmt.Errorf("%s: not tried: %s", lsmrules.MechLSM, why))
		}
	}
	for _, mech := range order {
		want := map[string]string{}
		for hook, progs := range byHook {
			if _, done := out[hook]; !done && progs[mech] != "" {
				want[hook] = progs[mech]
			}
		}
		for hook, r := range loadPrograms(spec, maps, want) {
			err := r.err
			if err != nil {
				err = fmt.Errorf("load: %w", err)
			} else {
				err = use(hook, mech, r.prog)
			}
			if err != nil {
				errs[hook] = append(errs[hook], fmt.Errorf("%s: %w", mech, err))
				continue
			}
			out[hook] = nil
			mechs[hook] = mech
		}
	}
	for hook := range byHook {
		if _, done := out[hook]; !done {
			out[hook] = errors.Join(errs[hook]...)
		}
	}
	return out, mechs
}

// loadMaps creates (or adopts, through pinning by name) every map of the
// spec, with no programs.
func loadMaps(spec *ebpf.CollectionSpec, opts *ebpf.CollectionOptions) (*ebpf.Collection, error) {
	ms := spec.Copy()
	ms.Programs = map[string]*ebpf.ProgramSpec{}
	coll, err := ebpf.NewCollectionWithOptions(ms, *opts)
	if err != nil {
		return nil, fmt.Errorf("load lsm maps: %w", err)
	}
	return coll, nil
}

type loadResult struct {
	prog *ebpf.Program
	err  error
}

// loadPrograms loads the programs of want (hook -> program name) against
// already created maps. All at once first (one pass, seconds faster under
// emulation); when that fails, one by one so each hook gets its own
// verdict.
func loadPrograms(spec *ebpf.CollectionSpec, maps *ebpf.Collection, want map[string]string) map[string]loadResult {
	out := map[string]loadResult{}
	if len(want) == 0 {
		return out
	}
	keep := map[string]bool{}
	for _, prog := range want {
		keep[prog] = true
	}
	if coll, err := loadSome(spec, keep, maps); err == nil {
		for hook, prog := range want {
			out[hook] = loadResult{prog: coll.Programs[prog]}
			delete(coll.Programs, prog)
		}
		coll.Close()
		return out
	}
	// An EPERM before verification refuses the program type whole (a
	// kernel that denies BPF trampolines): after the first, the others of
	// this mechanism are not tried (each try relocates the program
	// against the kernel's BTF first: seconds in all, for nothing).
	var refused error
	for hook, prog := range want {
		if refused != nil {
			out[hook] = loadResult{err: refused}
			continue
		}
		coll, err := loadSome(spec, map[string]bool{prog: true}, maps)
		if err != nil {
			out[hook] = loadResult{err: explain(err)}
			if errors.Is(err, unix.EPERM) {
				refused = fmt.Errorf("not tried: the kernel refused %s of the same type before it: %w", prog, out[hook].err)
			}
			continue
		}
		out[hook] = loadResult{prog: coll.Programs[prog]}
		delete(coll.Programs, prog)
		coll.Close()
	}
	return out
}

// loadSome loads the programs named in keep against already created maps.
func loadSome(spec *ebpf.CollectionSpec, keep map[string]bool, maps *ebpf.Collection) (*ebpf.Collection, error) {
	ps := spec.Copy()
	for name := range ps.Programs {
		if !keep[name] {
			delete(ps.Programs, name)
		}
	}
	return ebpf.NewCollectionWithOptions(ps, ebpf.CollectionOptions{MapReplacements: maps.Maps})
}

// explain adds what an EPERM at load means: the kernel refused the
// program before verifying it (cilium/ebpf's MEMLOCK hint is misleading
// once the memlock limit is gone).
func explain(err error) error {
	if !errors.Is(err, unix.EPERM) {
		return err
	}
	const why = "kernel refused to load the program (EPERM before verification; the MEMLOCK hint does not apply, the limit is lifted)"
	lsms, rerr := os.ReadFile("/sys/kernel/security/lsm")
	switch {
	case rerr != nil:
		return fmt.Errorf("%s; active LSM list unknown (%v): %w", why, rerr, err)
	case !slices.Contains(strings.Split(strings.TrimSpace(string(lsms)), ","), "bpf"):
		return fmt.Errorf("%s; `bpf` is not in the active LSM list %q (boot with lsm=...,bpf) and BPF trampolines are denied: %w",
			why, strings.TrimSpace(string(lsms)), err)
	default:
		return fmt.Errorf("%s although `bpf` is an active LSM: this kernel denies BPF trampolines: %w", why, err)
	}
}

// attach attaches hook's program p (of mechanism mech), adopting or
// replacing a pinned link.
func (l *LSM) attach(hook, mech string, p *ebpf.Program) error {
	pin := filepath.Join(l.linkDir, hook)

	old, err := link.LoadPinnedLink(pin, nil)
	switch {
	case err == nil:
		if same, _ := sameProgram(old, p); same {
			l.links[hook] = old
			l.adopted[hook] = true
			return nil
		}
	case errors.Is(err, os.ErrNotExist):
		old = nil
	default:
		return fmt.Errorf("open pinned link %s: %w", pin, err)
	}

	var lk link.Link
	switch mech {
	case lsmrules.MechFmodRet:
		lk, err = link.AttachTracing(link.TracingOptions{Program: p, AttachType: ebpf.AttachModifyReturn})
	case lsmrules.MechFentry:
		// fentry or fexit, as the program was loaded.
		lk, err = link.AttachTracing(link.TracingOptions{Program: p, AttachType: ebpf.AttachNone})
	default:
		lk, err = link.AttachLSM(link.LSMOptions{Program: p})
	}
	if err != nil {
		if old != nil {
			old.Close()
		}
		return fmt.Errorf("attach: %w", err)
	}
	// The new link is live before the old one goes, so the hook never
	// lapses: drop the old pin (our descriptor keeps the old link), pin
	// the new link, then release the old one. bpffs has no rename on
	// older kernels, so the pin cannot be swapped atomically.
	if old != nil {
		if err := old.Unpin(); err != nil && !errors.Is(err, os.ErrNotExist) {
			lk.Close()
			old.Close()
			return fmt.Errorf("unpin old link: %w", err)
		}
	}
	if err := lk.Pin(pin); err != nil {
		lk.Close()
		if old != nil {
			// Put the old link back rather than lose the hook on restart.
			old.Pin(pin)
			old.Close()
		}
		return fmt.Errorf("pin link %s: %w", pin, err)
	}
	if old != nil {
		old.Close()
	}
	l.links[hook] = lk
	return nil
}

// sameProgram reports whether the pinned link runs a program with p's tag.
func sameProgram(lk link.Link, p *ebpf.Program) (bool, error) {
	li, err := lk.Info()
	if err != nil {
		return false, err
	}
	old, err := ebpf.NewProgramFromID(li.Program)
	if err != nil {
		return false, err
	}
	defer old.Close()
	oi, err := old.Info()
	if err != nil {
		return false, err
	}
	ni, err := p.Info()
	if err != nil {
		return false, err
	}
	return oi.Tag == ni.Tag && oi.Type == ni.Type, nil
}

// Status reports, per hook, nil when the hook enforces or the reason it
// does not.
func (l *LSM) Status() map[string]error {
	out := make(map[string]error, len(l.status))
	for k, v := range l.status {
		out[k] = v
	}
	return out
}

// Mechanisms reports, per enforcing hook, the mechanism its program runs
// under (MechLSM or MechFmodRet).
func (l *LSM) Mechanisms() map[string]string {
	out := make(map[string]string, len(l.mech))
	for k, v := range l.mech {
		out[k] = v
	}
	return out
}

// Adopted reports whether hook's link was adopted from a pin left by an
// earlier agent rather than attached by this Load.
func (l *LSM) Adopted(hook string) bool { return l.adopted[hook] }

// LinkID returns the kernel id of hook's link (0 when not attached).
func (l *LSM) LinkID(hook string) link.ID {
	lk, ok := l.links[hook]
	if !ok {
		return 0
	}
	info, err := lk.Info()
	if err != nil {
		return 0
	}
	return info.ID
}

// Close releases the group's file descriptors. Pinned links (and so
// enforcement) and the pinned rule maps stay.
func (l *LSM) Close() error {
	var errs []error
	for _, lk := range l.links {
		if err := lk.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	l.links = map[string]link.Link{}
	l.maps.Close()
	return errors.Join(errs...)
}

// Detach unpins and closes every link of the group: the hooks stop. The
// rule maps stay pinned (enforce.Unpin removes everything).
func (l *LSM) Detach() error {
	var errs []error
	for hook, lk := range l.links {
		if err := lk.Unpin(); err != nil {
			errs = append(errs, fmt.Errorf("unpin lsm/%s: %w", hook, err))
		}
	}
	if err := l.Close(); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(l.linkDir); err != nil {
		errs = append(errs, fmt.Errorf("remove lsm link pins: %w", err))
	}
	return errors.Join(errs...)
}

// Probe loads each hook's program once with private, unpinned maps and
// reports per hook whether this kernel accepts it under some mechanism
// (nil) or why not. It attaches nothing and pins nothing.
func Probe() map[string]error {
	status, _ := ProbeMechanisms()
	return status
}

// Check tells, before Load, whether this kernel loads any of the group's
// programs under some mechanism: it verifies one program (a few more where
// one fails for a reason of its own), since Load verifies them all. Where
// none loads it returns what ProbeMechanisms would, hook by hook (why
// not), from the same spec and maps.
func Check() (usable bool, status map[string]error, mechs map[string]string) {
	spec, coll, status, mechs := probeSetup()
	if coll == nil {
		return false, status, mechs
	}
	defer coll.Close()
	kspec, err := btf.LoadKernelSpec()
	if err != nil {
		kspec = nil
	}
	byHook := programsByHook(spec)
	order, _ := mechanismOrder()
	for _, mech := range order {
		for _, hook := range slices.Sorted(stdmaps.Keys(byHook)) {
			name := byHook[hook][mech]
			if name == "" || absent(kspec, spec, hookPrograms{mech: name}) {
				continue
			}
			r := loadPrograms(spec, coll, map[string]string{hook: name})[hook]
			if r.err == nil {
				r.prog.Close()
				return true, nil, nil
			}
			if errors.Is(r.err, unix.EPERM) {
				break // refused before verification: the whole mechanism
			}
		}
	}
	status, mechs = probeWith(spec, coll)
	return false, status, mechs
}

// ProbeMechanisms is Probe, also saying which mechanism (MechLSM or
// MechFmodRet) each loadable hook would use. Hooks the kernel lacks
// altogether report an error wrapping ErrHookAbsent.
func ProbeMechanisms() (map[string]error, map[string]string) {
	spec, coll, status, mechs := probeSetup()
	if coll == nil {
		return status, mechs
	}
	defer coll.Close()
	return probeWith(spec, coll)
}

// probeSetup loads the spec and creates its maps unpinned (ring buffers
// of one page), for loads that only try programs: they touch no agent's
// state. Without maps it returns the reason as every hook's status.
func probeSetup() (*ebpf.CollectionSpec, *ebpf.Collection, map[string]error, map[string]string) {
	spec, err := loadLsm()
	if err != nil {
		return nil, nil, map[string]error{"*": fmt.Errorf("load lsm spec: %w", err)}, map[string]string{}
	}
	fail := func(err error) (*ebpf.CollectionSpec, *ebpf.Collection, map[string]error, map[string]string) {
		out := map[string]error{}
		for hook := range programsByHook(spec) {
			out[hook] = err
		}
		return spec, nil, out, map[string]string{}
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return fail(fmt.Errorf("remove memlock limit: %w", err))
	}
	for _, m := range spec.Maps {
		m.Pinning = ebpf.PinNone
		if m.Type == ebpf.RingBuf {
			m.MaxEntries = uint32(os.Getpagesize())
		}
	}
	coll, err := loadMaps(spec, &ebpf.CollectionOptions{})
	if err != nil {
		return fail(err)
	}
	return spec, coll, nil, nil
}

// probeWith tries every hook's programs against coll and closes them.
func probeWith(spec *ebpf.CollectionSpec, coll *ebpf.Collection) (map[string]error, map[string]string) {
	return pick(spec, coll, func(hook, mech string, p *ebpf.Program) error { return p.Close() })
}
