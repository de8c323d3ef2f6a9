package egress

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/enforce"
)

// Sockets made outside a sandbox: the kernel runs cgroup sock_addr programs
// for the cgroup a socket was made in, so a socket inherited across the
// move into a sandbox or received from a process outside (SCM_RIGHTS,
// pidfd_getfd) never reaches the sandbox's programs. The foreign programs
// (bpf/include/egress_foreign.h) are attached once, to the cgroup v2 root,
// and refuse a sandboxed task's connect or addressed send on such a socket
// (reason 13). A socket already connected when it came in is not judged:
// no hook runs for its send and write calls (known-limits.md).

// hostLinkDir is where the root-attached links are pinned, beside the
// per-sandbox directories (named by cgroup id).
const hostLinkDir = "host"

// hostLinkKey keys the root-attached links in Egress.links (no cgroup has
// id 0).
const hostLinkKey = 0

type foreignPrograms struct {
	EgressForeignConnect4 *ebpf.Program `ebpf:"egress_foreign_connect4"`
	EgressForeignConnect6 *ebpf.Program `ebpf:"egress_foreign_connect6"`
	EgressForeignSendmsg4 *ebpf.Program `ebpf:"egress_foreign_sendmsg4"`
	EgressForeignSendmsg6 *ebpf.Program `ebpf:"egress_foreign_sendmsg6"`
}

type foreignUnixPrograms struct {
	EgressForeignConnectUnix *ebpf.Program `ebpf:"egress_foreign_connect_unix"`
	EgressForeignSendmsgUnix *ebpf.Program `ebpf:"egress_foreign_sendmsg_unix"`
}

type namedProgram struct {
	name   string
	prog   *ebpf.Program
	attach ebpf.AttachType
}

func (o *objects) foreignPrograms() []namedProgram {
	return []namedProgram{
		{"connect4", o.foreign.EgressForeignConnect4, ebpf.AttachCGroupInet4Connect},
		{"connect6", o.foreign.EgressForeignConnect6, ebpf.AttachCGroupInet6Connect},
		{"sendmsg4", o.foreign.EgressForeignSendmsg4, ebpf.AttachCGroupUDP4Sendmsg},
		{"sendmsg6", o.foreign.EgressForeignSendmsg6, ebpf.AttachCGroupUDP6Sendmsg},
		{"connect_unix", o.foreignUnix.EgressForeignConnectUnix, ebpf.AttachCgroupUnixConnect},
		{"sendmsg_unix", o.foreignUnix.EgressForeignSendmsgUnix, ebpf.AttachCgroupUnixSendmsg},
	}
}

// ForeignErr is nil when sockets made outside a sandbox are judged, or says
// why they are not (a kernel without bpf_sk_cgroup_id in cgroup sock_addr
// programs, or the attach to the cgroup v2 root failed).
func (e *Egress) ForeignErr() error { return e.foreignErr }

// ProbeForeign reports whether this kernel loads the foreign-socket
// programs (nil) or why not, without touching pinned state or attaching.
func ProbeForeign() error {
	spec, err := loadEgress()
	if err != nil {
		return err
	}
	for name := range spec.Programs {
		if !strings.Contains(name, "_foreign_") || strings.HasSuffix(name, "_unix") {
			delete(spec.Programs, name)
		}
	}
	for _, m := range spec.Maps {
		m.Pinning = ebpf.PinNone
	}
	for name, err := range enforce.ProbeEach(spec, ebpf.CollectionOptions{}) {
		if err != nil {
			return fmt.Errorf("sockets made outside a sandbox are not judged: %s: %w", name, err)
		}
	}
	return nil
}

// loadForeign loads the foreign-socket programs and attaches them to the
// cgroup v2 root; failing, it records why in foreignErr.
func (e *Egress) loadForeign(spec *ebpf.CollectionSpec, copts *ebpf.CollectionOptions) {
	if err := spec.LoadAndAssign(&e.objs.foreign, copts); err != nil {
		e.foreignErr = fmt.Errorf("sockets made outside a sandbox are not judged: %w", err)
		return
	}
	// The unix pair needs the kernel's unix socket hooks (6.7+), as the
	// sandbox's own unix programs do.
	if e.unixErr == nil {
		if err := spec.LoadAndAssign(&e.objs.foreignUnix, copts); err != nil {
			e.foreignErr = fmt.Errorf("unix sockets made outside a sandbox are not judged: %w", err)
		}
	}
	if err := e.SetForeign(true); err != nil {
		e.foreignErr = fmt.Errorf("sockets made outside a sandbox are not judged: %w", err)
	}
}

// SetForeign attaches the foreign-socket programs to the cgroup v2 root
// (on) or removes them (off: the host-wide cost gone, and sockets made
// outside a sandbox unjudged). Load attaches them; benchmarks compare.
func (e *Egress) SetForeign(on bool) error {
	dir := filepath.Join(enforce.LinkPinDir(e.pinDir, Group), hostLinkDir)
	if on {
		root, err := cgroupfs.Mountpoint()
		if err != nil {
			return err
		}
		return e.attachAt(root, dir, e.objs.foreignAttachable(), hostLinkKey)
	}
	var errs []error
	for _, p := range e.objs.foreignPrograms() {
		l, err := link.LoadPinnedLink(filepath.Join(dir, p.name), nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, l.Unpin(), l.Close())
	}
	e.mu.Lock()
	for _, l := range e.links[hostLinkKey] {
		errs = append(errs, l.Close())
	}
	delete(e.links, hostLinkKey)
	e.mu.Unlock()
	return errors.Join(errs...)
}

func (o *objects) foreignAttachable() []namedProgram {
	var out []namedProgram
	for _, p := range o.foreignPrograms() {
		if p.prog != nil {
			out = append(out, p)
		}
	}
	return out
}

func (o *objects) closeForeign() {
	for _, p := range o.foreignPrograms() {
		if p.prog != nil {
			p.prog.Close()
		}
	}
}

// attachAt attaches progs to the cgroup at abs and pins the links in dir
// (under key in e.links). Links already pinned there (a previous agent)
// are replaced after the new ones are attached, so enforcement has no gap.
func (e *Egress) attachAt(abs, dir string, progs []namedProgram, key uint64) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	var fresh []link.Link
	fail := func(err error) error {
		for _, l := range fresh {
			l.Close()
		}
		return fmt.Errorf("attach egress to %s: %w", abs, err)
	}
	for _, p := range progs {
		l, err := link.AttachCgroup(link.CgroupOptions{Path: abs, Attach: p.attach, Program: p.prog})
		if err != nil {
			return fail(fmt.Errorf("%s: %w", p.name, err))
		}
		fresh = append(fresh, l)
	}
	// Every new link is in force: now drop the old pins and pin the new.
	for i, p := range progs {
		pin := filepath.Join(dir, p.name)
		if old, err := link.LoadPinnedLink(pin, nil); err == nil {
			old.Unpin()
			old.Close()
		} else if !errors.Is(err, os.ErrNotExist) {
			os.Remove(pin)
		}
		if err := fresh[i].Pin(pin); err != nil {
			return fail(fmt.Errorf("pin %s: %w", p.name, err))
		}
	}
	e.mu.Lock()
	for _, l := range e.links[key] {
		l.Close()
	}
	e.links[key] = fresh
	e.mu.Unlock()
	return nil
}
