package enforce

import (
	"fmt"
	"os"

	"github.com/cilium/ebpf"
)

// ProgramIDs returns the kernel ids of progs by name, so tests can match a
// group's programs against LinkedPrograms (what the kernel runs).
func ProgramIDs(progs map[string]*ebpf.Program) (map[string]ebpf.ProgramID, error) {
	out := make(map[string]ebpf.ProgramID, len(progs))
	for name, p := range progs {
		info, err := p.Info()
		if err != nil {
			return nil, fmt.Errorf("program %s info: %w", name, err)
		}
		id, ok := info.ID()
		if !ok {
			return nil, fmt.Errorf("program %s: the kernel reports no id", name)
		}
		out[name] = id
	}
	return out, nil
}

// DetachGroup removes a hook group's pinned links (LinkPinDir): its
// programs stop once no process holds the links. what names the group in
// the error.
func DetachGroup(pinDir, group, what string) error {
	if err := os.RemoveAll(LinkPinDir(pinDir, group)); err != nil {
		return fmt.Errorf("detach %s: %w", what, err)
	}
	return nil
}
