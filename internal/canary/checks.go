// Package canary proves a sandbox's cage still works: short-lived probe
// processes, each in a fresh leaf cgroup of the sandbox, try one operation
// the policy forbids per enabled rule class (read a honeytoken under a
// blocked path, write outside the workspace, mount, ptrace, bpf(), a DNS
// query for an unlisted name, a connect to an address the DNS proxy never
// answered) and one it allows where a natural neighbour exists, and the
// runner checks both the outcome and that the matching event reached the
// ledger.
//
// A probe is this binary re-executed (nothing extra is installed): any
// binary that links this package is one, as the package's initialiser
// performs the probe. The binary's other initialisers (cilium/ebpf calls
// bpf()) must not run inside the sandbox, where the kill backstop would
// take them for the probe: a probe starts outside, says it is ready, and
// is moved into its leaf, either the way a container runtime places a
// process (its pid written to cgroup.procs) or through watcher exec's
// launcher (seccomp, Landlock, then the leaf), where it runs on the
// launcher's restricted thread instead of exec'ing.
//
// Planning the checks (Plan) is pure; Runner.Run needs root.
package canary

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/watcherhq/watcher/internal/control"
	"github.com/watcherhq/watcher/internal/dnsproxy"
	"github.com/watcherhq/watcher/internal/policy"
)

// How a probe is placed in the sandbox.
const (
	// PathRuntime is a leaf cgroup the probe's pid is written into, as a
	// container runtime places a process: only the kernel hooks apply.
	PathRuntime = "runtime"
	// PathExec is watcher exec's launcher: seccomp and Landlock from the
	// sandbox's policy, then the leaf.
	PathExec = "exec"
)

// Outcomes of a probe, as the report's expected and got columns say them.
const (
	Denied  = "denied"
	Killed  = "killed"
	Allowed = "allowed"
)

// Probe operations.
const (
	opRead    = "read"
	opWrite   = "write"
	opMount   = "mount"
	opPtrace  = "ptrace"
	opBPF     = "bpf"
	opDNS     = "dns"
	opConnect = "connect"
	opFronted = "fronted"
	opSleep   = "sleep"
)

// Check is one operation a probe tries, planned from the policy.
type Check struct {
	// Name identifies the check in reports, events and metrics.
	Name string
	// Op is the probe operation.
	Op string
	// Target is the file, directory, DNS name or address the operation
	// is aimed at; the runner fills in fixtures the plan cannot know
	// (the listener's port, the ptrace target's pid).
	Target string
	// Forbidden says the policy refuses the operation; Recorded says it
	// only records it (record mode, action record): the operation then
	// happens and the event must still arrive.
	Forbidden bool
	Recorded  bool
	// Mechanism is the layer the layer table names for the rule
	// (kill, cgroup_bpf, lsm, fmod_ret, record, ...).
	Mechanism string
	// Fixture says what the runner creates for the check: "honeytoken"
	// (a file under a blocked directory), "readable" (a file in the
	// scratch directory), "mountpoint", "created" (a file the probe
	// creates, removed afterwards).
	Fixture string
	// uniqueName says Target is a DNS name made up for the run, which
	// the runner makes unique per path.
	uniqueName bool
	// Reason is, for a DNS check, the proxy's reason for the refusal the
	// policy asks ("not on allowlist", "on denylist"): a refusal for
	// another reason (a domain cut off for spent information budget)
	// proves nothing about the allow and deny lists.
	Reason string
}

// Expected is what the policy says happens to the check on a path.
func (c Check) Expected(path string) string {
	switch {
	case !c.Forbidden || c.Recorded:
		return Allowed
	case path == PathExec:
		// seccomp, Landlock and the cgroup hooks refuse with an errno
		// before anything the backstop would kill for.
		return Denied
	case c.Mechanism == mechKill:
		return Killed
	}
	return Denied
}

// NeedsEvent says the check's event must reach the ledger.
func (c Check) NeedsEvent() bool { return c.Forbidden }

// Mechanism names of the layer table that change what a check expects.
const (
	mechKill   = "kill"
	mechRecord = "record"
	mechNone   = "none"
)

// honeytokenName is the file name of honeytokens and probe-created files.
const honeytokenName = "watcher-canary-"

// ResolverAddr is where DNS probes send their query: the kernel redirects
// DNS to any address to the agent's proxy, and a loopback address keeps
// the query on the host should that redirect be broken.
var ResolverAddr = netip.MustParseAddrPort("127.0.0.1:53")

// FrontedAddr is where the fronting probe connects: an address of the
// benchmarking range (RFC 2544) the runner admits for the sandbox as if
// the DNS proxy had answered it. The relay refuses the probe's name before
// it dials anything; were the redirect broken, the connect would go
// nowhere and the check fails.
var FrontedAddr = netip.MustParseAddrPort("198.18.255.254:443")

