// Package plan is the policy-to-layer planner: it turns a policy into the
// rule tables of every enforcement layer, choosing per rule the strongest
// mechanism this host offers, and says which one it chose (Plan.Layers).
// It is pure: it reads the policy and a description of the host (Env) and
// never loads, attaches or writes anything; the agent writes the Plan into
// the kernel, and `watcher exec` takes its launch restrictions from it.
//
// Layers, strongest first:
//   - BPF LSM (internal/enforce/lsm): a real EPERM before the operation, for
//     every process in the sandbox. Used for each rule whose hook loaded.
//   - cgroup BPF (internal/enforce/cgroupbpf, internal/enforce/egress): a real EPERM
//     for device access, /proc/sys reads and writes, SOCK_RAW sockets and
//     network egress. Works on every kernel watcher supports, so these rules
//     go there whatever LSM offers.
//   - seccomp and Landlock (internal/launch): only for commands started by
//     `watcher exec`, as defence in depth.
//   - the kill backstop (internal/enforce/backstop): tracepoints that SIGKILL
//     the process after the fact, for what no blocking hook covers here. A
//     policy "block" becomes a kill there.
//
// Rules whose operation no LSM hook ever covers (exec rules, io_uring,
// mount_setattr, delete_module) go to the backstop on every host.
//
// Files, by policy section: operations.go (operations, capabilities,
// devices, raw sockets), files.go, filetable.go and sysctl.go (file and
// exec rules), network.go (egress and DNS), exec.go (`watcher exec`'s
// seccomp and Landlock). layers.go holds the layer table: the mechanism
// names, the action mapping and add, where every rule's line, mode and
// Missing entry are decided.
package plan

import (
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"time"

	"github.com/watcherhq/watcher/internal/control"
	"github.com/watcherhq/watcher/internal/dnsproxy"
	"github.com/watcherhq/watcher/internal/enforce/rules"
	"github.com/watcherhq/watcher/internal/enforce/rules/backstoprules"
	"github.com/watcherhq/watcher/internal/enforce/rules/cgrouprules"
	"github.com/watcherhq/watcher/internal/enforce/rules/egressrules"
	"github.com/watcherhq/watcher/internal/enforce/rules/lsmrules"
	"github.com/watcherhq/watcher/internal/enforce/rules/tracerules"
	"github.com/watcherhq/watcher/internal/launch"
	"github.com/watcherhq/watcher/internal/policy"
)

// Env is what the compiler needs to know about the host and the agent.
type Env struct {
	// LSM is lsm.Probe() or LSM.Status(): per hook ("file_open",
	// "sb_mount"...), nil when the BPF LSM program enforces that hook. A
	// hook missing from the map counts as unavailable; a nil map means no
	// BPF LSM at all.
	LSM map[string]error
	// CgroupBPF is nil when the cgroup device, sysctl and sock_create
	// programs load (every supported kernel), or why they do not.
	CgroupBPF error
	// AgentFiles are the agent's own files and directories (ledger dir, key
	// file, socket dir, pin dir, policy file), protected as agent_files
	// says. Directories are protected with everything below them.
	AgentFiles []string
	// DNSProxy4 and DNSProxy6 are where sandbox DNS is redirected; an
	// invalid one makes DNS over that family fail.
	DNSProxy4, DNSProxy6 netip.AddrPort
	// LSMMech is, per hook that enforces, the mechanism its program runs
	// under (lsmrules.MechLSM or lsmrules.MechFmodRet): lsm.ProbeMechanisms() or
	// LSM.Mechanisms(). Hooks missing here count as BPF LSM.
	LSMMech map[string]string
	// UnixSockets is nil when the cgroup unix socket hooks load (kernel
	// 6.7+: egress.ProbeUnix), or why not.
	UnixSockets error
	// ForeignSockets is nil when sockets made outside a sandbox are judged
	// (egress.Egress.ForeignErr), or why not.
	ForeignSockets error
	// AbsentProbeSockets are the well-known socket paths that C libraries
	// probe on their own (nscd's: every getpwuid from bash or ls tries it)
	// and that do not exist on this host (AbsentProbeSockets()). Refusing
	// them protects nothing and shows the agent a refusal on every
	// command, so they are left connectable; a host socket that exists
	// stays refused. Re-derived at every policy apply.
	AbsentProbeSockets []string
	// RequireLSM makes every blocking rule whose BPF LSM hook is missing
	// a Missing entry (the agent then refuses to start).
	RequireLSM bool
	// IA32 is nil when this kernel runs 32-bit system calls (int 0x80),
	// or why not (ia32.Available()). Where it does not, the plan has no
	// 32-bit entries and the layer table says so instead of claiming a
	// layer for them.
	IA32 error
}

