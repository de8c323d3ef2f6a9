package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/watcherhq/watcher/internal/agent"
	"github.com/watcherhq/watcher/internal/audit"
	"github.com/watcherhq/watcher/internal/cgroupfs"
	"github.com/watcherhq/watcher/internal/containers"
	"github.com/watcherhq/watcher/internal/control"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/ipcobj"
	"github.com/watcherhq/watcher/internal/launch"
	"github.com/watcherhq/watcher/internal/ledger"
	"github.com/watcherhq/watcher/internal/policy"
	"github.com/watcherhq/watcher/internal/textesc"
	"github.com/watcherhq/watcher/internal/workspace"
)

func init() {
	register("workspace", command{Summary: "diff, commit, roll back and snapshot a sandbox's overlay workspace", Run: runWorkspace})
}

const workspaceUsage = `Usage: watcher workspace COMMAND [flags] SANDBOX [NAME]

Commands for sandboxes whose policy sets workspace_options.mode: overlay.
Sandboxed commands see each workspace directory through an overlayfs; the
real directory is unchanged until commit.

  diff SANDBOX             list added, changed and deleted paths with sizes
  commit SANDBOX           stop the sandbox, merge the changes into the real
                           directories
  rollback SANDBOX [NAME]  stop the sandbox, throw the changes away (or go
                           back to snapshot NAME)
  snapshot SANDBOX NAME    save the current changes under NAME (the sandbox
                           is frozen meanwhile: one that does not freeze
                           within 5 s gets no snapshot); old snapshots are
                           pruned by max_snapshots and max_snapshot_bytes
  snapshots SANDBOX        list the snapshots with their sizes
  prepare SANDBOX          mount the overlays and print where, for a
                           container runtime to bind-mount them

Rollback also removes the System V IPC objects (shared memory, semaphores,
message queues), POSIX message queues and /dev/shm files the sandbox's
processes created where they outlive them (a runtime-placed sandbox
sharing the host's IPC namespace or /dev/shm), as the agent's kernel
tracking recorded them; objects of other processes with the same keys or
names stay.

Commit never carries privilege into the real directory: device nodes,
FIFOs and sockets are refused, setuid/setgid bits and extended attributes
other than user.* and POSIX ACLs (security.capability, LSM labels) are
stripped, and an owner the real directory would not give there becomes the
replaced entry's or the directory's owner; each is listed as withheld.

Whatever the sandbox wrote, the work is bounded: files are read by their
data extents (a sparse file's holes are skipped and stay holes), trees are
walked without recursion, at most 100000 changes are listed (the count of
the rest is given). Long work shows progress on stderr. SIGINT or SIGTERM
stops it between entries: an interrupted commit says how many entries it
applied to the real directories (the rest stay in the overlay, which
shows the same tree; run commit again to finish) and is recorded as
incomplete.

Commit, rollback and snapshot are recorded in the ledger (through the agent
when it runs) with the changed paths and the SHA-256 tree hash of the result.`