// FrontedName is the server name the fronting probe sends: never
// answered, never on an allow list (.invalid, RFC 2606).
const FrontedName = "watcher-canary-fronted.invalid"

// Plan lists the checks for a sandbox of pol whose rules the layer table
// layers describes. scratch is a directory the runner owns (allowed reads,
// the mount point); suffix makes file and DNS names unique to the run.
// Classes nothing enforces on this host (mechanism none) are not probed:
// the operation would really happen, and `watcher status` already names
// the missing layer.
func Plan(pol *policy.Policy, sb *policy.Sandbox, layers []control.Layer, scratch, suffix string) []Check {
	var out []Check
	mech := func(rule string) string { return mechanismOf(layers, sb.Name, rule) }
	add := func(c Check, action policy.Action) {
		a := sb.Effective(action)
		if c.Forbidden && c.Mechanism == "" || c.Mechanism == mechNone {
			return
		}
		c.Recorded = c.Forbidden && a == policy.ActionRecord
		out = append(out, c)
	}
	rules := pol.FileRules(sb)

	// Files: a honeytoken under a blocked directory, a readable neighbour.
	if r, token, ok := honeytoken(rules, suffix); ok {
		add(Check{Name: "file_read_blocked", Op: opRead, Target: token, Forbidden: true,
			Mechanism: mech("file rule " + r.Name + " ("), Fixture: "honeytoken"}, r.Action)
	}
	if readable := filepath.Join(scratch, "readable"); !blocks(rules, readable, false) {
		out = append(out, Check{Name: "file_read_allowed", Op: opRead, Target: readable, Fixture: "readable"})
	}
	for _, dir := range []string{"/etc", "/var/lib", "/opt", "/srv", "/usr/local", "/root"} {
		p := filepath.Join(dir, honeytokenName+suffix)
		if r, ok := policy.DecideFile(rules, p, true); ok && isBlocking(r.Action) && isDir(dir) {
			add(Check{Name: "file_write_outside", Op: opWrite, Target: p, Forbidden: true,
				Mechanism: mech("file rule " + r.Name + " ("), Fixture: "created"}, r.Action)
			break
		}
	}
	if p, ok := writable(rules, sb, scratch, suffix); ok {
		out = append(out, Check{Name: "file_write_allowed", Op: opWrite, Target: p, Fixture: "created"})
	}

	// Operations other than file opens.
	if a := sb.Operations.Mount; isBlocking(a) {
		add(Check{Name: "mount", Op: opMount, Target: filepath.Join(scratch, "mnt"), Forbidden: true,
			Mechanism: mech("mount"), Fixture: "mountpoint"}, a)
	}
	if a := sb.Operations.Ptrace; isBlocking(a) {
		add(Check{Name: "ptrace", Op: opPtrace, Forbidden: true, Mechanism: mech("ptrace")}, a)
	}
	if a := sb.Operations.BPF; isBlocking(a) {
		add(Check{Name: "bpf", Op: opBPF, Forbidden: true, Mechanism: mech("bpf")}, a)
	}

	// DNS: a name the sandbox may not resolve, and one it may.
	dnsMech := mech("dns")
	if dnsMech != "" && dnsMech != mechNone {
		if name, made, ok := refusedName(&sb.DNS, suffix); ok {
			reason := dnsproxy.ReasonNotAllowed
			if dnsListed(sb.DNS.Deny, name) {
				reason = dnsproxy.ReasonDenied
			}
			add(Check{Name: "dns_unlisted", Op: opDNS, Target: name, Forbidden: true, Mechanism: "dnsproxy",
				uniqueName: made, Reason: reason}, policy.ActionBlock)
		}
		if name, ok := allowedName(&sb.DNS); ok {
			out = append(out, Check{Name: "dns_allowed", Op: opDNS, Target: name, Mechanism: "dnsproxy"})
		}
	}

	// Egress: a loopback port the sandbox was never given.
	if d := sb.Egress.Default; d != policy.EgressAllow && !egressAllowsLoopback(&sb.Egress) {
		add(Check{Name: "connect_unanswered", Op: opConnect, Forbidden: true,
			Mechanism: mech("egress default " + string(d))}, policy.ActionBlock)
	}
	// Name binding: a TLS hello naming a site nobody answered, sent to an
	// address the runner admits for the sandbox (domain fronting).
	if d := sb.Egress.Default; sb.Egress.Names.Bind && (d == "" || d == policy.EgressResolved) {
		add(Check{Name: "sni_fronted", Op: opFronted, Target: FrontedAddr.String(), Forbidden: true,
			Mechanism: mech("egress names")}, policy.ActionBlock)
	}
	return out
}

