package agent

// Refusals an agent can act on: what the layers refused during one
// `watcher exec` run, each with the rule, the layer, and the policy lines
// that would allow it, so a caged agent can try a legitimate route (or ask
// for one) instead of failing blindly.

import (
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/enforce/egress"
	"github.com/watcherhq/watcher/internal/enforce/recorder"
	"github.com/watcherhq/watcher/internal/plan"
	"github.com/watcherhq/watcher/internal/policy"
	"github.com/watcherhq/watcher/internal/textesc"
	"github.com/watcherhq/watcher/pkg/toolproto"
)

// Refusal is one refused operation (or several identical ones), as
// `watcher exec --report` and the gateway's shell results carry it (defined
// once, in the gateway protocol).
type Refusal = toolproto.Refusal

// RunReport is what `watcher exec` says about one run.
type RunReport struct {
	Label    string    `json:"label,omitempty"`
	Sandbox  string    `json:"sandbox"`
	Mode     string    `json:"mode"`
	Command  string    `json:"command"`
	Outcome  string    `json:"outcome"`
	ExitCode int       `json:"exit_code"`
	Signal   string    `json:"signal,omitempty"`
	Killed   bool      `json:"killed_by_backstop"`
	Refusals []Refusal `json:"refusals"`
	// LandlockNotes are the ruleset's limits for this run (where it grants
	// more than the policy, or less).
	LandlockNotes []string `json:"landlock_notes,omitempty"`
}

// Refusals turns the run's events into refusals: denials and kills, and
// in record mode the events of rules that would have refused.
func Refusals(p *policy.Policy, sb *policy.Sandbox, events []audit.Event, workdir string) []Refusal {
	files := p.FileRules(sb)
	var out []Refusal
	index := map[string]int{}
	for i := range events {
		e := &events[i]
		r, ok := refusalOf(p, sb, files, e, workdir)
		if !ok {
			continue
		}
		key := strings.Join([]string{r.Operation, r.Path, r.Address, r.Rule, r.Layer, r.Result}, "\x00")
		if j, ok := index[key]; ok {
			out[j].Count++
			continue
		}
		r.Count = 1
		r.First = e.Time
		r.Process = fmt.Sprintf("%s[%d]", e.Process.Comm, e.Process.TGID)
		index[key] = len(out)
		out = append(out, r)
	}
	return out
}