// Plan is everything the agent writes into the layers for one policy.
type Plan struct {
	// SandboxIDs maps a sandbox name to its id (index in the policy + 1).
	SandboxIDs map[string]uint32
	// Flags are the sandbox flags per id (rules.SandboxRecordOnly for
	// mode: record); every sandbox has an entry.
	Flags map[uint32]uint32
	// LSM are the BPF LSM rules per sandbox id; nil when no LSM hook loads.
	LSM map[uint32]lsmrules.Rules
	// Backstop is the kill backstop's rule set, all per sandbox: path
	// rules by sandbox id, syscall and category rules in
	// Backstop.Sandboxes (every sandbox has a set; the every-sandbox set
	// stays empty), so one sandbox's rule never kills another's members.
	Backstop backstoprules.Rules
	// Devices, Sysctl and Sockets are the cgroup BPF rules (per sandbox id).
	Devices []cgrouprules.DeviceRule
	Sysctl  []cgrouprules.SysctlRule
	Sockets []cgrouprules.SocketRule
	// Listen are the cgroup BPF listener rules, one per sandbox whose
	// listen action is not allow.
	Listen []cgrouprules.ListenRule
	// Egress is the egress configuration per sandbox id.
	Egress map[uint32]egressrules.SandboxConfig
	// ResolvedEgress lists, by sandbox name, the sandboxes whose egress
	// default is "resolved" with their grace period: the DNS proxy's
	// answers admit addresses for these sandboxes only (egress.Options.Grace
	// is host-wide; the largest grace is GraceMax).
	ResolvedEgress map[string]time.Duration
	// GraceMax is the largest grace of ResolvedEgress (0 when empty).
	GraceMax time.Duration
	// Admission is, by sandbox name, what the answers of a sandbox of
	// ResolvedEgress admit: the TTL cap and the ports per name.
	Admission map[string]*egressrules.Scope
	// Names is the name binding per sandbox id (egress.names.bind).
	Names map[uint32]NameBinding
	// DNS is the DNS proxy's policy.
	DNS *dnsproxy.Policy
	// Launch are the restrictions of `watcher exec` per sandbox name.
	Launch map[string]launch.Restrictions
	// Trace configures the recording tracepoints.
	Trace tracerules.Config
	// SyscallStream says the raw sys_enter tracepoint must be attached: a
	// sandbox records the syscall stream, or module attempts must be
	// recorded while no backstop syscall rule sees them.
	SyscallStream bool
	// Layers says, for every rule of every sandbox, which mechanism
	// enforces it on this host, with a note.
	Layers []control.Layer
	// Missing lists the blocking rules (in enforce-mode sandboxes) this
	// host cannot enforce as required: rules nothing enforces at all, and,
	// with Env.RequireLSM, rules whose BPF LSM hook did not load (they fall
	// back to the kill backstop). Capability rules are nothing's job
	// without the capable hook, but the operations the dangerous
	// capabilities unlock have rules of their own, so they count as
	// missing only with RequireLSM; so do other_ipc and notify_marks,
	// which only LSM hooks judge (watcher exec's namespaces cover part).
	Missing []string
}

// Compile translates the policy for this host. Rule ids come from rules.
// An error means the policy cannot be put into the kernel as written (a
// path too long for the maps, too many port ranges on one network); the
// agent then keeps the policy in force.
func Compile(p *policy.Policy, env Env, rules *RuleTable) (*Plan, error) {
	if p == nil {
		return nil, errors.New("compile policy: no policy")
	}
	if rules == nil {
		return nil, errors.New("compile policy: no rule table")
	}
	c := &compiler{
		p: p, env: env, rules: rules,
		requireLSM: env.RequireLSM || p.Agent.RequireLSM,
		cgroupOK:   env.CgroupBPF == nil,
		plan: &Plan{
			SandboxIDs:     map[string]uint32{},
			Flags:          map[uint32]uint32{},
			LSM:            map[uint32]lsmrules.Rules{},
			Egress:         map[uint32]egressrules.SandboxConfig{},
			ResolvedEgress: map[string]time.Duration{},
			Admission:      map[string]*egressrules.Scope{},
			Names:          map[uint32]NameBinding{},
			DNS:            &dnsproxy.Policy{Sandboxes: map[string]*dnsproxy.SandboxPolicy{}},
			Launch:         map[string]launch.Restrictions{},
		},
	}
	for name, err := range env.LSM {
		if err == nil && name != "*" {
			c.anyLSM = true
		}
	}
	for i := range p.Sandboxes {
		sb := &p.Sandboxes[i]
		sid := uint32(i + 1)
		if err := c.sandbox(sb, sid); err != nil {
			return nil, fmt.Errorf("compile policy: sandbox %s: %w", sb.Name, err)
		}
	}
	c.finish()
	return c.plan, nil
}