func runWorkspace(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprintln(stdout, workspaceUsage)
		if len(args) == 0 {
			return &exitError{Code: 2, Err: errors.New("workspace needs a command")}
		}
		return nil
	}
	sub := args[0]
	nargs := map[string][2]int{"diff": {1, 1}, "commit": {1, 1}, "rollback": {1, 2}, "snapshot": {2, 2}, "snapshots": {1, 1}, "prepare": {1, 1}}
	want, ok := nargs[sub]
	if !ok {
		return &exitError{Code: 2, Err: fmt.Errorf("unknown workspace command %q (want diff, commit, rollback, snapshot, snapshots or prepare)", sub)}
	}
	fs := flag.NewFlagSet("workspace "+sub, flag.ContinueOnError)
	policyPath := fs.String("policy", "", "policy file (default: the running agent's, else the built-in default)")
	socket := fs.String("socket", control.DefaultSocket, "control socket of a running agent")
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	pos, err := parseInterleaved(fs, args[1:], stderr)
	if err != nil {
		return helpOK(err)
	}
	if len(pos) < want[0] || len(pos) > want[1] {
		return &exitError{Code: 2, Err: fmt.Errorf("workspace %s: wrong arguments (%s)", sub, usageLine(sub))}
	}
	env, err := openWorkspace(*policyPath, *socket, pos[0])
	if err != nil {
		return err
	}
	prog := newProgressPrinter(stderr)
	env.ws.Progress = prog.report
	defer prog.done()
	switch sub {
	case "diff":
		err := listChanges(ctx, env.ws, stdout, *asJSON)
		prog.done()
		return err
	case "snapshots":
		snaps, err := env.ws.Snapshots()
		if err != nil {
			return err
		}
		if *asJSON {
			return writeJSON(stdout, snaps)
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tCREATED\tSIZE\tCHANGES\tHASH")
		var total int64
		for _, s := range snaps {
			total += s.Bytes
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%.16s\n", s.Name, s.Created.Format(time.RFC3339), policy.FormatBytes(s.Bytes), s.Changes, s.Hash)
		}
		tw.Flush()
		fmt.Fprintf(stdout, "%d snapshots, %s\n", len(snaps), policy.FormatBytes(total))
		return nil
	case "prepare":
		if err := env.ws.Mount(); err != nil {
			return err
		}
		for _, l := range env.ws.Layers {
			fmt.Fprintf(stdout, "%s\t%s\n", l.Lower, l.Merged)
		}
		return env.record(audit.WorkspaceDetail{Op: "prepare"}, fmt.Sprintf("overlay of %d workspace directories mounted for the runtime", len(env.ws.Layers)))
	case "snapshot":
		// Snapshot freezes the sandbox's cgroups itself, and refuses to
		// copy a tree it could not freeze.
		snap, pruned, err := env.ws.Snapshot(ctx, pos[1], workspace.SnapshotLimits{Keep: env.sb.WorkspaceOptions.MaxSnapshots, MaxBytes: env.sb.WorkspaceOptions.MaxSnapshotBytes.Bytes}, env.cgroups())
		prog.done()
		if err != nil {
			return err
		}
		var changes []workspace.Change
		env.ws.EachChange(ctx, func(c workspace.Change) error {
			if len(changes) < maxLedgerPaths {
				changes = append(changes, c)
			}
			return nil
		})
		msg := fmt.Sprintf("snapshot %s: %d changes, %s", snap.Name, snap.Changes, policy.FormatBytes(snap.Bytes))
		if len(pruned) > 0 {
			msg += "; pruned " + strings.Join(pruned, ", ")
		}
		fmt.Fprintln(stdout, msg)
		return env.record(detailOf("snapshot", snap.Name, workspace.Result{Changes: changes, Hash: snap.Hash, Bytes: snap.Bytes}), msg)
	}

	// commit and rollback: stop the sandbox's processes first.
	n, err := workspace.Stop(env.cgroups(), 10*time.Second)
	if err != nil {
		return err
	}
	// A rollback also removes the IPC objects the sandbox's processes
	// created where they outlive them (a runtime-placed sandbox in the
	// host's IPC namespace or /dev/shm).
	var ipcRemoved []string
	var ipcNote string
	if sub == "rollback" {
		if ipcRemoved, ipcNote, err = env.removeIPC(); err != nil {
			return err
		}
	}
	var res workspace.Result
	var op, name string
	switch {
	case sub == "commit":
		op = "commit"
		res, err = env.ws.Commit(ctx)
	case len(pos) == 2:
		op, name = "rollback", pos[1]
		res, err = env.ws.RollbackTo(ctx, name)
	default:
		op = "rollback"
		res, err = env.ws.Rollback(ctx)
	}
	prog.done()
	if err != nil && !res.Done && res.Applied == 0 && res.Hash == "" && len(res.Changes) == 0 {
		return err // stopped before it changed anything
	}
	if *asJSON {
		writeJSON(stdout, res)
	} else {
		printChanges(stdout, res.Changes)
		if res.Unlisted > 0 {
			fmt.Fprintf(stdout, "and %d more changes not listed (more than %d)\n", res.Unlisted, workspace.MaxListedChanges)
		}
		if res.ListError != "" {
			fmt.Fprintf(stdout, "the changes could not all be listed: %s\n", textesc.String(res.ListError))
		}
		printWithheld(stdout, res.Withheld)
	}
	total := len(res.Changes) + res.Unlisted
	msg := fmt.Sprintf("%s: %d paths, %s, %d cgroups stopped, result sha256:%s", op, total, policy.FormatBytes(res.Bytes), n, res.Hash)
	if name != "" {
		msg = fmt.Sprintf("rollback to %s: %d paths, %d cgroups stopped, result sha256:%s", name, total, n, res.Hash)
	}
	if err != nil {
		// Stopped midway (interrupted, or failed) after it began to
		// change things: the record says what was done and what not.
		msg = fmt.Sprintf("%s INCOMPLETE: %v; %s", op, err, msg)
		if op == "commit" {
			msg += fmt.Sprintf("; %d upper-layer entries applied", res.Applied)
		}
	}
	if len(res.Withheld) > 0 {
		msg += fmt.Sprintf("; %d withheld from the real directory (special files, setuid/setgid, privileged xattrs, owners)", len(res.Withheld))
	}
	if len(ipcRemoved) > 0 {
		msg += fmt.Sprintf("; %d IPC objects removed", len(ipcRemoved))
	}
	msg += ipcNote
	if !*asJSON {
		for _, o := range ipcRemoved {
			fmt.Fprintln(stdout, "removed", textesc.String(o)) // the sandbox named it
		}
		fmt.Fprintln(stdout, msg)
	}
	d := detailOf(op, name, res)
	d.IPC = ipcRemoved
	if rerr := env.record(d, msg); rerr != nil {
		return errors.Join(err, rerr)
	}
	return err
}

