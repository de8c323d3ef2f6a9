// Package ipcobj follows the System V IPC objects (shared memory segments,
// semaphore sets, message queues) and /dev/shm files that sandbox
// processes create, and removes them when the sandbox's workspace is
// rolled back.
//
// `watcher exec` gives each command its own IPC namespace and /dev/shm,
// which die with it. A sandbox a container runtime placed may share the
// host's (docker run --ipc=host, or a process written into the sandbox
// cgroup): what it creates there outlives its processes. The kernel side
// (bpf/ipc.c) records each object a sandbox process created, by its
// kernel identity (namespace and id, or device and inode) and the sandbox
// root cgroup, in a pinned map; Table reads it and Remove deletes the
// objects that are still the ones recorded, nothing else.
package ipcobj

import (
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/cilium/ebpf"

	"github.com/watcherhq/watcher/internal/enforce"
)

// Group names this group's link pin directory (enforce.LinkPinDir).
const Group = "ipc"

// Program names, also the names of their link pins.
const (
	ProgSysEnter = "sys_enter"
	ProgSysExit  = "sys_exit"
)

// Tracker is the loaded kernel side.
type Tracker struct {
	pinDir string
	objs   ipcObjects

	mu    sync.Mutex
	links *enforce.PinnedLinks
}

// Load loads the programs with the engine's shared maps (the sandbox set)
// and pins this group's maps beside them.
func Load(eng *enforce.Engine) (*Tracker, error) {
	t := &Tracker{pinDir: eng.PinDir(), links: enforce.NewPinnedLinks(eng.PinDir(), Group)}
	if err := loadIpcObjects(&t.objs, eng.CollectionOptions()); err != nil {
		return nil, fmt.Errorf("load ipc tracking: %w", err)
	}
	if err := t.objs.IpcCfg.Put(uint32(0), ipcIpcConfig{SeqShift: seqShift()}); err != nil {
		t.objs.Close()
		return nil, fmt.Errorf("ipc tracking config: %w", err)
	}
	return t, nil
}

// seqShift is the kernel's ipcmni_seq_shift(): where the sequence number
// starts in an IPC id.
func seqShift() uint32 {
	data, _ := os.ReadFile("/proc/cmdline")
	for _, f := range strings.Fields(string(data)) {
		if f == "ipcmni_extend" {
			return 24
		}
	}
	return 15
}

// SetAttached attaches (pinned, so tracking goes on while the agent is
// away) or detaches the two syscall tracepoints. Any syscall tracepoint
// puts every task of the host on the syscall slow path, so the agent
// attaches them only while some sandbox needs them.
func (t *Tracker) SetAttached(on bool) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !on {
		for _, name := range []string{ProgSysEnter, ProgSysExit} {
			if err := t.links.Detach(name); err != nil {
				return fmt.Errorf("ipc: %w", err)
			}
		}
		return nil
	}
	// sys_exit first: every entry mark then meets its exit (an exit
	// without a mark records nothing).
	if err := t.links.Attach(ProgSysExit, t.objs.IpcSysExit); err != nil {
		return fmt.Errorf("ipc: %w", err)
	}
	if err := t.links.Attach(ProgSysEnter, t.objs.IpcSysEnter); err != nil {
		return fmt.Errorf("ipc: %w", err)
	}
	return nil
}

// Attached reports whether both programs are attached by this Tracker.
func (t *Tracker) Attached() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.links.Held(ProgSysEnter) && t.links.Held(ProgSysExit)
}

// ProgramIDs returns the kernel ids of the programs by name.
func (t *Tracker) ProgramIDs() (map[string]ebpf.ProgramID, error) {
	return enforce.ProgramIDs(map[string]*ebpf.Program{ProgSysEnter: t.objs.IpcSysEnter, ProgSysExit: t.objs.IpcSysExit})
}

// NameRoot records that the root cgroup cg belongs to the named sandbox,
// so its objects are found after the cgroup is gone.
func (t *Tracker) NameRoot(cg uint64, sandbox string) error {
	var v ipcIpcRootName
	if len(sandbox) >= len(v.Name) {
		return fmt.Errorf("name root: sandbox name %q longer than %d bytes", sandbox, len(v.Name)-1)
	}
	for i := 0; i < len(sandbox); i++ {
		v.Name[i] = int8(sandbox[i])
	}
	if err := t.objs.IpcRoots.Put(cg, v); err != nil {
		return fmt.Errorf("name root %d: %w", cg, err)
	}
	return nil
}

// Close releases descriptors; pinned links keep recording.
func (t *Tracker) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.links.Close()
	t.links = enforce.NewPinnedLinks(t.pinDir, Group)
	return t.objs.Close()
}

// Detach removes this group's pinned links.
func Detach(pinDir string) error { return enforce.DetachGroup(pinDir, Group, "ipc tracking") }
