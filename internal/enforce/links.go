package enforce

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// LinkedPrograms asks the kernel which programs have a live link (pinned or
// held by any process) and returns the number of links per program id. It
// is what tests and `watcher status` rely on to say a program runs, rather
// than the agent's own record of what it attached.
func LinkedPrograms() (map[ebpf.ProgramID]int, error) {
	out := map[ebpf.ProgramID]int{}
	it := new(link.Iterator)
	defer it.Close()
	for it.Next() {
		info, err := it.Link.Info()
		if err != nil {
			continue // gone since it was listed
		}
		out[info.Program]++
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("list bpf links: %w", err)
	}
	return out, nil
}

// PinnedLinks are a hook group's tracing links by program name, each
// pinned under the group's link directory (LinkPinDir) so it outlives the
// agent. Callers serialise the calls.
type PinnedLinks struct {
	dir   string
	links map[string]link.Link
}

// NewPinnedLinks returns the (empty) set of group's links under pinDir.
func NewPinnedLinks(pinDir, group string) *PinnedLinks {
	return &PinnedLinks{dir: LinkPinDir(pinDir, group), links: map[string]link.Link{}}
}

// Attach attaches prog as the tracing link name and pins it. A link a
// previous agent pinned under that name is replaced only after the new
// one is attached: the two overlap. Attaching a name held already is a
// no-op.
func (p *PinnedLinks) Attach(name string, prog *ebpf.Program) error {
	if _, ok := p.links[name]; ok {
		return nil
	}
	if err := os.MkdirAll(p.dir, 0o700); err != nil {
		return fmt.Errorf("link dir: %w", err)
	}
	l, err := link.AttachTracing(link.TracingOptions{Program: prog})
	if err != nil {
		return fmt.Errorf("attach %s: %w", name, err)
	}
	if err := ReplacePin(l, filepath.Join(p.dir, name)); err != nil {
		l.Close()
		return fmt.Errorf("pin %s: %w", name, err)
	}
	p.links[name] = l
	return nil
}

// Detach removes the link name: its pin (a predecessor's too) and the
// descriptor held here.
func (p *PinnedLinks) Detach(name string) error {
	if err := os.Remove(filepath.Join(p.dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("detach %s: %w", name, err)
	}
	if l, ok := p.links[name]; ok {
		l.Close()
		delete(p.links, name)
	}
	return nil
}

// Held reports whether the link name was attached here.
func (p *PinnedLinks) Held(name string) bool {
	_, ok := p.links[name]
	return ok
}

// Names lists the links attached here, sorted.
func (p *PinnedLinks) Names() []string { return slices.Sorted(maps.Keys(p.links)) }

// Close releases the descriptors; the pinned links stay attached, and
// Held and Names still say what was attached.
func (p *PinnedLinks) Close() {
	for _, l := range p.links {
		l.Close()
	}
}