// listChanges prints the changes sorted by path, the first
// workspace.MaxListedChanges of them (so a sandbox that wrote millions of
// entries costs bounded memory here), and says how many more there are.
func listChanges(ctx context.Context, ws *workspace.Workspace, w io.Writer, asJSON bool) error {
	var changes []workspace.Change
	unlisted := 0
	err := ws.EachChange(ctx, func(c workspace.Change) error {
		if len(changes) < workspace.MaxListedChanges {
			changes = append(changes, c)
		} else {
			unlisted++
		}
		return nil
	})
	if err != nil {
		return err
	}
	sort.Slice(changes, func(i, j int) bool { return changes[i].Path < changes[j].Path })
	if asJSON {
		if changes == nil {
			changes = []workspace.Change{}
		}
		if err := writeJSON(w, changes); err != nil {
			return err
		}
	} else {
		printChanges(w, changes)
	}
	if unlisted > 0 {
		return fmt.Errorf("diff lists the first %d changes (sorted by path) of %d", len(changes), len(changes)+unlisted)
	}
	return nil
}

// removeIPC removes the System V IPC objects, POSIX message queues and
// /dev/shm files that the sandbox's processes created and the kernel recorded (bpf/ipc.c, loaded
// by the agent), once they are stopped. It returns what it removed and a
// note for the record when the list may be incomplete.
func (e *workspaceEnv) removeIPC() ([]string, string, error) {
	pinDir := e.pol.Agent.PinDir
	if pinDir == "" {
		pinDir = enforce.DefaultPinDir
	}
	tab, err := ipcobj.OpenTable(pinDir)
	if errors.Is(err, ipcobj.ErrNotTracked) {
		return nil, "", nil // no agent ever ran here: nothing was recorded
	}
	if err != nil {
		return nil, "", fmt.Errorf("rollback: IPC objects: %w", err)
	}
	defer tab.Close()
	var roots []uint64
	for _, cg := range e.cgroups() {
		if id, err := cgroupfs.ID(cg); err == nil {
			roots = append(roots, id)
		}
	}
	objs, err := tab.Sandbox(e.sb.Name, roots)
	if err != nil {
		return nil, "", fmt.Errorf("rollback: IPC objects: %w", err)
	}
	out, err := ipcobj.Remove(objs)
	var removed []string
	for _, o := range out.Removed {
		removed = append(removed, o.String())
	}
	sort.Strings(removed)
	if ferr := tab.Forget(append(out.Removed, out.Gone...)); err == nil {
		err = ferr
	}
	if err != nil {
		return removed, "", fmt.Errorf("rollback: IPC objects: %w", err)
	}
	note := ""
	if lost, _ := tab.Overflow(); lost > 0 {
		note = fmt.Sprintf("; IPC list incomplete: %d creations on this host were not recorded (table full)", lost)
	}
	return removed, note, nil
}

