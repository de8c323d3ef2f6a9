package agent

import (
	"strings"

	"github.com/watcherhq/watcher/internal/launch"
	"github.com/watcherhq/watcher/internal/policy"
)

// MetadataRefusals turns the metadata changes watcher exec's supervisor
// refused (chmod, chown, xattrs, times outside the writable paths) into
// refusals naming the rule and the line that would allow the write.
func MetadataRefusals(p *policy.Policy, sb *policy.Sandbox, refused []launch.MetaRefusal, dropped int) []Refusal {
	files := p.FileRules(sb)
	var out []Refusal
	index := map[string]int{}
	for _, m := range refused {
		key := m.Syscall + "\x00" + m.Path + "\x00" + m.Reason
		if j, ok := index[key]; ok {
			out[j].Count++
			continue
		}
		r := Refusal{Operation: m.Syscall, Path: m.Path, Layer: "seccomp-notify", Result: "refused", Errno: "EPERM", Count: 1, Process: m.Process}
		if strings.HasPrefix(m.Reason, "not writable") {
			fileAllow(&r, files, "", m.Path, true, "files")
		} else {
			r.Note = m.Reason
		}
		index[key] = len(out)
		out = append(out, r)
	}
	if dropped > 0 {
		out = append(out, Refusal{Operation: "metadata", Layer: "seccomp-notify", Result: "refused", Errno: "EPERM",
			Count: dropped, Note: "more metadata changes were refused than the run keeps one by one"})
	}
	return out
}