// mechanismOf finds the layer-table row "SANDBOX: rule..." (rule is a
// prefix of the row's rule text) and returns its mechanism, "" when there
// is none.
func mechanismOf(layers []control.Layer, sandbox, rule string) string {
	want := sandbox + ": " + rule
	for _, l := range layers {
		if l.Rule == want || (strings.HasSuffix(rule, "(") && strings.HasPrefix(l.Rule, want)) {
			return l.Mechanism
		}
	}
	return ""
}

func isBlocking(a policy.Action) bool { return a == policy.ActionBlock || a == policy.ActionKill }

func blocks(rules []policy.FileRule, p string, write bool) bool {
	r, ok := policy.DecideFile(rules, p, write)
	return ok && isBlocking(r.Action)
}

func isDir(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}

// honeytoken picks a blocked directory for the honeytoken: a prefix rule
// refusing reads, without wildcards, that is not the agent's own files,
// preferring directories that exist (nothing new is created on the host).
func honeytoken(rules []policy.FileRule, suffix string) (policy.FileRule, string, bool) {
	for _, existing := range []bool{true, false} {
		for _, r := range rules {
			if r.Match != policy.MatchPrefix || r.Access == policy.AccessWrite || !isBlocking(r.Action) ||
				!strings.HasSuffix(r.Path, "/") || strings.Contains(r.Path, "*") || r.Name == "agent-files" ||
				strings.HasPrefix(r.Path, "/proc/") || strings.HasPrefix(r.Path, "/sys/") || strings.HasPrefix(r.Path, "/dev/") {
				continue
			}
			if existing != isDir(r.Path) {
				continue
			}
			token := r.Path + honeytokenName + suffix
			if w, ok := policy.DecideFile(rules, token, false); ok && isBlocking(w.Action) {
				return w, token, true
			}
		}
	}
	return policy.FileRule{}, "", false
}

// writable picks where the allowed write goes: the first workspace (a
// direct one: an overlay's real directory is not what commands see), else
// the scratch directory, if the policy lets the sandbox write there.
func writable(rules []policy.FileRule, sb *policy.Sandbox, scratch, suffix string) (string, bool) {
	var dirs []string
	if sb.WorkspaceOptions.Mode != policy.WorkspaceOverlay && len(sb.Workspace) > 0 && isDir(sb.Workspace[0]) {
		dirs = append(dirs, sb.Workspace[0])
	}
	for _, d := range append(dirs, scratch) {
		p := filepath.Join(d, "."+honeytokenName+suffix)
		if !blocks(rules, p, true) {
			return p, true
		}
	}
	return "", false
}

// refusedName returns a name the sandbox's DNS policy refuses: a fresh
// name under .invalid where the default is deny, else one below the first
// deny entry.
func refusedName(d *policy.DNS, suffix string) (name string, made, ok bool) {
	if d.Default == policy.DNSDeny {
		name := "c" + suffix + ".canary.watcher.invalid"
		if !dnsListed(d.Allow, name) {
			return name, true, true
		}
	}
	for _, e := range d.Deny {
		switch {
		case strings.HasPrefix(e, "*."):
			return "c" + suffix + e[1:], true, true
		case strings.HasPrefix(e, "."):
			return "c" + suffix + e, true, true
		case !strings.Contains(e, "*"):
			return e, false, true
		}
	}
	return "", false, false
}

// allowedName returns a name the sandbox may resolve that is listed
// exactly (never a made-up name below a wildcard: it would travel to the
// upstream resolvers as noise).
func allowedName(d *policy.DNS) (string, bool) {
	for _, e := range d.Allow {
		name := strings.TrimPrefix(e, ".")
		if strings.Contains(name, "*") || dnsListed(d.Deny, name) || name == "" {
			continue
		}
		return name, true
	}
	return "", false
}

// dnsListed matches a name against allow/deny entries in the policy's
// syntax: "x" exactly, "*.x" below x, ".x" x and below.
func dnsListed(entries []string, name string) bool {
	name = strings.ToLower(strings.TrimSuffix(name, "."))
	for _, e := range entries {
		e = strings.ToLower(e)
		switch {
		case e == "*":
			return true
		case strings.HasPrefix(e, "*."):
			if strings.HasSuffix(name, e[1:]) {
				return true
			}
		case strings.HasPrefix(e, "."):
			if name == e[1:] || strings.HasSuffix(name, e) {
				return true
			}
		case name == e:
			return true
		}
	}
	return false
}

// egressAllowsLoopback says an egress allow rule covers 127.0.0.1: a
// connect to a fresh loopback port would then rightly succeed.
func egressAllowsLoopback(e *policy.Egress) bool {
	lo := netip.MustParseAddr("127.0.0.1")
	for _, r := range e.Allow {
		if p, err := policy.ParseCIDR(r.CIDR); err == nil && p.Contains(lo) {
			return true
		}
	}
	return false
}