func refusalOf(p *policy.Policy, sb *policy.Sandbox, files []policy.FileRule, e *audit.Event, workdir string) (Refusal, bool) {
	r := Refusal{Layer: e.Mechanism, Rule: e.Rule}
	switch e.Verdict {
	case audit.VerdictDenied:
		r.Result = "refused"
	case audit.VerdictKilled:
		r.Result = "killed"
	case audit.VerdictRecorded:
		if sb.Mode != policy.ModeRecord || e.Rule == "" {
			return r, false
		}
		r.Result = "would-refuse"
	default:
		return r, false
	}
	if e.Syscall != nil && e.Syscall.Ret < 0 {
		r.Errno = errnoName(-e.Syscall.Ret)
	}
	if op := plan.OperationOfSubtreeEvent(e.Message); op != "" {
		// A process, IPC object, terminal or file outside the sandbox's
		// own subtree: the target and the rule, whatever the event kind.
		r.Operation = op
		if e.Target != nil && e.Target.PID != 0 {
			r.Address = fmt.Sprintf("%s[%d]", e.Target.Comm, e.Target.PID)
		}
		if e.File != nil {
			r.Path = e.File.Path
		}
		r.Note = e.Message
		r.Allow = []string{fmt.Sprintf("operations: {%s: allow}", op)}
		if r.Layer == "" {
			r.Layer = "-"
		}
		return r, true
	}
	switch {
	case e.Kind == audit.KindFileOpen && e.File != nil:
		r.Path = e.File.Path
		write := e.File.Write
		r.Operation = "read"
		if write {
			r.Operation = "write"
		}
		// An exec seen by the kernel hooks' path check says op=exec (the
		// record of an execve the launcher refused names the syscall).
		exec := e.Syscall != nil && (e.Syscall.Name == "execve" || e.Syscall.Name == "execveat") ||
			strings.Contains(" "+e.Message+" ", " op=exec ")
		if exec {
			r.Operation = "exec"
		} else if e.Syscall != nil && write && !strings.HasPrefix(e.Syscall.Name, "open") && e.Syscall.Name != "creat" && e.Syscall.Name != "" {
			r.Operation = e.Syscall.Name // mkdir, unlink, rename...: a write of the directory entry
		}
		path := r.Path
		if path != "" && !filepath.IsAbs(path) && workdir != "" {
			path = filepath.Join(workdir, path)
		}
		if real, err := filepath.EvalSymlinks(path); err == nil {
			path = real
		}
		if exec {
			fileAllow(&r, sb.ExecRules(), sb.Exec.Default, path, false, "exec")
		} else {
			fileAllow(&r, files, "", path, write, "files")
		}
	case e.Kind == audit.KindExec:
		if e.File != nil {
			r.Path = e.File.Path
		} else {
			r.Path = e.Process.Exe
		}
		r.Operation = "exec"
		fileAllow(&r, sb.ExecRules(), sb.Exec.Default, r.Path, false, "exec")
	case e.Kind == audit.KindSyscall && e.Syscall != nil:
		r.Operation = e.Syscall.Name
		if op := plan.OperationOfSyscall(e.Syscall.Name); op != "" {
			r.Allow = []string{fmt.Sprintf("operations: {%s: allow}", op)}
		}
		if e.Mechanism == recorder.MechanismSeccomp {
			r.Note = e.Message
			if r.Allow == nil {
				r.Note += "; refused by the launcher's fixed seccomp list whatever the policy (run it in a runtime-placed cgroup instead of watcher exec)"
			}
		}
	case e.Kind == audit.KindDNS && e.DNS != nil:
		r.Operation = "resolve"
		r.Address = e.DNS.Name
		r.Note = e.DNS.Reason
		r.Allow = []string{fmt.Sprintf("dns: {allow: [%s]}", strings.TrimSuffix(e.DNS.Name, "."))}
	case (e.Kind == audit.KindNet || e.Kind == audit.KindSocket) && e.Net != nil:
		r.Operation = e.Net.Op
		if e.Net.Family == syscall.AF_UNIX {
			// A unix socket: the address is its path.
			r.Address = e.Net.Addr
			if strings.HasPrefix(e.Net.Addr, "/") {
				r.Allow = []string{fmt.Sprintf("egress: {unix: [%s]}", e.Net.Addr)}
			}
		} else if e.Net.Addr != "" {
			r.Address = fmt.Sprintf("%s:%d", e.Net.Addr, e.Net.Port)
			r.Allow = []string{fmt.Sprintf("egress: {allow: [{cidr: %s/%d}]}", e.Net.Addr, hostBits(e.Net.Addr))}
			if name := portRefusalName(e); name != "" {
				// An answered address on a port its name does not open:
				// open the port for the name, not the address for ever.
				proto := "tcp"
				if e.Net.Protocol == syscall.IPPROTO_UDP {
					proto = "udp"
				}
				r.Allow = []string{fmt.Sprintf("egress: {name_ports: [{name: %s, ports: [\"%d\"], protocol: %s}]}", name, e.Net.Port, proto)}
			}
		}
		r.Note = e.Net.Reason
		if e.Kind == audit.KindSocket {
			r.Allow = []string{"operations: {raw_sockets: allow}"}
		}
	case e.Kind == audit.KindCapability && e.Target != nil:
		r.Operation = "capability"
		r.Address = policy.CapabilityName(int(e.Target.Capability))
		r.Allow = []string{fmt.Sprintf("operations: {capabilities: {rules: [{cap: %s, action: allow}]}}", r.Address)}
	default:
		r.Operation = string(e.Kind)
		if e.Mount != nil {
			r.Path = e.Mount.Target
		}
		if op := operationOfKind(e.Kind); op != "" {
			r.Allow = []string{fmt.Sprintf("operations: {%s: allow}", op)}
		}
		r.Note = e.Message
	}
	if r.Layer == "" {
		r.Layer = "-"
	}
	return r, true
}

// portRefusalName is the first name whose answer admitted the address of
// a refusal for a port (egress.Egress.RegisterEvents), "" for any other
// refusal.
func portRefusalName(e *audit.Event) string {
	rest, ok := strings.CutPrefix(e.Message, egress.AdmittedPrefix)
	if !ok || !strings.Contains(e.Net.Reason, "not on a port or protocol its name allows") {
		return ""
	}
	name, _, _ := strings.Cut(rest, " on ")
	name, _, _ = strings.Cut(name, ", ")
	if name == "(unknown)" {
		return ""
	}
	return name
}