type compiler struct {
	p          *policy.Policy
	env        Env
	rules      *RuleTable
	plan       *Plan
	requireLSM bool
	cgroupOK   bool
	anyLSM     bool

	// The backstop's syscall rules (by name) and category rules of the
	// sandbox being compiled; sandbox moves them into
	// plan.Backstop.Sandboxes.
	syscalls map[string]backstoprules.Rule
	bs       *backstoprules.SandboxRules
	// ia32Layer: the sandbox's ia32_syscalls line, rewritten by ia32Line.
	ia32Layer    int
	moduleSeen   bool
	moduleRuleID uint32
	// moduleSyscall: some sandbox's backstop rules see init_module.
	moduleSyscall bool
}

func (c *compiler) sandbox(sb *policy.Sandbox, sid uint32) error {
	c.plan.SandboxIDs[sb.Name] = sid
	var flags uint32
	if sb.Mode == policy.ModeRecord {
		flags |= rules.SandboxRecordOnly
	}
	c.plan.Flags[sid] = flags
	lr := lsmrules.Rules{Ops: map[lsmrules.Op]lsmrules.Decision{}}
	c.syscalls = map[string]backstoprules.Rule{}
	c.bs = &backstoprules.SandboxRules{}

	c.operations(sb, &lr)
	notifyPaths(sb, &lr)
	c.fixed(sb, &lr)
	if err := c.files(sb, sid, &lr); err != nil {
		return err
	}
	c.capabilities(sb, &lr)
	c.hostState(sb)
	c.devices(sb, sid, &lr)
	c.terminalDevices(sb, sid, &lr)
	c.rawSockets(sb, sid, &lr)
	if err := c.network(sb, sid); err != nil {
		return err
	}
	if err := c.listen(sb, sid); err != nil {
		return err
	}
	c.launch(sb)
	c.lsmSockets(sb, sid, &lr)
	if c.anyLSM {
		c.plan.LSM[sid] = lr
	}
	// 32-bit system calls last: the decision rests on every other
	// backstop rule of this sandbox.
	c.ia32Line(sb, sid)
	for _, name := range sortedKeys(c.syscalls) {
		if r := c.syscalls[name]; r.Action != rules.ActionAllow {
			c.bs.Syscalls = append(c.bs.Syscalls, backstoprules.SyscallRule{Name: name, Rule: r})
		}
	}
	if _, ok := c.syscalls["init_module"]; ok {
		c.moduleSyscall = true
	}
	if c.plan.Backstop.Sandboxes == nil {
		c.plan.Backstop.Sandboxes = map[uint32]backstoprules.SandboxRules{}
	}
	c.plan.Backstop.Sandboxes[sid] = *c.bs
	return nil
}

// finish assembles the trace config.
func (c *compiler) finish() {
	// Module attempts: the raw syscall tracepoint records them when no
	// backstop syscall rule sees them (this machine returns ENOSYS before
	// any LSM hook runs, so the attempt is all there is to record).
	if c.moduleSeen {
		c.plan.Trace.ModuleAlerts = true
		c.plan.Trace.ModuleRuleID = c.moduleRuleID
		// Where the LSM module hooks run they record the attempt, and the
		// raw tracepoint (a host-wide cost) is not needed.
		lsmModules := c.hook("kernel_read_file") && c.hook("kernel_load_data")
		if !c.moduleSyscall && !lsmModules {
			c.plan.SyscallStream = true
		}
	}
	var rate float64
	for i := range c.p.Sandboxes {
		sb := &c.p.Sandboxes[i]
		if !sb.Audit.Syscalls {
			continue
		}
		r := sb.Audit.SampleRate
		if r <= 0 {
			r = c.p.Agent.Sampling.Rate
		}
		rate = max(rate, r)
	}
	if rate > 0 {
		// One tracepoint serves every sandbox: the deepest audit wins.
		c.plan.SyscallStream = true
		c.plan.Trace.SampleEvery = uint32(max(1, int(1/rate+0.5)))
	}
	if !c.anyLSM {
		c.plan.LSM = nil
	}
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func dedupe(s []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, x := range s {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	return out
}
