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
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/enforce"
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
	for _, p := range spec.Programs {
		out = append(out, p.AttachTo)
	}
	sort.Strings(out)
	return out
}

// programsByHook maps hook name -> program name in the spec.
func programsByHook(spec *ebpf.CollectionSpec) map[string]string {
	out := map[string]string{}
	for name, p := range spec.Programs {
		out[p.AttachTo] = name
	}
	return out
}

// Load loads every LSM program with the engine's shared maps, attaches
// them (or adopts the pinned links) and pins the links. It returns the
// group even when some hooks failed; the error is then a *LoadError. It
// returns a nil group only when nothing could be set up (the rule maps).
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
	}
	if err := os.MkdirAll(l.linkDir, 0o700); err != nil {
		maps.Close()
		return nil, fmt.Errorf("create lsm link pin dir: %w", err)
	}
	progs := loadPrograms(spec, maps)
	defer func() {
		for _, r := range progs {
			if r.prog != nil {
				r.prog.Close()
			}
		}
	}()
	failed := map[string]error{}
	for hook, r := range progs {
		err := r.err
		if err != nil {
			err = fmt.Errorf("load: %w", err)
		} else {
			err = l.attach(hook, r.prog)
		}
		if err != nil {
			failed[hook] = err
			l.status[hook] = err
			continue
		}
		l.status[hook] = nil
	}
	if len(failed) > 0 {
		return l, &LoadError{Hooks: failed}
	}
	return l, nil
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

// loadPrograms loads every program against already created maps, keyed by
// hook. All at once first (one pass, seconds faster under emulation); when
// that fails, one by one so each hook gets its own verdict.
func loadPrograms(spec *ebpf.CollectionSpec, maps *ebpf.Collection) map[string]loadResult {
	out := map[string]loadResult{}
	byHook := programsByHook(spec)
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{MapReplacements: maps.Maps})
	if err == nil {
		for hook, prog := range byHook {
			out[hook] = loadResult{prog: coll.Programs[prog]}
			delete(coll.Programs, prog)
		}
		coll.Close()
		return out
	}
	for hook, prog := range byHook {
		p, err := loadProgram(spec, prog, maps)
		out[hook] = loadResult{prog: p, err: err}
	}
	return out
}

// loadProgram loads one program of the spec against already created maps.
func loadProgram(spec *ebpf.CollectionSpec, prog string, maps *ebpf.Collection) (*ebpf.Program, error) {
	ps := spec.Copy()
	for name := range ps.Programs {
		if name != prog {
			delete(ps.Programs, name)
		}
	}
	coll, err := ebpf.NewCollectionWithOptions(ps, ebpf.CollectionOptions{MapReplacements: maps.Maps})
	if err != nil {
		return nil, explain(err)
	}
	p := coll.Programs[prog]
	delete(coll.Programs, prog)
	coll.Close()
	return p, nil
}

// explain adds what an EPERM at load means: the kernel refused the LSM
// program before verifying it (cilium/ebpf's MEMLOCK hint is misleading
// once the memlock limit is gone).
func explain(err error) error {
	if !errors.Is(err, unix.EPERM) {
		return err
	}
	const why = "kernel refused to load the BPF LSM program (EPERM before verification; the MEMLOCK hint does not apply, the limit is lifted)"
	lsms, rerr := os.ReadFile("/sys/kernel/security/lsm")
	switch {
	case rerr != nil:
		return fmt.Errorf("%s; active LSM list unknown (%v): %w", why, rerr, err)
	case !slices.Contains(strings.Split(strings.TrimSpace(string(lsms)), ","), "bpf"):
		return fmt.Errorf("%s; `bpf` is not in the active LSM list %q (boot with lsm=...,bpf): %w",
			why, strings.TrimSpace(string(lsms)), err)
	default:
		return fmt.Errorf("%s although `bpf` is an active LSM: this kernel denies BPF trampolines: %w", why, err)
	}
}

// attach attaches hook's program p, adopting or replacing a pinned link.
func (l *LSM) attach(hook string, p *ebpf.Program) error {
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

	lk, err := link.AttachLSM(link.LSMOptions{Program: p})
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

// Probe loads each LSM program once with private, unpinned maps and
// reports per hook whether this kernel accepts it (nil) or why not. It
// attaches nothing and pins nothing.
func Probe() map[string]error {
	out := map[string]error{}
	spec, err := loadLsm()
	if err != nil {
		return map[string]error{"*": fmt.Errorf("load lsm spec: %w", err)}
	}
	fail := func(err error) map[string]error {
		for hook := range programsByHook(spec) {
			out[hook] = err
		}
		return out
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
	maps, err := loadMaps(spec, &ebpf.CollectionOptions{})
	if err != nil {
		return fail(err)
	}
	defer maps.Close()
	for hook, r := range loadPrograms(spec, maps) {
		out[hook] = r.err
		if r.prog != nil {
			r.prog.Close()
		}
	}
	return out
}
