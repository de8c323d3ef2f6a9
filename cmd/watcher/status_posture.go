package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/control"
	"github.com/watcherhq/watcher/internal/posture"
	"github.com/watcherhq/watcher/internal/textesc"
)

// printPosture prints one row per sandbox cgroup with the hardening the
// kernel reports for its processes, and returns the rows lacking an item
// their sandbox requires. Cgroup paths, container ids and mount paths are
// escaped for the terminal with textesc.String; the rows returned are not
// (they end in an error, which main escapes).
func printPosture(w io.Writer, st *control.Status) (lacking []string) {
	q := textesc.String
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SANDBOX\tCGROUP\tPROCS\tCAP_EFF\tCAP_BND\tNO_NEW_PRIVS\tSECCOMP\tUSER_NS\tUID0\tROOT\t/TMP\tWORKSPACE\tMEMORY\tCPU\tPIDS\tMISSING")
	var caps []string
	for _, s := range st.Sandboxes {
		p := s.Posture
		name := "/" + strings.TrimPrefix(strings.TrimPrefix(s.Path, st.Kernel.Cgroup2), "/")
		if p == nil {
			fmt.Fprintf(tw, "%s\t%s\t(not read yet)\n", q(s.Name), q(name))
			continue
		}
		if p.Container != "" {
			name = p.Container[:min(12, len(p.Container))]
		} else if p.Cgroup != "" {
			name = p.Cgroup
		}
		missing := "-"
		if len(p.Missing) > 0 {
			missing = strings.Join(p.Missing, ",")
			lacking = append(lacking, fmt.Sprintf("%s %s: %s", s.Name, name, missing))
			missing = q(missing)
		}
		sbName, name := q(s.Name), q(name)
		lim := fmt.Sprintf("%s\t%s\t%s", posture.Limit(float64(p.Limits.MemoryBytes), "bytes"),
			posture.Limit(float64(p.Limits.CPUMillis), "millicores"), posture.Limit(float64(p.Limits.PIDs), "count"))
		if p.Procs == 0 {
			fmt.Fprintf(tw, "%s\t%s\t0\t-\t-\t-\t-\t-\t-\t-\t-\t-\t%s\t%s\n", sbName, name, lim, missing)
			continue
		}
		var ws []string
		for _, m := range p.Workspace {
			ws = append(ws, q(m.Path+"="+posture.MountFlags(m)))
		}
		if len(ws) == 0 {
			ws = []string{"-"}
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", sbName, name, p.Procs,
			posture.Caps(p.CapEff), posture.Caps(p.CapBnd), yesNo(p.NoNewPrivs), q(p.Seccomp), yesNo(p.UserNS), yesNo(p.RootUser),
			posture.MountFlags(p.Root), posture.MountFlags(p.Tmp), strings.Join(ws, " "), lim, missing)
		if c := posture.Caps(p.CapEff); c != "none" && c != "all" {
			caps = append(caps, fmt.Sprintf("  %s %s: %s", sbName, name, posture.CapList(p.CapEff)))
		}
	}
	tw.Flush()
	if len(caps) > 0 {
		fmt.Fprintln(w, "\neffective capabilities:")
		fmt.Fprintln(w, strings.Join(caps, "\n"))
	}
	return lacking
}

// postureJSON prints the rows as JSON lines ({"sandbox", "path",
// "posture"}) and returns those lacking a required item.
func postureJSON(w io.Writer, st *control.Status) (lacking []string) {
	enc := json.NewEncoder(w)
	for _, s := range st.Sandboxes {
		enc.Encode(struct {
			Sandbox string         `json:"sandbox"`
			Path    string         `json:"path"`
			Posture *audit.Posture `json:"posture"`
		}{s.Name, s.Path, s.Posture})
		if s.Posture != nil && len(s.Posture.Missing) > 0 {
			lacking = append(lacking, fmt.Sprintf("%s %s: %s", s.Name, s.Path, strings.Join(s.Posture.Missing, ",")))
		}
	}
	return lacking
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
