package ipcobj

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"

	"github.com/watcherhq/watcher/internal/enforce"
)

// Kind is what an Object is.
type Kind uint32

// Kinds, as bpf/ipc.c numbers them.
const (
	KindSem     Kind = 1
	KindMsg     Kind = 2
	KindShm     Kind = 3
	KindShmFile Kind = 4
	KindMqueue  Kind = 5
)

func (k Kind) String() string {
	switch k {
	case KindSem:
		return "sem"
	case KindMsg:
		return "msg"
	case KindShm:
		return "shm"
	case KindShmFile:
		return "shm_file"
	case KindMqueue:
		return "mqueue"
	}
	return fmt.Sprintf("kind%d", uint32(k))
}

// Object is one IPC object a sandbox process created.
type Object struct {
	// Kind says which.
	Kind Kind `json:"kind"`
	// NS is the inode number of the IPC namespace (System V kinds,
	// message queues).
	NS uint32 `json:"ns,omitempty"`
	// ID is the System V id the kernel returned to the creator.
	ID int32 `json:"id,omitempty"`
	// Key is the System V key it was created with (0: IPC_PRIVATE).
	Key int32 `json:"key"`
	// Dev (kernel encoding, MAJOR<<20|MINOR) and Ino identify a /dev/shm
	// file; Path is where it was created, as the creator saw it. A POSIX
	// message queue is NS and Ino (in the namespace's mqueue
	// filesystem), Path its name (/name, at most 63 bytes kept).
	Dev  uint32 `json:"dev,omitempty"`
	Ino  uint64 `json:"ino,omitempty"`
	Path string `json:"path,omitempty"`
	// SandboxCgroup is the root cgroup id of the creator's sandbox.
	SandboxCgroup uint64 `json:"sandbox_cgroup"`
	// PID, UID and Comm describe the creating process (host pid
	// namespace).
	PID  uint32 `json:"pid"`
	UID  uint32 `json:"uid"`
	Comm string `json:"comm"`
}

// String is how a ledger record lists the object.
func (o Object) String() string {
	switch o.Kind {
	case KindShmFile:
		return fmt.Sprintf("shm_file %s (dev %d:%d ino %d, pid %d %s)", o.Path, o.Dev>>20, o.Dev&(1<<20-1), o.Ino, o.PID, o.Comm)
	case KindMqueue:
		return fmt.Sprintf("mqueue %s ipc:[%d] (ino %d, pid %d %s)", o.Path, o.NS, o.Ino, o.PID, o.Comm)
	}
	return fmt.Sprintf("%s id %d key 0x%08x ipc:[%d] (pid %d %s)", o.Kind, o.ID, uint32(o.Key), o.NS, o.PID, o.Comm)
}

// ErrNotTracked is returned by OpenTable when no agent has loaded the
// tracking under the pin directory.
var ErrNotTracked = errors.New("IPC objects are not tracked here (no agent has loaded the ipc group)")

// Table is the kernel's record of created objects, opened from the pins.
type Table struct {
	objects, roots, overflow *ebpf.Map
}

// OpenTable opens the pinned maps under pinDir.
func OpenTable(pinDir string) (*Table, error) {
	dir := enforce.MapPinDir(pinDir)
	t := &Table{}
	for _, m := range []struct {
		name string
		dst  **ebpf.Map
	}{{"ipc_objects", &t.objects}, {"ipc_roots", &t.roots}, {"ipc_overflow", &t.overflow}} {
		mp, err := ebpf.LoadPinnedMap(filepath.Join(dir, m.name), nil)
		if err != nil {
			t.Close()
			if errors.Is(err, os.ErrNotExist) {
				return nil, ErrNotTracked
			}
			return nil, fmt.Errorf("open %s: %w", m.name, err)
		}
		*m.dst = mp
	}
	return t, nil
}

// Close releases the maps.
func (t *Table) Close() error {
	for _, m := range []*ebpf.Map{t.objects, t.roots, t.overflow} {
		if m != nil {
			m.Close()
		}
	}
	return nil
}

// Sandbox lists the objects created in the named sandbox: those whose
// root cgroup the agent named so, or whose root is one of roots (cgroup
// ids of the sandbox's cgroups found now).
func (t *Table) Sandbox(name string, roots []uint64) ([]Object, error) {
	names := map[uint64]string{}
	var cg uint64
	var rn ipcIpcRootName
	it := t.roots.Iterate()
	for it.Next(&cg, &rn) {
		names[cg] = cstr(rn.Name[:])
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("list sandbox roots: %w", err)
	}
	for _, r := range roots {
		if _, ok := names[r]; !ok {
			names[r] = name
		}
	}
	var out []Object
	var k ipcIpcObjKey
	var v ipcIpcObj
	oit := t.objects.Iterate()
	for oit.Next(&k, &v) {
		if names[v.SandboxCg] != name {
			continue
		}
		o := Object{Kind: Kind(k.Kind), Key: v.Key, SandboxCgroup: v.SandboxCg, PID: v.Tgid, UID: v.Uid, Comm: cstr8(v.Comm[:])}
		switch o.Kind {
		case KindShmFile:
			o.Dev, o.Ino, o.Path = k.Ns, k.Obj, cstr(v.Name[:])
		case KindMqueue:
			o.NS, o.Ino, o.Path = k.Ns, k.Obj, cstr(v.Name[:])
		default:
			o.NS, o.ID = k.Ns, int32(uint32(k.Obj))
		}
		out = append(out, o)
	}
	if err := oit.Err(); err != nil {
		return nil, fmt.Errorf("list ipc objects: %w", err)
	}
	return out, nil
}

// Forget deletes the objects' entries.
func (t *Table) Forget(objs []Object) error {
	var errs []error
	for _, o := range objs {
		if err := t.objects.Delete(o.key()); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("forget ipc objects: %w", err)
	}
	return nil
}

// Overflow is how many creations went unrecorded because the table was
// full (since the maps were created).
func (t *Table) Overflow() (uint64, error) {
	var n uint64
	if err := t.overflow.Lookup(uint32(0), &n); err != nil {
		return 0, fmt.Errorf("read ipc overflow: %w", err)
	}
	return n, nil
}

func (o Object) key() ipcIpcObjKey {
	switch o.Kind {
	case KindShmFile:
		return ipcIpcObjKey{Kind: uint32(o.Kind), Ns: o.Dev, Obj: o.Ino}
	case KindMqueue:
		return ipcIpcObjKey{Kind: uint32(o.Kind), Ns: o.NS, Obj: o.Ino}
	}
	return ipcIpcObjKey{Kind: uint32(o.Kind), Ns: o.NS, Obj: uint64(uint32(o.ID))}
}

func cstr(b []int8) string {
	s := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		s = append(s, byte(c))
	}
	return string(s)
}

func cstr8(b []uint8) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}
