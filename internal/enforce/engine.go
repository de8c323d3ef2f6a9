// Package enforce loads watcher's BPF programs, attaches and pins them,
// manages the set of sandbox cgroups and the policy maps, and reads the
// kernel's events.
//
// Every BPF object shares the maps of bpf/include/common.h (sandbox set,
// ring buffers, drop counters) through pinning by name under PinDir: the
// Engine creates them first from the core object, hook groups adopt them
// at load, and a restarted agent adopts the same pins, so enforcement never
// stops while the agent is away.
package enforce

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/enforce/rules"
)

// DefaultPinDir is where programs, links and maps are pinned.
const DefaultPinDir = "/sys/fs/bpf/watcher"

// Sandbox flags, mirrored from bpf/include/common.h (SANDBOX_F_*).
const (
	// SandboxRecordOnly downgrades block and kill actions to record.
	SandboxRecordOnly = rules.SandboxRecordOnly
)

// Options configure an Engine.
type Options struct {
	// PinDir is the bpffs directory holding the pins; DefaultPinDir when empty.
	PinDir string
}

// Engine owns the shared maps and the sandbox set.
type Engine struct {
	pinDir string
	maps   coreMaps

	mu  sync.Mutex
	gen uint64
}

// Open creates (or adopts) the shared maps pinned under opts.PinDir.
func Open(opts Options) (*Engine, error) {
	pinDir := opts.PinDir
	if pinDir == "" {
		pinDir = DefaultPinDir
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("remove memlock limit: %w", err)
	}
	if err := EnsureBPFFS(filepath.Dir(pinDir)); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(MapPinDir(pinDir), 0o700); err != nil {
		return nil, fmt.Errorf("create pin dir: %w", err)
	}
	e := &Engine{pinDir: pinDir}
	if err := loadCoreObjects(&e.maps, e.CollectionOptions()); err != nil {
		return nil, fmt.Errorf("load shared maps: %w", err)
	}
	var gen uint64
	if err := e.maps.SandboxGen.Lookup(uint32(0), &gen); err != nil {
		e.maps.Close()
		return nil, fmt.Errorf("read sandbox generation: %w", err)
	}
	e.gen = gen
	return e, nil
}

// MapPinDir is the directory where maps are pinned by name.
func MapPinDir(pinDir string) string { return filepath.Join(pinDir, "maps") }

// LinkPinDir is the directory where a hook group pins its links.
func LinkPinDir(pinDir, group string) string { return filepath.Join(pinDir, "links", group) }

// PinDir returns the engine's pin directory.
func (e *Engine) PinDir() string { return e.pinDir }

// CollectionOptions returns the options every hook group must load with, so
// its copies of the shared maps resolve to the pinned instances.
func (e *Engine) CollectionOptions() *ebpf.CollectionOptions {
	return &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: MapPinDir(e.pinDir)}}
}

// AlertRing and RoutineRing are the two ring buffers.
func (e *Engine) AlertRing() *ebpf.Map   { return e.maps.AlertEvents }
func (e *Engine) RoutineRing() *ebpf.Map { return e.maps.RoutineEvents }

// SandboxMap is the shared sandbox set: every watcher program uses it, which
// is how the agent tells its programs from others (BPF statistics).
func (e *Engine) SandboxMap() *ebpf.Map { return e.maps.Sandboxes }

// AddSandbox registers the cgroup at path (absolute, or relative to the
// cgroup2 mount) and everything below it as sandbox id. It returns the
// cgroup id.
func (e *Engine) AddSandbox(path string, id, flags uint32) (uint64, error) {
	abs, err := cgroupfs.Abs(path)
	if err != nil {
		return 0, fmt.Errorf("add sandbox: %w", err)
	}
	cg, err := cgroupfs.ID(abs)
	if err != nil {
		return 0, fmt.Errorf("add sandbox: %w", err)
	}
	if id == 0 {
		return 0, errors.New("add sandbox: id must be > 0")
	}
	return cg, e.AddSandboxID(cg, id, flags)
}

// AddSandboxID registers a sandbox by cgroup id.
func (e *Engine) AddSandboxID(cg uint64, id, flags uint32) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.maps.Sandboxes.Put(cg, coreSandbox{Id: id, Flags: flags}); err != nil {
		return fmt.Errorf("add sandbox %d: %w", cg, err)
	}
	return e.bumpGenLocked()
}

