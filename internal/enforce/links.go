package enforce

import (
	"fmt"

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
