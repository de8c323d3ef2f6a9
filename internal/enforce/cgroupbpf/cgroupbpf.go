// Package cgroupbpf enforces device, sysctl, socket-creation and listener
// rules on sandbox cgroups with cgroup BPF programs (bpf/cgroup.c):
// cgroup/dev, cgroup/sysctl, cgroup/sock_create, cgroup/bind4 and bind6,
// sockops and cgroup_skb/ingress. They refuse the operation with a real
// EPERM on every kernel with cgroup v2 BPF, including hosts where BPF LSM
// programs cannot load. cgroup/sock_create sees only AF_INET and AF_INET6
// sockets (see DefaultSocketRules); listen(2) itself has no cgroup hook
// (see ListenRule).
//
// The programs attach to each sandbox root cgroup (descendants inherit
// them; other programs on the same cgroup keep running) and their links are
// pinned under enforce.LinkPinDir(pinDir, "cgroup")/<cgroup id>/, so
// enforcement continues while the agent restarts. A restarted agent that
// attaches again replaces the programs of the pinned links atomically
// (BPF_LINK_UPDATE): there is no moment without a program. The rule maps
// are pinned by name next to the shared maps, so old and new programs read
// the same rules.
package cgroupbpf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/enforce"
)

// Group is the hook group name used for link pins.
const Group = "cgroup"

// Any matches every value of a rule field (ANY in bpf/cgroup.c).

const anyKey = ^uint32(0)

// hook describes one program of the group.
type hook struct {
	name   string // pin file name and Probe key
	attach ebpf.AttachType
	prog   func(*cgroupObjects) *ebpf.Program
}

var hooks = []hook{
	{"dev", ebpf.AttachCGroupDevice, func(o *cgroupObjects) *ebpf.Program { return o.WatcherCgDev }},
	{"sysctl", ebpf.AttachCGroupSysctl, func(o *cgroupObjects) *ebpf.Program { return o.WatcherCgSysctl }},
	{"sock_create", ebpf.AttachCGroupInetSockCreate, func(o *cgroupObjects) *ebpf.Program { return o.WatcherCgSockCreate }},
	{"bind4", ebpf.AttachCGroupInet4Bind, func(o *cgroupObjects) *ebpf.Program { return o.WatcherCgBind4 }},
	{"bind6", ebpf.AttachCGroupInet6Bind, func(o *cgroupObjects) *ebpf.Program { return o.WatcherCgBind6 }},
	{"sockops", ebpf.AttachCGroupSockOps, func(o *cgroupObjects) *ebpf.Program { return o.WatcherCgSockops }},
	{"listen_ingress", ebpf.AttachCGroupInetIngress, func(o *cgroupObjects) *ebpf.Program { return o.WatcherCgListenIngress }},
}

// Programs is the loaded cgroup program group (device, sysctl, socket
// creation, listeners).
type Programs struct {
	pinDir string
	objs   cgroupObjects

	mu sync.Mutex
}

// Load loads the cgroup programs with the engine's shared maps. Close keeps
// the pinned links (and so enforcement).
func Load(eng *enforce.Engine) (*Programs, error) {
	h := &Programs{pinDir: eng.PinDir()}
	if err := loadCgroupObjects(&h.objs, eng.CollectionOptions()); err != nil {
		return nil, fmt.Errorf("load cgroup hooks: %w", err)
	}
	return h, nil
}

// Close releases the programs' file descriptors; pinned links stay.
func (h *Programs) Close() error { return h.objs.Close() }

// sandboxPinDir is where the links of one sandbox root are pinned.
func (h *Programs) sandboxPinDir(cg uint64) string {
	return filepath.Join(enforce.LinkPinDir(h.pinDir, Group), strconv.FormatUint(cg, 10))
}