// RemoveSandbox unregisters a sandbox by cgroup id.
func (e *Engine) RemoveSandbox(cg uint64) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.maps.Sandboxes.Delete(cg); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("remove sandbox %d: %w", cg, err)
	}
	return e.bumpGenLocked()
}

// Sandboxes lists the registered sandboxes: cgroup id -> id, flags.
func (e *Engine) Sandboxes() (map[uint64][2]uint32, error) {
	out := map[uint64][2]uint32{}
	var k uint64
	var v coreSandbox
	it := e.maps.Sandboxes.Iterate()
	for it.Next(&k, &v) {
		out[k] = [2]uint32{v.Id, v.Flags}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	return out, nil
}

// bumpGenLocked invalidates the kernel's membership cache.
func (e *Engine) bumpGenLocked() error {
	e.gen++
	if err := e.maps.SandboxGen.Put(uint32(0), e.gen); err != nil {
		return fmt.Errorf("bump sandbox generation: %w", err)
	}
	return nil
}

// SetAgentPID tells the kernel side which process is the agent, so signals
// and ptrace from sandboxes to it can be refused.
func (e *Engine) SetAgentPID(pid int) error {
	if err := e.maps.AgentTgid.Put(uint32(0), uint32(pid)); err != nil {
		return fmt.Errorf("set agent pid: %w", err)
	}
	return nil
}

// RingDrops returns the failed ring buffer reservations so far, summed over
// CPUs: alert ring, routine ring.
func (e *Engine) RingDrops() (alert, routine uint64, err error) {
	sum := func(idx uint32) (uint64, error) {
		var per []uint64
		if err := e.maps.RingbufDrops.Lookup(idx, &per); err != nil {
			return 0, fmt.Errorf("read ring drops: %w", err)
		}
		var s uint64
		for _, v := range per {
			s += v
		}
		return s, nil
	}
	if alert, err = sum(0); err != nil {
		return
	}
	routine, err = sum(1)
	return
}

// Close releases the engine's file descriptors; pins (and so enforcement)
// stay. Use Unpin to remove them.
func (e *Engine) Close() error { return e.maps.Close() }

// Unpin removes every pin under the engine's pin directory: enforcement by
// pinned links stops once no process holds them.
func Unpin(pinDir string) error {
	if pinDir == "" {
		pinDir = DefaultPinDir
	}
	if err := os.RemoveAll(pinDir); err != nil {
		return fmt.Errorf("unpin %s: %w", pinDir, err)
	}
	return nil
}

// ProbeEach loads every program of spec alone (with its maps) and reports
// per program name whether the kernel accepts it, so the agent can say which
// hook is available and which mechanism enforces each rule.
func ProbeEach(spec *ebpf.CollectionSpec, opts ebpf.CollectionOptions) map[string]error {
	out := map[string]error{}
	for name := range spec.Programs {
		one := spec.Copy()
		for other := range one.Programs {
			if other != name {
				delete(one.Programs, other)
			}
		}
		coll, err := ebpf.NewCollectionWithOptions(one, opts)
		if err == nil {
			coll.Close()
		}
		out[name] = err
	}
	return out
}

// ReplacePin pins l at path, replacing a link pinned there by an earlier
// agent: the old link stays attached until the new one is pinned, so the
// hook is never left without a program (overlap, never a gap).
func ReplacePin(l link.Link, path string) error {
	old, err := link.LoadPinnedLink(path, nil)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		// Not a link (a stale file): remove it.
		if rmErr := os.Remove(path); rmErr != nil {
			return fmt.Errorf("replace %s: %w", path, err)
		}
		old = nil
	}
	if old != nil {
		defer old.Close()
		if err := old.Unpin(); err != nil {
			return fmt.Errorf("unpin old link: %w", err)
		}
	}
	return l.Pin(path)
}

// EnsureBPFFS mounts bpffs at dir (normally /sys/fs/bpf) when it is not
// already a bpffs mount.
func EnsureBPFFS(dir string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err == nil && st.Type == unix.BPF_FS_MAGIC {
		return nil
	}
	// dir may be a subdirectory of a bpffs mount (tests use one).
	for p := dir; p != "/" && p != "."; p = filepath.Dir(p) {
		if err := unix.Statfs(p, &st); err == nil && st.Type == unix.BPF_FS_MAGIC {
			return nil
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("mount bpffs: %w", err)
	}
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("mount bpffs at %s: %w", dir, err)
	}
	return nil
}