// fileAllow fills the rule and the allowing line of a file or exec
// refusal from the policy's own decision for the path.
func fileAllow(r *Refusal, rules []policy.FileRule, def policy.Action, path string, write bool, section string) {
	access := "read"
	if write {
		access = "write"
	}
	d, ok := policy.DecideFile(rules, path, write)
	blocked := ok && (d.Action == policy.ActionBlock || d.Action == policy.ActionKill)
	if !ok && def != "" && def != policy.ActionAllow {
		blocked = true
		d = policy.FileRule{Name: "exec-default"}
	}
	if !blocked {
		if r.Layer == recorder.MechanismLandlock {
			r.Note = "the policy allows this: Landlock's ruleset is planned when the command starts and grants what existed then (the entry was created later in a directory on the path to a blocked entry); run the command again"
		}
		return
	}
	if r.Rule == "" {
		r.Rule = d.RuleName()
	}
	if d.RuleName() == "agent-files" {
		r.Allow = append(r.Allow, "operations: {agent_files: allow}   # the agent's own ledger, sockets and pins: not advised")
		return
	}
	line := fmt.Sprintf("files: [{name: allow-%s, path: %s, match: exact, access: %s, action: allow}]", ruleSlug(path), path, access)
	if section == "exec" {
		line = fmt.Sprintf("exec: {rules: [{name: allow-%s, path: %s, match: exact, action: allow}]}", ruleSlug(path), path)
	}
	if d.Match == policy.MatchExact && d.Path == path {
		// An exact rule on the same path: the sandbox's own rule must
		// replace it.
		line += fmt.Sprintf(" (replacing rule %s, exact on the same path)", d.RuleName())
	}
	r.Allow = append(r.Allow, line)
}

func ruleSlug(p string) string {
	s := strings.Trim(strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' {
			return r
		}
		if r >= 'A' && r <= 'Z' {
			return r + 'a' - 'A'
		}
		return '-'
	}, filepath.Base(p)), "-")
	if s == "" {
		return "path"
	}
	return s
}

func hostBits(addr string) int {
	if strings.Contains(addr, ":") {
		return 128
	}
	return 32
}

func operationOfKind(k audit.Kind) string {
	switch k {
	case audit.KindPtrace:
		return "ptrace"
	case audit.KindMount:
		return "mount"
	case audit.KindModule:
		return "module"
	case audit.KindBPF:
		return "bpf"
	case audit.KindSignal:
		return "kill_agent"
	case audit.KindDevice:
		return "devices"
	}
	return ""
}

func errnoName(n int64) string {
	switch n {
	case 1:
		return "EPERM"
	case 13:
		return "EACCES"
	case 38:
		return "ENOSYS"
	}
	return fmt.Sprintf("errno %d", n)
}

// WriteSummary prints the report for people (and agents reading stderr):
// one table row per refusal, then the lines that would allow each. The
// sandbox names the paths, addresses and processes, so every field is
// escaped for the terminal (textesc.String): one line per refusal, no
// control sequence. WriteJSON keeps the exact text.
func (rep *RunReport) WriteSummary(w io.Writer) {
	q := textesc.String
	if len(rep.Refusals) == 0 {
		fmt.Fprintf(w, "watcher: nothing refused during this run (label=%s)\n", q(orDash(rep.Label)))
		return
	}
	total := 0
	for _, r := range rep.Refusals {
		total += r.Count
	}
	what := "refused"
	if rep.Mode == string(policy.ModeRecord) {
		what = "would have been refused (record mode: they happened)"
	}
	fmt.Fprintf(w, "watcher: %d operation(s) %s during this run (label=%s, sandbox=%s):\n", total, what, q(orDash(rep.Label)), q(rep.Sandbox))
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "  #\tOPERATION\tPATH/ADDRESS\tRULE\tLAYER\tRESULT\tCOUNT\tPROCESS")
	for i, r := range rep.Refusals {
		target := r.Path
		if target == "" {
			target = r.Address
		}
		res := r.Result
		if r.Errno != "" && r.Result == "refused" {
			res += " (" + r.Errno + ")"
		}
		fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", i+1, q(r.Operation), q(orDash(target)), q(orDash(r.Rule)), q(r.Layer), q(res), r.Count, q(r.Process))
	}
	tw.Flush()
	for i, r := range rep.Refusals {
		for _, a := range r.Allow {
			fmt.Fprintf(w, "  #%d would be allowed by: %s\n", i+1, q(a))
		}
		if r.Note != "" {
			fmt.Fprintf(w, "  #%d: %s\n", i+1, q(r.Note))
		}
	}
	if rep.Killed {
		fmt.Fprintln(w, "  the kill backstop killed a process: on this host no layer refuses that operation with an errno, so it may have happened before the kill")
	}
}

// WriteJSON writes the report for agent frameworks.
func (rep *RunReport) WriteJSON(w io.Writer) error {
	if rep.Refusals == nil {
		rep.Refusals = []Refusal{}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// SortRefusals orders refusals by first occurrence.
func SortRefusals(rs []Refusal) {
	sort.SliceStable(rs, func(i, j int) bool { return rs[i].First.Before(rs[j].First) })
}