// Attach attaches the group's programs (hooks) to the sandbox root
// cgroup at path (absolute or relative to the cgroup2 mount) and pins the
// links. When links for that cgroup are already pinned (an earlier agent),
// their programs are replaced in place, without a gap. It returns the
// cgroup id.
func (h *Programs) Attach(path string) (uint64, error) {
	abs, err := cgroupfs.Abs(path)
	if err != nil {
		return 0, fmt.Errorf("attach cgroup hooks: %w", err)
	}
	cg, err := cgroupfs.ID(abs)
	if err != nil {
		return 0, fmt.Errorf("attach cgroup hooks: %w", err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	dir := h.sandboxPinDir(cg)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return 0, fmt.Errorf("attach cgroup hooks: %w", err)
	}
	for _, hk := range hooks {
		pin := filepath.Join(dir, hk.name)
		prog := hk.prog(&h.objs)
		if old, err := link.LoadPinnedLink(pin, nil); err == nil {
			err = old.Update(prog)
			old.Close()
			if err == nil {
				continue
			}
			// The pinned link is broken (its cgroup was removed and
			// recreated, say): attach anew, then drop the old pin.
		}
		l, err := link.AttachCgroup(link.CgroupOptions{Path: abs, Attach: hk.attach, Program: prog})
		if err != nil {
			return 0, fmt.Errorf("attach cgroup/%s to %s: %w", hk.name, abs, err)
		}
		tmp := filepath.Join(dir, "new-"+hk.name) // bpffs refuses dots in names
		_ = os.Remove(tmp)
		if err := l.Pin(tmp); err != nil {
			l.Close()
			return 0, fmt.Errorf("pin cgroup/%s link: %w", hk.name, err)
		}
		if err := os.Rename(tmp, pin); err != nil {
			l.Unpin()
			l.Close()
			return 0, fmt.Errorf("pin cgroup/%s link: %w", hk.name, err)
		}
		l.Close()
	}
	return cg, nil
}

// Detach detaches the programs from the sandbox root with cgroup id cg and
// removes the pins. Detaching a sandbox that has none is not an error.
func (h *Programs) Detach(cg uint64) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return detachPins(h.sandboxPinDir(cg))
}

func detachPins(dir string) error {
	var errs []error
	for _, hk := range hooks {
		pin := filepath.Join(dir, hk.name)
		l, err := link.LoadPinnedLink(pin, nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			// Not loadable as a link: remove the stale pin anyway.
			if rmErr := os.Remove(pin); rmErr != nil {
				errs = append(errs, fmt.Errorf("remove pin %s: %w", pin, rmErr))
			}
			continue
		}
		// Detach first: the cgroup stops running the program even if
		// another process still holds the link.
		if err := l.Detach(); err != nil && !errors.Is(err, ebpf.ErrNotSupported) {
			errs = append(errs, fmt.Errorf("detach cgroup/%s: %w", hk.name, err))
		}
		if err := l.Unpin(); err != nil {
			errs = append(errs, fmt.Errorf("unpin cgroup/%s: %w", hk.name, err))
		}
		l.Close()
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("remove %s: %w", dir, err))
	}
	return errors.Join(errs...)
}

// Attached lists the cgroup ids with pinned links of this group.
func (h *Programs) Attached() ([]uint64, error) {
	ents, err := os.ReadDir(enforce.LinkPinDir(h.pinDir, Group))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list cgroup hook pins: %w", err)
	}
	var out []uint64
	for _, e := range ents {
		if cg, err := strconv.ParseUint(e.Name(), 10, 64); err == nil && e.IsDir() {
			out = append(out, cg)
		}
	}
	return out, nil
}

// Probe reports, per program of the group ("dev", "sysctl",
// "sock_create", "bind4", "bind6", "sockops", "listen_ingress"), whether the kernel loads it: nil, or the error. It loads
// private, unpinned copies of the maps and touches nothing shared.
func Probe() map[string]error {
	out := map[string]error{}
	spec, err := loadCgroup()
	if err != nil {
		for _, hk := range hooks {
			out[hk.name] = fmt.Errorf("read object: %w", err)
		}
		return out
	}
	for _, m := range spec.Maps {
		m.Pinning = ebpf.PinNone
		if m.Type == ebpf.RingBuf {
			m.MaxEntries = 64 * 1024 // a probe needs no room for events
		}
	}
	progNames := map[string]string{
		"dev": "watcher_cg_dev", "sysctl": "watcher_cg_sysctl", "sock_create": "watcher_cg_sock_create",
		"bind4": "watcher_cg_bind4", "bind6": "watcher_cg_bind6", "sockops": "watcher_cg_sockops",
		"listen_ingress": "watcher_cg_listen_ingress",
	}
	loaded := enforce.ProbeEach(spec, ebpf.CollectionOptions{})
	for _, hk := range hooks {
		out[hk.name] = nil
		if err := loaded[progNames[hk.name]]; err != nil {
			out[hk.name] = fmt.Errorf("load cgroup/%s: %w", hk.name, err)
		}
	}
	return out
}