func usageLine(sub string) string {
	switch sub {
	case "rollback":
		return "watcher workspace rollback SANDBOX [NAME]"
	case "snapshot":
		return "watcher workspace snapshot SANDBOX NAME"
	}
	return "watcher workspace " + sub + " SANDBOX"
}

// parseInterleaved parses flags given before, between or after the
// positional arguments.
func parseInterleaved(fs *flag.FlagSet, args []string, stderr io.Writer) ([]string, error) {
	var pos []string
	for {
		if err := parseFlags(fs, args, stderr, workspaceUsage); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if rest[0] == "--" {
			return append(pos, rest[1:]...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// printChanges is the table of workspace changes; the sandbox named the
// paths, so they are escaped for the terminal with textesc.String.
func printChanges(w io.Writer, changes []workspace.Change) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CHANGE\tSIZE\tPATH")
	count := map[workspace.ChangeKind]int{}
	for _, c := range changes {
		p := c.Path
		if c.Dir {
			p += "/"
		}
		count[c.Kind]++
		fmt.Fprintf(tw, "%s\t%s\t%s\n", c.Kind, policy.FormatBytes(c.Size), textesc.String(p))
	}
	tw.Flush()
	fmt.Fprintf(w, "%d added, %d changed, %d deleted\n", count[workspace.Added], count[workspace.Changed], count[workspace.Deleted])
}

// printWithheld is the table of what a commit did not carry into the real
// directory (refused special files, stripped bits and extended
// attributes, replaced owners). Paths and attribute names are the
// sandbox's: escaped.
func printWithheld(w io.Writer, notes []workspace.Note) {
	if len(notes) == 0 {
		return
	}
	fmt.Fprintln(w, "withheld from the real directory (commit carries no privilege):")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ACTION\tPATH\tWHAT")
	for _, n := range notes {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", n.Action, textesc.String(n.Path), textesc.String(n.What))
	}
	tw.Flush()
}

// maxLedgerPaths bounds the paths one ledger record lists (a record has a
// size limit); the message gives the full count.
const maxLedgerPaths = 1000

func detailOf(op, snapshot string, res workspace.Result) audit.WorkspaceDetail {
	d := audit.WorkspaceDetail{Op: op, Snapshot: snapshot, Bytes: uint64(max(res.Bytes, 0)), Hash: res.Hash}
	for i, c := range res.Changes {
		if i == maxLedgerPaths {
			break
		}
		switch c.Kind {
		case workspace.Added:
			d.Added = append(d.Added, c.Path)
		case workspace.Changed:
			d.Changed = append(d.Changed, c.Path)
		case workspace.Deleted:
			d.Deleted = append(d.Deleted, c.Path)
		}
	}
	return d
}

// workspaceEnv is a sandbox's overlay workspace and where its events go.
type workspaceEnv struct {
	pol     *policy.Policy
	sb      *policy.Sandbox
	ws      *workspace.Workspace
	running bool
	socket  string
}

// openWorkspace loads the policy (the running agent's unless --policy is
// given) and opens the sandbox's overlay workspace.
func openWorkspace(policyPath, socket, sandbox string) (*workspaceEnv, error) {
	env := &workspaceEnv{socket: socket}
	if st, err := control.NewClient(socket).Status(); err == nil {
		env.running = true
		if policyPath == "" {
			policyPath = st.Policy
		}
	}
	var err error
	if policyPath != "" {
		env.pol, err = policy.Load(policyPath)
	} else {
		env.pol = policy.Default()
	}
	if err != nil {
		return nil, err
	}
	if env.sb, err = pickSandbox(env.pol, sandbox); err != nil {
		return nil, err
	}
	if env.sb.WorkspaceOptions.Mode != policy.WorkspaceOverlay {
		return nil, fmt.Errorf("sandbox %s does not use an overlay workspace (set workspace_options.mode: overlay in its policy)", env.sb.Name)
	}
	env.ws, err = workspace.Open(stateDir(env.pol, env.sb), env.sb.Name, env.sb.Workspace)
	return env, err
}

func stateDir(pol *policy.Policy, sb *policy.Sandbox) string {
	if d := sb.WorkspaceOptions.StateDir; d != "" {
		return d
	}
	return filepath.Join(filepath.Dir(pol.Agent.LedgerDir), "workspaces")
}

// cgroups are the sandbox's cgroup2 directories that exist now: its exec
// cgroups, listed cgroups, and those its globs and containers select.
func (e *workspaceEnv) cgroups() []string {
	var out []string
	seen := map[string]bool{}
	add := func(abs string) {
		if !seen[abs] {
			seen[abs] = true
			out = append(out, abs)
		}
	}
	for _, rel := range append(agent.ExecParents(e.pol, e.sb), e.sb.Select.Cgroups...) {
		if abs, err := cgroupfs.Abs(rel); err == nil {
			add(abs)
		}
	}
	r, err := containers.NewResolver()
	if err != nil {
		return out
	}
	for _, g := range e.sb.Select.Globs {
		if cg, err := containers.CompileGlob(g); err == nil {
			ms, _ := r.Glob(cg)
			for _, m := range ms {
				add(m.Abs)
			}
		}
	}
	for _, c := range e.sb.Select.Containers {
		if ref, err := containers.ParseRef(c); err == nil {
			if m, err := r.Resolve(ref); err == nil {
				add(m.Abs)
			}
		}
	}
	return out
}

// record appends the operation to the ledger: through the agent when it
// runs, else to the policy's ledger directly (waiting for a private
// agent of `watcher exec` to release it).
func (e *workspaceEnv) record(d audit.WorkspaceDetail, msg string) error {
	ev := audit.Event{Time: time.Now(), Kind: audit.KindWorkspace, Verdict: audit.VerdictRecorded, Severity: audit.SeverityAlert,
		Mechanism: "overlayfs", Sandbox: audit.Sandbox{Name: e.sb.Name}, Workspace: &d, Message: msg,
		Process: audit.Process{PID: uint32(os.Getpid()), TGID: uint32(os.Getpid()), UID: uint32(os.Getuid()), Comm: "watcher", Args: os.Args}}
	if e.running {
		if err := control.NewClient(e.socket).Record(ev); err == nil {
			return nil
		} else if !errors.Is(err, control.ErrAgentNotRunning) && !strings.Contains(err.Error(), "contact agent") {
			return fmt.Errorf("record %s in the agent's ledger: %w", d.Op, err)
		}
	}
	return appendLedger(e.pol, ev)
}

func appendLedger(pol *policy.Policy, ev audit.Event) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		l, err := ledger.Open(pol.Agent.LedgerDir, agent.LedgerOptions(pol))
		if err != nil {
			if time.Now().Before(deadline) && errors.Is(err, syscall.EWOULDBLOCK) {
				time.Sleep(200 * time.Millisecond)
				continue
			}
			return fmt.Errorf("record in ledger %s: %w", pol.Agent.LedgerDir, err)
		}
		_, _, err = l.Append(ev)
		if cerr := l.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("record in ledger %s: %w", pol.Agent.LedgerDir, err)
		}
		return nil
	}
}

// overlayIsolation is what `watcher exec` needs for a sandbox with an
// overlay workspace: the overlays mounted, and the command's namespaces
// and mounts. Other sandboxes get no isolation.
func overlayIsolation(pol *policy.Policy, sb *policy.Sandbox) (launch.Isolation, error) {
	if sb.WorkspaceOptions.Mode != policy.WorkspaceOverlay {
		return launch.Isolation{}, nil
	}
	ws, err := workspace.Open(stateDir(pol, sb), sb.Name, sb.Workspace)
	if err != nil {
		return launch.Isolation{}, err
	}
	if err := ws.Mount(); err != nil {
		return launch.Isolation{}, err
	}
	return ws.Isolation(), nil
}
