package agent

// The policy compiler: turns a policy into the rule tables of every
// enforcement layer, choosing per rule the strongest mechanism this host
// offers, and says which one it chose.
//
// Layers, strongest first:
//   - BPF LSM (internal/enforce/lsm): a real EPERM before the operation, for
//     every process in the sandbox. Used for each rule whose hook loaded.
//   - cgroup BPF (internal/enforce/cgroupbpf, internal/egress): a real EPERM
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

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/control"
	"github.com/watcherhq/watcher/internal/dangerous"
	"github.com/watcherhq/watcher/internal/dnsproxy"
	"github.com/watcherhq/watcher/internal/egress"
	"github.com/watcherhq/watcher/internal/enforce"
	"github.com/watcherhq/watcher/internal/enforce/backstop"
	"github.com/watcherhq/watcher/internal/enforce/cgroupbpf"
	"github.com/watcherhq/watcher/internal/enforce/lsm"
	"github.com/watcherhq/watcher/internal/enforce/trace"
	"github.com/watcherhq/watcher/internal/gateway"
	"github.com/watcherhq/watcher/internal/launch"
	"github.com/watcherhq/watcher/internal/policy"
)

// Mechanisms named in Plan.Layers.
const (
	MechLSM       = "lsm"
	MechFmodRet   = "fmod_ret" // the LSM layer's decisions as fmod_ret programs on security_* functions
	MechCgroupBPF = "cgroup_bpf"
	MechKill      = "kill"
	MechLaunch    = "seccomp+landlock"
	MechRecord    = "record"
	MechNone      = "none"
)

// RuleTable assigns stable ids (> 0) to rule names: the kernel maps carry
// the id, events are labelled with the name. The agent keeps one table for
// its lifetime, so an id keeps its meaning across policy reloads (events
// already in flight still resolve). The zero value is ready to use.
type RuleTable struct {
	mu    sync.RWMutex
	ids   map[string]uint32
	names []string // names[id-1]
}

// NewRuleTable returns an empty table.
func NewRuleTable() *RuleTable { return &RuleTable{} }

// ID returns the id of name, assigning the next one on first use. The
// empty name has id 0 (no rule).
func (t *RuleTable) ID(name string) uint32 {
	if name == "" {
		return 0
	}
	t.mu.RLock()
	id, ok := t.ids[name]
	t.mu.RUnlock()
	if ok {
		return id
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if id, ok := t.ids[name]; ok {
		return id
	}
	if t.ids == nil {
		t.ids = map[string]uint32{}
	}
	t.names = append(t.names, name)
	id = uint32(len(t.names))
	t.ids[name] = id
	return id
}

// Name returns the name of id, or "" for 0 and unknown ids. Safe for
// concurrent use with ID (the event reader calls it).
func (t *RuleTable) Name(id uint32) string {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if id == 0 || int(id) > len(t.names) {
		return ""
	}
	return t.names[id-1]
}

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
	// under (lsm.MechLSM or lsm.MechFmodRet): lsm.ProbeMechanisms() or
	// LSM.Mechanisms(). Hooks missing here count as BPF LSM.
	LSMMech map[string]string
	// UnixSockets is nil when the cgroup unix socket hooks load (kernel
	// 6.7+: egress.ProbeUnix), or why not.
	UnixSockets error
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
}

// Plan is everything the agent writes into the layers for one policy.
type Plan struct {
	// SandboxIDs maps a sandbox name to its id (index in the policy + 1).
	SandboxIDs map[string]uint32
	// Flags are the sandbox flags per id (enforce.SandboxRecordOnly for
	// mode: record); every sandbox has an entry.
	Flags map[uint32]uint32
	// LSM are the BPF LSM rules per sandbox id; nil when no LSM hook loads.
	LSM map[uint32]lsm.Rules
	// Backstop is the kill backstop's rule set: per-sandbox path rules,
	// host-wide syscall and category rules (the strictest sandbox's
	// action; record mode still downgrades per sandbox in the kernel).
	Backstop backstop.Rules
	// Devices, Sysctl and Sockets are the cgroup BPF rules (per sandbox id).
	Devices []cgroupbpf.DeviceRule
	Sysctl  []cgroupbpf.SysctlRule
	Sockets []cgroupbpf.SocketRule
	// Egress is the egress configuration per sandbox id.
	Egress map[uint32]egress.SandboxConfig
	// ResolvedEgress lists, by sandbox name, the sandboxes whose egress
	// default is "resolved" with their grace period: the DNS proxy's
	// answers admit addresses for these sandboxes only (egress.Options.Grace
	// is host-wide; the largest grace is GraceMax).
	ResolvedEgress map[string]time.Duration
	// GraceMax is the largest grace of ResolvedEgress (0 when empty).
	GraceMax time.Duration
	// DNS is the DNS proxy's policy.
	DNS *dnsproxy.Policy
	// Launch are the restrictions of `watcher exec` per sandbox name.
	Launch map[string]launch.Restrictions
	// Trace configures the recording tracepoints.
	Trace trace.Config
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
	// missing only with RequireLSM.
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
			LSM:            map[uint32]lsm.Rules{},
			Egress:         map[uint32]egress.SandboxConfig{},
			ResolvedEgress: map[string]time.Duration{},
			DNS:            &dnsproxy.Policy{Sandboxes: map[string]*dnsproxy.SandboxPolicy{}},
			Launch:         map[string]launch.Restrictions{},
		},
		syscalls: map[string]backstop.Rule{},
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

	// Host-wide backstop rules, strictest action across sandboxes.
	syscalls map[string]backstop.Rule
	// Per-sandbox demands on host-wide rules, to note where another
	// sandbox's stricter rule applies.
	globalUses []globalUse
	// ioUringOpenKill: some sandbox allows io_uring while its file rules
	// rely on the backstop, whose path checks io_uring opens bypass.
	ioUringOpenKill bool
	// cloneFilesKill: some sandbox's blocking file rules rely on the
	// backstop, so file-table sharing clones must go.
	cloneFilesKill bool
	moduleSeen     bool
	moduleRuleID   uint32
}

// globalUse is one sandbox's action for a host-wide backstop rule.
type globalUse struct {
	layer    int    // index in plan.Layers
	syscall  string // or
	category *backstop.Rule
	action   uint32
}

func (c *compiler) hook(name string) bool {
	err, ok := c.env.LSM[name]
	return ok && err == nil
}

func (c *compiler) hookErr(name string) string {
	if err, ok := c.env.LSM[name]; ok && err != nil {
		return err.Error()
	}
	if err, ok := c.env.LSM["*"]; ok && err != nil {
		return err.Error()
	}
	return "not loaded"
}

// lsmMechanism names the LSM layer as this host runs it: "lsm" (BPF LSM
// programs), "fmod_ret" (the same decisions on the security_* functions,
// where BPF LSM is built but not enabled), or "lsm" with a note naming
// the hooks that run as fmod_ret when both are in use.
func (c *compiler) lsmMechanism(notes []string) (string, []string) {
	var fmod, lsmHooks []string
	for hook, err := range c.env.LSM {
		if err != nil || hook == "*" {
			continue
		}
		if c.env.LSMMech[hook] == lsm.MechFmodRet {
			fmod = append(fmod, hook)
		} else {
			lsmHooks = append(lsmHooks, hook)
		}
	}
	switch {
	case len(fmod) == 0:
		return MechLSM, notes
	case len(lsmHooks) == 0:
		return MechFmodRet, notes
	}
	sort.Strings(fmod)
	return MechLSM, append(slices.Clone(notes), "fmod_ret for "+strings.Join(fmod, ", "))
}

// changeHooks judge changes made without an open for write by the file
// write rules (bpf/lsm.c, path operations).
var changeHooks = []string{"path_truncate", "path_mknod", "path_mkdir", "path_unlink", "path_rmdir",
	"path_symlink", "path_link", "path_rename", "path_chmod", "path_chown", "inode_setxattr", "inode_removexattr"}

// changeHooksNote says which of the change hooks enforce a write rule here.
func (c *compiler) changeHooksNote() string {
	var missing []string
	for _, h := range changeHooks {
		if !c.hook(h) {
			missing = append(missing, h)
		}
	}
	if len(missing) == 0 {
		return "truncate, O_CREAT/mknod, link, rename, unlink, symlink, chmod, chown, xattr refused by lsm path hooks"
	}
	return "not judged here (hooks missing): " + strings.Join(missing, ", ")
}

// kernelAction maps a policy action to the kernel's.
func kernelAction(a policy.Action) uint32 {
	switch a {
	case policy.ActionRecord:
		return enforce.ActionRecord
	case policy.ActionBlock:
		return enforce.ActionBlock
	case policy.ActionKill:
		return enforce.ActionKill
	}
	return enforce.ActionAllow
}

// backstopAction is kernelAction for the backstop, which cannot refuse:
// block is carried out as a kill.
func backstopAction(a policy.Action) uint32 {
	if a == policy.ActionBlock {
		return enforce.ActionKill
	}
	return kernelAction(a)
}

func blocking(a policy.Action) bool { return a == policy.ActionBlock || a == policy.ActionKill }

func orAllow(a policy.Action) policy.Action {
	if a == "" {
		return policy.ActionAllow
	}
	return a
}

// layer describes how one rule is enforced before mode and action are
// applied to the description.
type layer struct {
	mech       string
	notes      []string
	lsmMissing []string // LSM hooks the rule would use that did not load
	capability bool     // a capability rule (see Plan.Missing)
}

// add appends the Layers line of a rule of sb with action a, and the
// Missing entry when it is due. It returns the line's index.
func (c *compiler) add(sb *policy.Sandbox, rule string, a policy.Action, l layer) int {
	a = orAllow(a)
	mech := l.mech
	notes := l.notes
	if mech == MechLSM {
		mech, notes = c.lsmMechanism(notes)
	}
	switch {
	case a == policy.ActionAllow:
		notes = append([]string{"allow"}, notes...)
	case sb.Mode == policy.ModeRecord:
		if mech != MechNone {
			notes = append([]string{fmt.Sprintf("mode: record (%s would be enforced by %s)", a, mech)}, notes...)
			mech = MechRecord
		}
	case a == policy.ActionRecord:
		if mech != MechNone {
			notes = append([]string{"recorded by " + mech}, notes...)
			mech = MechRecord
		} else {
			notes = append([]string{"record (nothing records it on this host)"}, notes...)
		}
	case mech == MechKill:
		// Never "block" where the kernel only kills afterwards.
		what := "killed, stopped after the fact"
		if a == policy.ActionBlock {
			what = "policy says block; killed, stopped after the fact (no layer refuses it here)"
		}
		notes = append([]string{what}, notes...)
	default:
		notes = append([]string{string(a)}, notes...)
	}
	line := control.Layer{Rule: sb.Name + ": " + rule, Mechanism: mech, Note: strings.Join(notes, "; ")}
	c.plan.Layers = append(c.plan.Layers, line)
	if sb.Mode != policy.ModeRecord && blocking(a) {
		switch {
		case c.requireLSM && len(l.lsmMissing) > 0:
			var why []string
			for _, h := range l.lsmMissing {
				why = append(why, "lsm/"+h+": "+c.hookErr(h))
			}
			c.plan.Missing = append(c.plan.Missing, fmt.Sprintf("%s: %s (%s; falls back to %s)", sb.Name, rule, strings.Join(why, ", "), l.mech))
		case l.mech == MechNone && (!l.capability || c.requireLSM):
			c.plan.Missing = append(c.plan.Missing, fmt.Sprintf("%s: %s (no mechanism on this host)", sb.Name, rule))
		}
	}
	return len(c.plan.Layers) - 1
}

func (c *compiler) sandbox(sb *policy.Sandbox, sid uint32) error {
	c.plan.SandboxIDs[sb.Name] = sid
	var flags uint32
	if sb.Mode == policy.ModeRecord {
		flags |= enforce.SandboxRecordOnly
	}
	c.plan.Flags[sid] = flags
	lr := lsm.Rules{Ops: map[lsm.Op]lsm.Decision{}}

	c.operations(sb, &lr)
	c.fixed(sb, &lr)
	if err := c.files(sb, sid, &lr); err != nil {
		return err
	}
	c.capabilities(sb, &lr)
	c.devices(sb, sid, &lr)
	c.rawSockets(sb, sid)
	if err := c.network(sb, sid); err != nil {
		return err
	}
	c.launch(sb)
	if c.anyLSM {
		c.plan.LSM[sid] = lr
	}
	return nil
}

// opPart is one LSM op of a policy operation, with what stands in for it
// in the backstop when its hook is missing.
type opPart struct {
	op       lsm.Op
	hook     string
	syscalls []string
	category func(*backstop.Rules) *backstop.Rule
}

// operation is one entry of policy.Operations.
type operation struct {
	name   string
	action func(*policy.Operations) policy.Action
	parts  []opPart
	// always are syscalls without an LSM hook, killed by the backstop on
	// every host.
	always []string
	// seccomp: `watcher exec` refuses the operation with seccomp.
	seccomp string
}

var operations = []operation{
	{
		name:   "ptrace",
		action: func(o *policy.Operations) policy.Action { return o.Ptrace },
		parts: []opPart{
			{op: lsm.OpPtraceAttach, hook: "ptrace_access_check", syscalls: []string{"ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd"}},
			{op: lsm.OpPtraceTraceme, hook: "ptrace_traceme", syscalls: []string{"ptrace"}},
		},
		seccomp: "ptrace, process_vm_readv/writev, pidfd_getfd",
	},
	{
		name:   "mount",
		action: func(o *policy.Operations) policy.Action { return o.Mount },
		parts: []opPart{
			{op: lsm.OpMount, hook: "sb_mount", syscalls: []string{"mount"}},
			{op: lsm.OpUmount, hook: "sb_umount", syscalls: []string{"umount2"}},
			// open_tree clones a tree that only move_mount can attach.
			{op: lsm.OpMoveMount, hook: "move_mount", syscalls: []string{"move_mount", "open_tree", "open_tree_attr"}},
			{op: lsm.OpPivotRoot, hook: "sb_pivotroot", syscalls: []string{"pivot_root"}},
			{op: lsm.OpChroot, hook: "path_chroot", syscalls: []string{"chroot"}},
			// fsopen itself has no hook; every fsconfig parameter does.
			{op: lsm.OpFSConfig, hook: "fs_context_parse_param", syscalls: []string{"fsopen", "fsconfig", "fsmount", "fspick"}},
		},
		always:  []string{"mount_setattr"},
		seccomp: "the mount family, pivot_root, chroot",
	},
	{
		name:   "module",
		action: func(o *policy.Operations) policy.Action { return o.Module },
		parts: []opPart{
			{op: lsm.OpKernelReadFile, hook: "kernel_read_file", syscalls: []string{"finit_module", "kexec_file_load"}},
			{op: lsm.OpKernelLoadData, hook: "kernel_load_data", syscalls: []string{"init_module", "kexec_load"}},
		},
		always:  []string{"delete_module"},
		seccomp: "module loading and removal, kexec",
	},
	{
		name:    "bpf",
		action:  func(o *policy.Operations) policy.Action { return o.BPF },
		parts:   []opPart{{op: lsm.OpBPF, hook: "bpf", syscalls: []string{"bpf"}}},
		seccomp: "bpf",
	},
	{
		name:   "kill-agent",
		action: func(o *policy.Operations) policy.Action { return o.KillAgent },
		parts: []opPart{
			{op: lsm.OpAgentSignal, hook: "task_kill", category: func(r *backstop.Rules) *backstop.Rule { return &r.SignalAgent }},
			// Without the hook, ptrace of the agent is covered by the
			// ptrace rule's backstop (every ptrace is killed).
			{op: lsm.OpAgentPtrace, hook: "ptrace_access_check"},
			// SIGIO/SIGURG through F_SETOWN: no kill syscall at all.
			{op: lsm.OpAgentSignal, hook: "file_send_sigiotask"},
		},
	},
}

// fixedOperations are refused by watcher exec's seccomp filter whatever
// the policy says; where their LSM hook runs, enforce-mode sandboxes get
// the same refusal on the kernel-hook path (record mode records). Without
// the hook they are left to the backstop's list of dangerous operations.
var fixedOperations = []struct {
	name, hook, seccomp string
	op                  lsm.Op
}{
	{"perf-event-open", "perf_event_open", "perf_event_open", lsm.OpPerfEvent},
	{"keyrings", "key_alloc", "add_key, keyctl, request_key", lsm.OpKeyring},
	{"user-namespaces", "userns_create", "unshare/clone of namespaces", lsm.OpUserNS},
	{"userfaultfd", "inode_init_security_anon", "userfaultfd", lsm.OpUserfaultfd},
}

func (c *compiler) fixed(sb *policy.Sandbox, lr *lsm.Rules) {
	for _, f := range fixedOperations {
		if !c.hook(f.hook) {
			continue
		}
		id := c.rules.ID(f.name)
		lr.Ops[f.op] = lsm.Decision{Action: enforce.ActionBlock, RuleID: id}
		c.add(sb, f.name, policy.ActionBlock, layer{mech: MechLSM, notes: []string{
			"lsm " + f.hook, "watcher exec: seccomp refuses " + f.seccomp}})
	}
}

func (c *compiler) operations(sb *policy.Sandbox, lr *lsm.Rules) {
	for _, op := range operations {
		a := orAllow(op.action(&sb.Operations))
		id := c.rules.ID(op.name)
		var l layer
		var lsmOps, killed []string
		var uses []globalUse
		for _, part := range op.parts {
			if c.hook(part.hook) {
				lr.Ops[part.op] = lsm.Decision{Action: kernelAction(a), RuleID: id}
				lsmOps = append(lsmOps, part.op.String())
				continue
			}
			l.lsmMissing = append(l.lsmMissing, part.hook)
			for _, s := range part.syscalls {
				uses = append(uses, c.bsSyscall(s, backstopAction(a), id))
				killed = append(killed, s)
			}
			if part.category != nil {
				uses = append(uses, c.bsCategory(part.category, backstopAction(a), id))
				killed = append(killed, "kill-family syscalls aimed at the agent (the signal is still delivered)")
			}
		}
		var always []string
		for _, s := range op.always {
			uses = append(uses, c.bsSyscall(s, backstopAction(a), id))
			always = append(always, s)
		}
		switch {
		case len(l.lsmMissing) == 0:
			l.mech = MechLSM
			l.notes = append(l.notes, "lsm: "+strings.Join(lsmOps, ", "))
		case len(lsmOps) == 0:
			l.mech = MechKill
			l.notes = append(l.notes, "backstop: "+strings.Join(dedupe(killed), ", "))
		default:
			// Part of the operation only reaches the backstop: the weakest
			// part decides what the rule is worth.
			l.mech = MechKill
			l.notes = append(l.notes, "lsm: "+strings.Join(lsmOps, ", "), "backstop: "+strings.Join(dedupe(killed), ", "))
		}
		if len(always) > 0 {
			l.notes = append(l.notes, "no LSM hook, always the backstop: "+strings.Join(always, ", "))
		}
		if op.seccomp != "" {
			if blocking(a) {
				l.notes = append(l.notes, "watcher exec: seccomp refuses "+op.seccomp)
			} else {
				l.notes = append(l.notes, "watcher exec: seccomp refuses "+op.seccomp+" whatever the policy says (fixed list)")
			}
		}
		if a == policy.ActionAllow {
			l.notes = nil
			l.mech = MechNone
			l.lsmMissing = nil
		}
		idx := c.add(sb, op.name, a, l)
		for _, u := range uses {
			u.layer = idx
			c.globalUses = append(c.globalUses, u)
		}
		if op.name == "module" && a != policy.ActionAllow {
			c.moduleSeen = true
			c.moduleRuleID = id
		}
	}

	// io_uring: no LSM hook; the backstop refuses io_uring_setup, seccomp
	// too for watcher exec.
	a := orAllow(sb.Operations.IOUring)
	id := c.rules.ID("io-uring")
	u := c.bsCategory(func(r *backstop.Rules) *backstop.Rule { return &r.IOUring }, backstopAction(a), id)
	l := layer{mech: MechKill, notes: []string{"backstop: io_uring_setup, io_uring_enter, io_uring_register (no LSM hook; killed at entry)"}}
	if blocking(a) && c.hook("inode_init_security_anon") {
		// Kernels that give a ring a secure anonymous inode (6.1 does)
		// refuse it before the fact; others leave it to the backstop.
		lr.Ops[lsm.OpIOUring] = lsm.Decision{Action: kernelAction(a), RuleID: id}
		l.notes = append(l.notes, "also refused at io_uring_setup by lsm inode_init_security_anon where the kernel gives rings a secure anonymous inode")
	}
	if blocking(a) {
		// A ring's descriptor can come from outside (SCM_RIGHTS).
		for _, name := range []string{"io_uring_enter", "io_uring_register"} {
			uu := c.bsSyscall(name, backstopAction(a), id)
			uu.layer = len(c.plan.Layers) // the line added below
			c.globalUses = append(c.globalUses, uu)
		}
		l.notes = append(l.notes, "watcher exec: seccomp refuses io_uring_*")
	} else {
		l.mech = MechNone
		l.notes = []string{"io_uring allowed"}
		if !c.hook("file_open") && c.hasBlockingFiles(sb) {
			c.ioUringOpenKill = true
			l.notes = append(l.notes, "open requests submitted to a ring are killed: the backstop cannot judge their paths")
		}
	}
	u.layer = c.add(sb, "io_uring", a, l)
	c.globalUses = append(c.globalUses, u)

	// 32-bit system calls: a sandbox has no use for them, and every rule
	// keyed on syscall numbers would need the i386 table too.
	id = c.rules.ID("ia32-syscalls")
	u = c.bsCategory(func(r *backstop.Rules) *backstop.Rule { return &r.Compat }, enforce.ActionKill, id)
	u.layer = c.add(sb, "ia32_syscalls", policy.ActionKill, layer{mech: MechKill, notes: []string{
		"backstop: every 32-bit syscall (int 0x80) is killed at entry, before the kernel runs it",
		"watcher exec: the seccomp arch guard refuses them"}})
	c.globalUses = append(c.globalUses, u)

	// The kernel group of the one dangerous list: refused whatever the
	// policy says.
	id = c.rules.ID("kernel-interfaces")
	var kernelOps []string
	for _, o := range dangerous.ByGroup(dangerous.GroupKernel) {
		c.bsSyscall(o.Name, enforce.ActionKill, id)
		kernelOps = append(kernelOps, o.Name)
	}
	c.add(sb, "kernel_interfaces", policy.ActionKill, layer{mech: MechKill, notes: []string{
		"backstop: killed at entry (the call itself may complete before the process dies): " + strings.Join(kernelOps, ", "),
		"watcher exec: seccomp refuses them"}})

	// cgroup_write: an LSM filesystem rule on cgroupfs, or the backstop's
	// category; a move out of the sandbox is always at least recorded.
	a = orAllow(sb.Operations.CgroupWrite)
	id = c.rules.ID("cgroup-write")
	if c.hook("file_open") {
		for _, magic := range []uint64{unix.CGROUP2_SUPER_MAGIC, unix.CGROUP_SUPER_MAGIC} {
			lr.FS = append(lr.FS, lsm.FSRule{Magic: magic, Access: lsm.AccessWrite, Decision: lsm.Decision{Action: kernelAction(a), RuleID: id}})
		}
		l = layer{mech: MechLSM, notes: []string{"lsm file_open: write-opens on cgroupfs"}}
		if c.hook("task_alloc") {
			// clone3(CLONE_INTO_CGROUP) moves a child without a write:
			// refused with the rule, recorded at least.
			lr.Ops[lsm.OpCloneIntoCgroup] = lsm.Decision{Action: max(kernelAction(a), enforce.ActionRecord), RuleID: id}
			l.notes = append(l.notes, "lsm task_alloc: clone3(CLONE_INTO_CGROUP)")
		}
		u = c.bsCategory(func(r *backstop.Rules) *backstop.Rule { return &r.CgroupEscape }, max(enforce.ActionRecord, min(backstopAction(a), enforce.ActionRecord)), id)
		l.notes = append(l.notes, "moves out of the sandbox recorded by the backstop")
	} else {
		u = c.bsCategory(func(r *backstop.Rules) *backstop.Rule { return &r.CgroupWrite }, backstopAction(a), id)
		c.globalUses = append(c.globalUses, u)
		u = c.bsCategory(func(r *backstop.Rules) *backstop.Rule { return &r.CgroupEscape }, max(enforce.ActionRecord, backstopAction(a)), id)
		l = layer{mech: MechKill, lsmMissing: []string{"file_open"}, notes: []string{"backstop: write-opens on cgroupfs, and moves out of the sandbox"}}
	}
	if a == policy.ActionAllow {
		l = layer{mech: MechNone, notes: []string{"moves out of the sandbox still recorded"}}
	}
	u.layer = c.add(sb, "cgroup_write", a, l)
	c.globalUses = append(c.globalUses, u)
}

// bsSyscall raises the host-wide backstop rule of a syscall to action.
func (c *compiler) bsSyscall(name string, action, id uint32) globalUse {
	if cur, ok := c.syscalls[name]; !ok || action > cur.Action {
		c.syscalls[name] = backstop.Rule{Action: action, ID: id}
	}
	return globalUse{syscall: name, action: action}
}

// bsCategory raises a host-wide backstop category rule to action.
func (c *compiler) bsCategory(sel func(*backstop.Rules) *backstop.Rule, action, id uint32) globalUse {
	r := sel(&c.plan.Backstop)
	if action > r.Action || r.ID == 0 && action == r.Action {
		*r = backstop.Rule{Action: action, ID: id}
	}
	return globalUse{category: r, action: action}
}

func (c *compiler) hasBlockingFiles(sb *policy.Sandbox) bool {
	for _, r := range c.p.FileRules(sb) {
		if blocking(r.Action) {
			return true
		}
	}
	return false
}

func (c *compiler) capabilities(sb *policy.Sandbox, lr *lsm.Rules) {
	caps := &sb.Operations.Capabilities
	ok := c.hook("capable")
	l := func() layer {
		if ok {
			return layer{mech: MechLSM, notes: []string{"lsm capable"}, capability: true}
		}
		return layer{mech: MechNone, capability: true, lsmMissing: []string{"capable"},
			notes: []string{"no capable hook without BPF LSM; the operations the capability unlocks have rules of their own"}}
	}
	explicit := map[int]bool{}
	for _, r := range caps.Rules {
		n, known := policy.CapabilityNumber(r.Cap)
		if !known || explicit[n] {
			continue // validated policies have none; the first rule wins (CapabilityAction)
		}
		explicit[n] = true
		name := "cap:" + policy.CapabilityName(n)
		if ok {
			lr.Caps = append(lr.Caps, lsm.CapRule{Cap: n, Decision: lsm.Decision{Action: kernelAction(r.Action), RuleID: c.rules.ID(name)}})
		}
		c.add(sb, "capability "+policy.CapabilityName(n), r.Action, l())
	}
	def := orAllow(caps.Default)
	if def == policy.ActionAllow {
		return
	}
	id := c.rules.ID("cap-default")
	if ok {
		for n := 0; policy.CapabilityName(n) != ""; n++ {
			if !explicit[n] {
				lr.Caps = append(lr.Caps, lsm.CapRule{Cap: n, Decision: lsm.Decision{Action: kernelAction(def), RuleID: id}})
			}
		}
	}
	c.add(sb, "capabilities (default)", def, l())
}

// Device numbers covered by operations.devices besides every block
// device: /dev/mem, /dev/kmem, /dev/port, /dev/kmsg (char major 1).
var memDevices = []uint32{1, 2, 4, 11}

func (c *compiler) devices(sb *policy.Sandbox, sid uint32, lr *lsm.Rules) {
	a := orAllow(sb.Operations.Devices)
	id := c.rules.ID("devices")
	if a == policy.ActionAllow {
		c.add(sb, "devices", a, layer{mech: MechNone})
		return
	}
	var l layer
	if c.cgroupOK {
		c.plan.Devices = append(c.plan.Devices, cgroupbpf.DeviceRule{Sandbox: sid, Type: cgroupbpf.BlockDevice,
			Major: cgroupbpf.Any, Minor: cgroupbpf.Any, Action: kernelAction(a), RuleID: id})
		for _, minor := range memDevices {
			c.plan.Devices = append(c.plan.Devices, cgroupbpf.DeviceRule{Sandbox: sid, Type: cgroupbpf.CharDevice,
				Major: 1, Minor: int(minor), Action: kernelAction(a), RuleID: id})
		}
		l = layer{mech: MechCgroupBPF, notes: []string{"cgroup/dev: block devices, /dev/mem, /dev/kmem, /dev/port, /dev/kmsg (open and mknod)"}}
	}
	if c.hook("file_open") {
		lr.Devices = append(lr.Devices, lsm.DeviceRule{Block: true, Major: lsm.AnyDevice, Minor: lsm.AnyDevice,
			Decision: lsm.Decision{Action: kernelAction(a), RuleID: id}})
		for _, minor := range memDevices {
			lr.Devices = append(lr.Devices, lsm.DeviceRule{Major: 1, Minor: minor, Decision: lsm.Decision{Action: kernelAction(a), RuleID: id}})
		}
		if l.mech == "" {
			l = layer{mech: MechLSM, notes: []string{"lsm file_open by device number"}}
		} else {
			l.notes = append(l.notes, "also lsm file_open")
		}
	}
	if l.mech == "" {
		l = layer{mech: MechNone, notes: []string{"cgroup BPF unavailable: " + c.env.CgroupBPF.Error()}}
	}
	c.add(sb, "devices", a, l)
}

func (c *compiler) rawSockets(sb *policy.Sandbox, sid uint32) {
	a := orAllow(sb.Operations.RawSockets)
	if a == policy.ActionAllow {
		c.add(sb, "raw_sockets", a, layer{mech: MechNone})
		return
	}
	id := c.rules.ID("raw-sockets")
	note := "AF_PACKET: cgroup/sock_create does not run for packet sockets; the backstop kills socket(AF_PACKET) at entry (host-wide category: the strictest sandbox's action; no LSM socket_create program yet), seccomp refuses it under watcher exec"
	if !c.cgroupOK {
		c.add(sb, "raw_sockets", a, layer{mech: MechNone, notes: []string{"cgroup BPF unavailable: " + c.env.CgroupBPF.Error(), note}})
		return
	}
	c.plan.Sockets = append(c.plan.Sockets, cgroupbpf.SocketRule{Sandbox: sid, Family: cgroupbpf.Any,
		Type: unix.SOCK_RAW, Protocol: cgroupbpf.Any, Action: kernelAction(a), RuleID: id})
	c.bsCategory(func(r *backstop.Rules) *backstop.Rule { return &r.PacketSocket }, backstopAction(a), c.rules.ID("packet-sockets"))
	c.add(sb, "raw_sockets", a, layer{mech: MechCgroupBPF, notes: []string{"cgroup/sock_create: SOCK_RAW on IPv4 and IPv6", note}})
}

// --- file and exec rules ---

// access indexes the accesses a path key decides.
type access int

const (
	accRead access = iota
	accWrite
	accExec
	numAccess
)

// pathKey is one entry of an LPM path table: a prefix or an exact path.
type pathKey struct {
	path   string
	prefix bool
}

// maxRulePath is the longest path the LSM and backstop tables hold.
const maxRulePath = 251

// fileTable decides accesses for path keys the way policy.DecideFile does
// for paths: for a prefix key, the most specific prefix rule enclosing it;
// for an exact key, every rule matching the path. Since a longest-prefix
// lookup of any path finds the key of the most specific rule matching it,
// writing each key with these decisions makes the kernel's lookup agree
// with the policy (including inheritance: a key written for one access
// carries the enclosing rules' decision for the others).
type fileTable struct {
	files, filePrefix []policy.FileRule
	exec, execPrefix  []policy.FileRule
}

func newFileTable(files, exec []policy.FileRule) *fileTable {
	t := &fileTable{files: files, exec: exec}
	for _, r := range files {
		if r.Match == policy.MatchPrefix {
			t.filePrefix = append(t.filePrefix, r)
		}
	}
	for _, r := range exec {
		if r.Match == policy.MatchPrefix {
			t.execPrefix = append(t.execPrefix, r)
		}
	}
	return t
}

func (t *fileTable) decide(k pathKey, acc access) (policy.FileRule, bool) {
	switch {
	case acc == accExec && k.prefix:
		return policy.DecideFile(t.execPrefix, k.path, false)
	case acc == accExec:
		return policy.DecideFile(t.exec, k.path, false)
	case k.prefix:
		return policy.DecideFile(t.filePrefix, k.path, acc == accWrite)
	}
	return policy.DecideFile(t.files, k.path, acc == accWrite)
}

// keysOf returns the table keys of rules: a prefix key per prefix rule (and
// an exact key for the directory itself when the path ends in "/"), an
// exact key per exact rule. Sorted, no duplicates.
func keysOf(rules ...[]policy.FileRule) []pathKey {
	seen := map[pathKey]bool{}
	for _, list := range rules {
		for _, r := range list {
			if r.Match == policy.MatchPrefix {
				seen[pathKey{r.Path, true}] = true
				if len(r.Path) > 1 && strings.HasSuffix(r.Path, "/") {
					seen[pathKey{strings.TrimSuffix(r.Path, "/"), false}] = true
				}
			} else {
				seen[pathKey{r.Path, false}] = true
			}
		}
	}
	out := make([]pathKey, 0, len(seen))
	for k := range seen {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].path != out[j].path {
			return out[i].path < out[j].path
		}
		return !out[i].prefix && out[j].prefix
	})
	return out
}

// isProcMem reports whether a rule path names /proc/PID/mem (or a task's):
// the LSM's proc_mem op and the backstop's ProcMem category judge those by
// inode, for every PID, where a path table could only list today's PIDs.
func isProcMem(p string) bool {
	return strings.HasPrefix(p, "/proc/*/") && strings.HasSuffix(p, "/mem")
}

// expandWildcards replaces each "*" component by the names that exist now
// (filepath.Glob), keeping the literal components after the last "*", so
// "/home/*/.ssh/" covers the .ssh directory of every existing home even
// before it is created. Sorted.
func expandWildcards(p string) ([]string, error) {
	trailing := strings.HasSuffix(p, "/") && len(p) > 1
	comps := strings.Split(strings.TrimSuffix(p, "/"), "/")
	last := -1
	for i, comp := range comps {
		if comp == "*" {
			last = i
		}
	}
	if last < 0 {
		return []string{p}, nil
	}
	pattern := make([]string, last+1)
	for i, comp := range comps[:last+1] {
		if comp == "*" {
			pattern[i] = comp
		} else {
			pattern[i] = globEscape(comp)
		}
	}
	rest := strings.Join(comps[last+1:], "/")
	matches, err := filepath.Glob(strings.Join(pattern, "/"))
	if err != nil {
		return nil, fmt.Errorf("expand %q: %w", p, err)
	}
	var out []string
	for _, m := range matches {
		e := m
		if rest != "" {
			if st, err := os.Stat(m); err != nil || !st.IsDir() {
				continue
			}
			e += "/" + rest
		}
		if trailing {
			e += "/"
		}
		out = append(out, e)
	}
	sort.Strings(out)
	return out, nil
}

func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// fileRuleLine is the Layers line of one policy file rule.
type fileRuleLine struct {
	rule     policy.FileRule
	exec     bool
	expanded []string // wildcard expansions, nil when the path has none
	special  string   // "proc_mem", "proc_wildcard"
}

func describe(r policy.FileRule, exec bool) string {
	if exec {
		return fmt.Sprintf("exec rule %s (%s %s)", r.RuleName(), r.Match, r.Path)
	}
	return fmt.Sprintf("file rule %s (%s %s %s)", r.RuleName(), r.Access, r.Match, r.Path)
}

func (c *compiler) fileRules(sb *policy.Sandbox) []policy.FileRule {
	rules := c.p.FileRules(sb)
	a := orAllow(sb.Operations.AgentFiles)
	if a == policy.ActionAllow {
		return rules
	}
	have := map[string]bool{}
	for _, r := range rules {
		have[r.Path] = true
	}
	for _, f := range c.env.AgentFiles {
		if f == "" || !filepath.IsAbs(f) {
			continue
		}
		f = filepath.Clean(f)
		if st, err := os.Stat(f); err == nil && st.IsDir() {
			if !have[f+"/"] {
				rules = append(rules, policy.FileRule{Name: "agent-files", Path: f + "/", Match: policy.MatchPrefix, Access: policy.AccessAny, Action: a})
				have[f+"/"] = true
			}
		}
		if !have[f] {
			rules = append(rules, policy.FileRule{Name: "agent-files", Path: f, Match: policy.MatchExact, Access: policy.AccessAny, Action: a})
			have[f] = true
		}
	}
	return rules
}

func (c *compiler) files(sb *policy.Sandbox, sid uint32, lr *lsm.Rules) error {
	fileOpen := c.hook("file_open")
	var lines []fileRuleLine
	var files, execs []policy.FileRule
	var procMem []policy.FileRule

	expand := func(r policy.FileRule, exec bool) ([]policy.FileRule, error) {
		line := fileRuleLine{rule: r, exec: exec}
		var out []policy.FileRule
		switch {
		case !exec && isProcMem(r.Path):
			line.special = "proc_mem"
			procMem = append(procMem, r)
		case strings.HasPrefix(r.Path, "/proc/*") || strings.HasPrefix(r.Path, "/proc/self/") || r.Path == "/proc/self":
			// PIDs come and go: a compile-time expansion would be stale at
			// once.
			line.special = "proc_wildcard"
		default:
			paths, err := expandWildcards(r.Path)
			if err != nil {
				return nil, err
			}
			if strings.Contains(r.Path, "*") {
				line.expanded = paths
				if line.expanded == nil {
					line.expanded = []string{}
				}
			}
			for _, p := range paths {
				if len(p) > maxRulePath {
					return nil, fmt.Errorf("%s: path %q is longer than %d bytes, the kernel tables' limit", describe(r, exec), p, maxRulePath)
				}
				e := r
				if e.Name == "" {
					e.Name = r.RuleName() // keep the policy's name for expansions
				}
				e.Path = p
				out = append(out, e)
			}
		}
		lines = append(lines, line)
		return out, nil
	}
	for _, r := range c.fileRules(sb) {
		out, err := expand(r, false)
		if err != nil {
			return err
		}
		files = append(files, out...)
	}
	for _, r := range sb.ExecRules() {
		out, err := expand(r, true)
		if err != nil {
			return err
		}
		execs = append(execs, out...)
	}
	for _, r := range sb.ExecRules() {
		if blocking(r.Action) {
			// A file with no path escapes every exec rule: refuse them.
			c.bsCategory(func(r *backstop.Rules) *backstop.Rule { return &r.ExecFileless }, enforce.ActionKill, c.rules.ID("exec-fileless"))
			c.bsCategory(func(r *backstop.Rules) *backstop.Rule { return &r.MmapExec }, enforce.ActionKill, c.rules.ID("exec-mmap"))
			break
		}
	}
	if def := orAllow(sb.Exec.Default); def != policy.ActionAllow {
		// The default as the least specific rule: DecideFile prefers any
		// real rule on "/" (first on a tie).
		execs = append(execs, policy.FileRule{Name: "exec-default", Path: "/", Match: policy.MatchPrefix, Action: def})
	}
	t := newFileTable(files, execs)

	// BPF LSM file_open: every file rule, both accesses written out.
	if fileOpen {
		for _, k := range keysOf(files) {
			var ds [2]lsm.Decision
			for acc := accRead; acc <= accWrite; acc++ {
				if r, ok := t.decide(k, acc); ok {
					ds[acc] = lsm.Decision{Action: kernelAction(r.Action), RuleID: c.rules.ID(r.RuleName())}
				}
			}
			if ds[accRead] == ds[accWrite] {
				lr.Paths = append(lr.Paths, lsm.PathRule{Path: k.path, Prefix: k.prefix, Access: lsm.AccessAll, Decision: ds[accRead]})
				continue
			}
			lr.Paths = append(lr.Paths,
				lsm.PathRule{Path: k.path, Prefix: k.prefix, Access: lsm.AccessRead, Decision: ds[accRead]},
				lsm.PathRule{Path: k.path, Prefix: k.prefix, Access: lsm.AccessWrite, Decision: ds[accWrite]})
		}
	}

	// Exec rules on the LSM layer: bprm_check_security judges every binary
	// of an execve chain (a script, then its interpreter), mmap_file and
	// file_mprotect every file mapped executable (ld.so /tmp/x).
	lsmExec := c.hook("bprm_check_security") && c.hook("mmap_file")
	if lsmExec {
		for _, k := range keysOf(execs) {
			if r, ok := t.decide(k, accExec); ok {
				lr.Exec = append(lr.Exec, lsm.ExecRule{Path: k.path, Prefix: k.prefix,
					Decision: lsm.Decision{Action: kernelAction(r.Action), RuleID: c.rules.ID(r.RuleName())}})
			}
		}
	}

	// /proc/PID/mem: an op, not a path. The rules decide as DecideFile
	// would for a PID's mem file (a sandbox's own rule overrides its
	// preset's); the op has one action, the stricter of read and write.
	var procMemRule policy.FileRule
	var procMemSet bool
	for _, probe := range []string{"/proc/1/mem", "/proc/1/task/1/mem"} {
		for _, write := range []bool{false, true} {
			if r, ok := policy.DecideFile(procMem, probe, write); ok && (!procMemSet || kernelAction(r.Action) > kernelAction(procMemRule.Action)) {
				procMemRule, procMemSet = r, true
			}
		}
	}
	if procMemSet && fileOpen {
		lr.Ops[lsm.OpProcMem] = lsm.Decision{Action: kernelAction(procMemRule.Action), RuleID: c.rules.ID(procMemRule.RuleName())}
	}
	var procMemUse *globalUse
	if procMemSet && !fileOpen {
		u := c.bsCategory(func(r *backstop.Rules) *backstop.Rule { return &r.ProcMem }, backstopAction(procMemRule.Action), c.rules.ID(procMemRule.RuleName()))
		procMemUse = &u
	}

	// /proc/sys through cgroup/sysctl.
	var sysctlRules int
	if c.cgroupOK {
		sysctlRules = c.sysctl(sid, t, files)
	}

	// The backstop: file rules when file_open has no LSM program, exec
	// rules always (no LSM hook judges exec here).
	var accs []access
	var keyRules [][]policy.FileRule
	if !lsmExec {
		accs, keyRules = []access{accExec}, [][]policy.FileRule{execs}
	}
	if !fileOpen {
		accs = []access{accRead, accWrite, accExec}
		keyRules = append(keyRules, files)
	}
	lost := map[string][]string{} // rule name -> what the backstop cannot apply
	keys := keysOf(keyRules...)
	if !fileOpen && c.cgroupOK && sysctlRules > 0 && !slices.Contains(keys, pathKey{"/proc/sys/", true}) {
		keys = append(keys, pathKey{"/proc/sys/", true})
	}
	for _, k := range keys {
		var acts [numAccess]uint32
		var ids [numAccess]uint32
		var names [numAccess]string
		for _, acc := range accs {
			if acc != accExec && c.cgroupOK && sysctlRules > 0 && (strings.HasPrefix(k.path, "/proc/sys/") || k.path == "/proc/sys") {
				// cgroup/sysctl refuses these reads and writes with EPERM;
				// a kill at open would only pre-empt it.
				continue
			}
			if r, ok := t.decide(k, acc); ok {
				acts[acc] = backstopAction(r.Action)
				names[acc] = r.RuleName()
				ids[acc] = c.rules.ID(names[acc])
			}
		}
		var top uint32
		for _, acc := range accs {
			top = max(top, acts[acc])
		}
		var ops backstop.Op
		var id uint32
		for _, acc := range accs {
			if acts[acc] != top {
				if acts[acc] != enforce.ActionAllow {
					// One action per key: the lesser one is not applied.
					lost[names[acc]] = append(lost[names[acc]], fmt.Sprintf("%s of %s", accName(acc), k.path))
				}
				continue
			}
			ops |= accOp(acc)
			if id == 0 {
				id = ids[acc]
			}
		}
		if ops == 0 {
			continue
		}
		c.plan.Backstop.Paths = append(c.plan.Backstop.Paths, backstop.PathRule{
			Path: k.path, Prefix: k.prefix, Ops: ops, SandboxID: sid, Rule: backstop.Rule{Action: top, ID: id}})
	}
	if !fileOpen {
		// Changes made without a write-open, judged by inode (see
		// backstop.DirRule): writable places, places whose reads are
		// refused, the write default on "/".
		for _, k := range keysOf(files) {
			if w, ok := t.decide(k, accWrite); ok {
				switch {
				case k.path == "/" && k.prefix:
					c.plan.Backstop.Dirs = append(c.plan.Backstop.Dirs, backstop.DirRule{Kind: backstop.DirDefault, SandboxID: sid,
						Rule: backstop.Rule{Action: backstopAction(w.Action), ID: c.rules.ID(w.RuleName())}})
				case w.Action == policy.ActionAllow:
					c.plan.Backstop.Dirs = append(c.plan.Backstop.Dirs, backstop.DirRule{Path: k.path, Kind: backstop.DirWritable, SandboxID: sid})
				}
			}
			if r, ok := t.decide(k, accRead); ok && blocking(r.Action) && k.path != "/" {
				c.plan.Backstop.Dirs = append(c.plan.Backstop.Dirs, backstop.DirRule{Path: k.path, Kind: backstop.DirProtected, SandboxID: sid,
					Rule: backstop.Rule{Action: backstopAction(r.Action), ID: c.rules.ID(r.RuleName())}})
			}
		}
		for _, r := range files {
			if blocking(r.Action) {
				// A partner sharing the file table could use a descriptor
				// the killed opener got.
				c.cloneFilesKill = true
				break
			}
		}
	}

	// Layers, one line per policy rule.
	for _, line := range lines {
		r := line.rule
		var l layer
		under := func(prefix string) bool { return strings.HasPrefix(r.Path, prefix) }
		switch {
		case line.special == "proc_mem":
			if fileOpen {
				l = layer{mech: MechLSM, notes: []string{"lsm file_open: proc_mem op, every PID (self included), by inode"}}
			} else {
				l = layer{mech: MechKill, lsmMissing: []string{"file_open"}, notes: []string{"backstop: opens of another process's /proc/PID/mem (its own stays open)"}}
			}
		case line.special == "proc_wildcard":
			l = layer{mech: MechNone, notes: []string{"per-PID /proc paths cannot be listed ahead of time; only /proc/*/mem has a dedicated check"}}
		case line.exec && lsmExec:
			l = layer{mech: MechLSM, notes: []string{"lsm bprm_check_security on the binary, a script and its interpreter",
				"mmap_file/file_mprotect on files mapped executable (the dynamic loader, libraries)"}}
			if !c.hook("file_mprotect") {
				l.notes = append(l.notes, "mprotect(PROT_EXEC) not judged (file_mprotect missing)")
			}
		case line.exec:
			l = layer{mech: MechKill, lsmMissing: []string{"bprm_check_security", "mmap_file"},
				notes: []string{"backstop at exec (sched_prepare_exec); no LSM hook judges exec here"}}
		case !line.exec && c.cgroupOK && sysctlRules > 0 && (under("/proc/sys/") || r.Path == "/proc/sys"):
			if fileOpen {
				l = layer{mech: MechLSM, notes: []string{"lsm file_open", "also cgroup/sysctl at read/write"}}
			} else {
				l = layer{mech: MechCgroupBPF, notes: []string{"cgroup/sysctl refuses the read or write"}}
			}
		case fileOpen:
			l = layer{mech: MechLSM, notes: []string{"lsm file_open on the resolved path"}}
			if r.Access != policy.AccessRead {
				l.notes = append(l.notes, c.changeHooksNote())
			}
		default:
			l = layer{mech: MechKill, lsmMissing: []string{"file_open"}, notes: []string{"backstop at open, on the resolved path"}}
		}
		if line.expanded != nil {
			if len(line.expanded) == 0 {
				l.notes = append(l.notes, "'*' matched nothing when compiled (reload to pick up new matches)")
			} else {
				l.notes = append(l.notes, fmt.Sprintf("'*' expanded when compiled to %s (reload to pick up new matches)", strings.Join(line.expanded, ", ")))
			}
		}
		if lostWhat, ok := lost[r.RuleName()]; ok && l.mech == MechKill {
			l.notes = append(l.notes, "backstop holds one action per path, so not applied: "+strings.Join(dedupe(lostWhat), ", "))
		}
		idx := c.add(sb, describe(r, line.exec), r.Action, l)
		if line.special == "proc_mem" && procMemUse != nil {
			u := *procMemUse
			u.layer = idx
			c.globalUses = append(c.globalUses, u)
		}
	}
	return nil
}

func accName(a access) string {
	return [...]string{"reads", "writes", "execs"}[a]
}

func accOp(a access) backstop.Op {
	return [...]backstop.Op{backstop.OpRead, backstop.OpWrite, backstop.OpExec}[a]
}

// maxSysctlWalk bounds the /proc/sys entries listed for one prefix rule.
const maxSysctlWalk = 8192

// sysctl writes the sandbox's rules on /proc/sys as cgroup/sysctl rules:
// the decision for /proc/sys/ as a whole (the "every name" entry), and
// every name whose decision differs from it: exact rules, and the entries
// now below a deeper prefix rule (listed from this host's /proc/sys; the
// names are the same in other network namespaces except per-interface
// ones). It returns how many rules it wrote.
func (c *compiler) sysctl(sid uint32, t *fileTable, files []policy.FileRule) int {
	const root = "/proc/sys/"
	touches := false
	for _, r := range files {
		if strings.HasPrefix(r.Path, root) || r.Match == policy.MatchPrefix && strings.HasPrefix(root, r.Path) {
			touches = true
			break
		}
	}
	if !touches {
		return 0
	}
	n := 0
	var base [2]policy.Action
	for acc := accRead; acc <= accWrite; acc++ {
		if r, ok := t.decide(pathKey{root, true}, acc); ok {
			base[acc] = r.Action
			if r.Action != policy.ActionAllow {
				c.plan.Sysctl = append(c.plan.Sysctl, cgroupbpf.SysctlRule{Sandbox: sid, Write: acc == accWrite,
					Action: kernelAction(r.Action), RuleID: c.rules.ID(r.RuleName())})
				n++
			}
		}
	}
	names := map[string]bool{}
	for _, r := range files {
		if !strings.HasPrefix(r.Path, root) || r.Path == root {
			continue
		}
		if r.Match == policy.MatchExact {
			names[strings.TrimPrefix(r.Path, root)] = true
			continue
		}
		// A deeper prefix: list the entries below it now.
		dir := strings.TrimSuffix(r.Path, "/")
		count := 0
		filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil || count >= maxSysctlWalk {
				return filepath.SkipDir
			}
			if !d.IsDir() && strings.HasPrefix(p, r.Path) {
				names[strings.TrimPrefix(p, root)] = true
				count++
			}
			return nil
		})
	}
	sorted := make([]string, 0, len(names))
	for name := range names {
		sorted = append(sorted, name)
	}
	sort.Strings(sorted)
	for _, name := range sorted {
		if len(name) >= 96 { // the kernel map's name buffer
			continue
		}
		for acc := accRead; acc <= accWrite; acc++ {
			r, ok := policy.DecideFile(files, root+name, acc == accWrite)
			a := policy.ActionAllow
			if ok {
				a = r.Action
			}
			if a == orAllow(base[acc]) {
				continue
			}
			c.plan.Sysctl = append(c.plan.Sysctl, cgroupbpf.SysctlRule{Sandbox: sid, Name: name, Write: acc == accWrite,
				Action: kernelAction(a), RuleID: c.rules.ID(r.RuleName())})
			n++
		}
	}
	return n
}

// --- network ---

var (
	loopback4 = netip.MustParsePrefix("127.0.0.0/8")
	loopback6 = netip.MustParsePrefix("::1/128")
)

func egressProto(p policy.Protocol, def egress.Protocol) egress.Protocol {
	switch p {
	case policy.ProtoTCP:
		return egress.ProtoTCP
	case policy.ProtoUDP:
		return egress.ProtoUDP
	case policy.ProtoAny:
		return egress.ProtoAny
	}
	return def
}

func (c *compiler) network(sb *policy.Sandbox, sid uint32) error {
	record := sb.Mode == policy.ModeRecord
	cfg := egress.SandboxConfig{
		RecordOnly: record,
		Proxy4:     c.env.DNSProxy4,
		Proxy6:     c.env.DNSProxy6,
		DNSRuleID:  c.rules.ID("dns-redirect"),
	}
	eg := &sb.Egress
	for _, s := range eg.Loopback {
		name := "loopback:" + s.Name
		if s.Name == "" {
			name = fmt.Sprintf("loopback:%d", s.Port)
		}
		id := c.rules.ID(name)
		ports := egress.PortRange{Lo: uint16(s.Port), Hi: uint16(s.Port)}
		proto := egressProto(s.Protocol, egress.ProtoTCP)
		cfg.Rules = append(cfg.Rules,
			egress.Rule{ID: id, Prefix: loopback4, Ports: ports, Protocol: proto},
			egress.Rule{ID: id, Prefix: loopback6, Ports: ports, Protocol: proto})
		c.add(sb, fmt.Sprintf("egress loopback %s (port %d)", s.Name, s.Port), policy.ActionAllow,
			layer{mech: MechCgroupBPF, notes: []string{"127.0.0.0/8 and ::1"}})
	}
	for _, r := range eg.Allow {
		pfx, err := policy.ParseCIDR(r.CIDR)
		if err != nil {
			return fmt.Errorf("egress allow %q: %w", r.CIDR, err)
		}
		id := c.rules.ID("egress:" + pfx.String())
		proto := egressProto(r.Protocol, egress.ProtoAny)
		ranges := []egress.PortRange{{}} // every port
		if len(r.Ports) > 0 {
			ranges = ranges[:0]
			for _, pr := range r.Ports {
				lo, hi, err := pr.Bounds()
				if err != nil {
					return fmt.Errorf("egress allow %s: %w", pfx, err)
				}
				ranges = append(ranges, egress.PortRange{Lo: lo, Hi: hi})
			}
		}
		for _, pr := range ranges {
			cfg.Rules = append(cfg.Rules, egress.Rule{ID: id, Prefix: pfx, Ports: pr, Protocol: proto})
		}
		c.add(sb, "egress allow "+pfx.String(), policy.ActionAllow, layer{mech: MechCgroupBPF})
	}
	def := eg.Default
	if def == "" {
		def = policy.EgressResolved
	}
	defNote := []string{"connect/sendmsg programs on the sandbox cgroups"}
	switch def {
	case policy.EgressAllow:
		id := c.rules.ID("egress-default-allow")
		for _, p := range []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")} {
			cfg.Rules = append(cfg.Rules, egress.Rule{ID: id, Prefix: p})
		}
		defNote = append(defNote, "every destination allowed")
	case policy.EgressResolved:
		grace := time.Duration(eg.GraceSeconds) * time.Second
		c.plan.ResolvedEgress[sb.Name] = grace
		c.plan.GraceMax = max(c.plan.GraceMax, grace)
		defNote = append(defNote, fmt.Sprintf("other destinations only at addresses the DNS proxy answered, for their TTL plus %s", grace))
	case policy.EgressDeny:
		defNote = append(defNote, "other destinations refused, even when resolved")
	}
	if def != policy.EgressAllow {
		c.sideDoors(sb, sid, &cfg)
	}
	if err := checkRanges(cfg.Rules); err != nil {
		return err
	}
	c.plan.Egress[sid] = cfg
	egAction := policy.ActionBlock
	if def == policy.EgressAllow {
		egAction = policy.ActionAllow
	}
	c.add(sb, "egress default "+string(def), egAction, layer{mech: MechCgroupBPF, notes: defNote})

	// DNS: redirected in the kernel, judged by the proxy.
	d := &sb.DNS
	sp := &dnsproxy.SandboxPolicy{
		Allow:           slices.Clone(d.Allow),
		Deny:            slices.Clone(d.Deny),
		Default:         string(d.Default),
		HighCardinality: slices.Clone(d.Detection.HighCardinality),
		RateLimit:       dnsproxy.RateLimit{QPS: float64(d.Detection.RateLimit)},
		LocalAllow:      localAllowOf(cfg.Rules),
		Detection: dnsproxy.Detection{
			Mode:             "off",
			Window:           dnsproxy.Duration(d.Detection.Window.Duration),
			MaxDistinctNames: d.Detection.MaxDistinctNames,
			MaxInfoBits:      float64(d.Detection.InfoBudgetBits),
		},
	}
	if d.Detection.Enabled {
		sp.Detection.Mode = "enforce"
		if d.Detection.Action == policy.ActionRecord || record {
			sp.Detection.Mode = "record"
		}
	}
	var dnsNotes []string
	for _, fam := range []struct {
		name  string
		proxy netip.AddrPort
	}{{"IPv4", c.env.DNSProxy4}, {"IPv6", c.env.DNSProxy6}} {
		if fam.proxy.IsValid() {
			dnsNotes = append(dnsNotes, fmt.Sprintf("DNS over %s redirected in the kernel to the proxy at %s", fam.name, fam.proxy))
		} else {
			dnsNotes = append(dnsNotes, fmt.Sprintf("DNS over %s refused (no proxy address)", fam.name))
		}
	}
	dnsNotes = append(dnsNotes,
		fmt.Sprintf("proxy: default %s, %d allowed, %d denied names, detection %s", orDNS(d.Default), len(d.Allow), len(d.Deny), sp.Detection.Mode))
	if def != policy.EgressAllow {
		dnsNotes = append(dnsNotes, fmt.Sprintf("answers with loopback, private, link-local, unique-local, metadata or host addresses refused (DNS rebinding) outside %d explicit egress networks; such addresses are never admitted by an answer", len(sp.LocalAllow)))
	}
	if record {
		// The proxy has no record mode for its name lists: refusing names
		// would break the workload record mode promises to leave alone.
		// Every query is still an event.
		sp.Default = string(policy.DNSAllow)
		sp.Deny = nil
		dnsNotes = append(dnsNotes, "mode: record: every name is answered (the lists are not applied; each query is still recorded)")
	}
	c.plan.DNS.Sandboxes[sb.Name] = sp
	dnsAction := policy.ActionBlock
	if sp.Default == string(policy.DNSAllow) && len(sp.Deny) == 0 && !d.Detection.Enabled {
		dnsAction = policy.ActionAllow
	}
	c.add(sb, "dns", dnsAction, layer{mech: MechCgroupBPF, notes: dnsNotes})
	return nil
}

// localAllowOf is the DNS proxy's local allowance of a sandbox: answers may
// carry local addresses (loopback, private, metadata...) only inside the
// networks its explicit egress rules name (egress.allow, loopback services,
// every network for egress default allow); anything else is DNS rebinding.
func localAllowOf(rules []egress.Rule) []string {
	var out []string
	for _, r := range rules {
		if p := r.Prefix.Masked().String(); !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

// sideDoors closes the ways around the connect/sendmsg hooks and the DNS
// proxy for a sandbox whose egress is not allow: ping sockets (their
// unconnected sendto runs no cgroup hook), other resolvers' ports at
// answered addresses, and unix sockets of host resolvers and brokers.
func (c *compiler) sideDoors(sb *policy.Sandbox, sid uint32, cfg *egress.SandboxConfig) {
	cfg.ResolverPorts = true
	c.add(sb, "egress: other resolvers' ports", policy.ActionBlock, layer{mech: MechCgroupBPF,
		notes: []string{"DNS over TLS/QUIC (853, 784, 8853), mDNS 5353, LLMNR 5355, NetBIOS 137 refused even at answered addresses unless egress.allow names them; DoH (443) to an allowed name is the policy's call"}})

	pingNote := "cgroup/sock_create: SOCK_DGRAM ICMP and ICMPv6 (ping) sockets, whose unconnected sendto no connect/sendmsg hook sees"
	if !c.cgroupOK {
		c.add(sb, "egress: ping sockets", policy.ActionBlock, layer{mech: MechNone, notes: []string{"cgroup BPF unavailable: " + c.env.CgroupBPF.Error()}})
	} else {
		c.plan.Sockets = append(c.plan.Sockets, cgroupbpf.PingSocketRules(sid, c.rules.ID("ping-sockets"))...)
		c.add(sb, "egress: ping sockets", policy.ActionBlock, layer{mech: MechCgroupBPF, notes: []string{pingNote}})
	}

	cfg.RestrictUnix = true
	for _, w := range sb.Workspace {
		cfg.UnixPaths = append(cfg.UnixPaths, strings.TrimSuffix(w, "/")+"/")
	}
	cfg.UnixPaths = append(cfg.UnixPaths, sb.Egress.Unix...)
	cfg.UnixPaths = append(cfg.UnixPaths, c.env.AbsentProbeSockets...)
	if sb.Tools.Enabled {
		// The sandbox's own tool gateway, and no other sandbox's.
		cfg.UnixPaths = append(cfg.UnixPaths, gateway.SocketPath(c.p.Agent.SocketDir, sb.Name))
	}
	unixNote := []string{fmt.Sprintf("cgroup/connect_unix and sendmsg_unix: only %d workspace and egress.unix paths; abstract, relative and '..' paths refused", len(cfg.UnixPaths)),
		"judged on the path as passed, before the kernel resolves it: a symlink inside an allowed directory to a host socket is not seen"}
	if len(c.env.AbsentProbeSockets) > 0 {
		unixNote = append(unixNote, "left connectable because no such socket exists on this host (the C library probes them on every lookup): "+
			strings.Join(c.env.AbsentProbeSockets, ", ")+"; re-checked at every policy reload")
	}
	if c.env.UnixSockets != nil {
		c.add(sb, "egress: unix sockets", policy.ActionBlock, layer{mech: MechNone,
			notes: []string{"this kernel cannot refuse unix socket connects (" + c.env.UnixSockets.Error() + ")"}})
	} else {
		c.add(sb, "egress: unix sockets", policy.ActionBlock, layer{mech: MechCgroupBPF, notes: unixNote})
	}
}

func orDNS(d policy.DNSDefault) string {
	if d == "" {
		return "deny"
	}
	return string(d)
}

// checkRanges refuses rule sets the egress maps cannot hold: a prefix
// carries the port ranges of every rule whose network contains it, at most
// egress.MaxRangesPerPrefix (checked here so a bad policy is refused at
// compile time, naming the network).
func checkRanges(rules []egress.Rule) error {
	norm := func(p netip.Prefix) netip.Prefix {
		p = p.Masked()
		if p.Addr().Is4() {
			return netip.PrefixFrom(netip.AddrFrom16(p.Addr().As16()), 96+p.Bits())
		}
		return p
	}
	for _, n := range rules {
		np := norm(n.Prefix)
		count := 0
		for _, m := range rules {
			mp := norm(m.Prefix)
			if mp.Bits() <= np.Bits() && mp.Contains(np.Addr()) {
				count++
			}
		}
		if count > egress.MaxRangesPerPrefix {
			return fmt.Errorf("egress: %d port ranges apply to %s (rules on it and on the networks containing it), at most %d fit",
				count, n.Prefix, egress.MaxRangesPerPrefix)
		}
	}
	return nil
}

// --- watcher exec ---

// launch derives the seccomp filter and the Landlock ruleset of commands
// started with `watcher exec` in sb.
func (c *compiler) launch(sb *policy.Sandbox) {
	ops := &sb.Operations
	sec := launch.DefaultSeccomp()
	record := sb.Mode == policy.ModeRecord
	if !blocking(orAllow(ops.IOUring)) || record {
		sec.AllowIOUring = true
	}
	if !blocking(orAllow(ops.RawSockets)) || record {
		sec.DeniedSocketFamilies = slices.DeleteFunc(sec.DeniedSocketFamilies, func(f int) bool { return f == unix.AF_PACKET })
	}
	var notes []string
	res := launch.Restrictions{Seccomp: sec}
	if record {
		// Seccomp and Landlock refuse; they cannot record. Only the
		// fixed list stays (see launch.SeccompPolicy).
		res.Seccomp.AllowedNamespaces = launch.AllNamespaces
		res.Seccomp.DeniedNetlinkProtocols = nil
		notes = append(notes, "mode: record: no Landlock, seccomp reduced to its fixed list (which still refuses)")
	} else {
		files, why := c.landlock(sb)
		res.Files = files
		notes = append(notes, why)
		var conflicts []string
		for _, op := range operations {
			if op.seccomp != "" && !blocking(orAllow(op.action(ops))) {
				conflicts = append(conflicts, op.name)
			}
		}
		if len(conflicts) > 0 {
			notes = append(notes, "seccomp refuses "+strings.Join(conflicts, ", ")+" although the policy does not block it (fixed list)")
		}
	}
	notes = append([]string{fmt.Sprintf("seccomp: fixed list, namespaces, io_uring %s, AF_PACKET %s",
		allowedWord(res.Seccomp.AllowIOUring), allowedWord(!slices.Contains(res.Seccomp.DeniedSocketFamilies, unix.AF_PACKET)))}, notes...)
	c.plan.Launch[sb.Name] = res
	c.add(sb, "watcher exec", policy.ActionBlock, layer{mech: MechLaunch, notes: append(notes, "only commands started by watcher exec")})
}

func allowedWord(b bool) string {
	if b {
		return "allowed"
	}
	return "refused"
}

// landlock derives the Landlock ruleset of watcher exec from the file and
// exec rules, when they confine writes (a blocking write rule on "/"): the
// file model users expect, reads and execs wherever no rule blocks them,
// writes only where the rules allow. The launched child plans the grants
// from the directory tree as it is at launch (launch.PlanFiles: Landlock
// grants the complement of the blocked paths); terminals and the usual
// character devices the policy lets be written also get ioctl.
func (c *compiler) landlock(sb *policy.Sandbox) (*launch.FileRules, string) {
	rules := c.fileRules(sb)
	var prefixes []policy.FileRule
	for _, r := range rules {
		if r.Match == policy.MatchPrefix {
			prefixes = append(prefixes, r)
		}
	}
	if r, ok := policy.DecideFile(prefixes, "/", true); !ok || !blocking(r.Action) || r.Path != "/" {
		return nil, "no Landlock: the policy does not confine writes to listed paths"
	}
	def := launch.DefaultFileRules()
	fr := &launch.FileRules{Derive: true, Files: rules, Exec: sb.ExecRules(), ExecDefault: orAllow(sb.Exec.Default),
		IgnoreMissing: true, ScopeIPC: def.ScopeIPC}
	allows := func(p string, write bool) bool {
		r, ok := policy.DecideFile(rules, p, write)
		return !ok || !blocking(r.Action)
	}
	for _, p := range def.Devices {
		if allows(p, false) && allows(p, true) {
			fr.Devices = append(fr.Devices, p)
		}
	}
	return fr, fmt.Sprintf("landlock: derived at launch from %d file and %d exec rules (reads and execs wherever no rule blocks them, writes where allowed; %d devices with ioctl)",
		len(fr.Files), len(fr.Exec), len(fr.Devices))
}

// finish assembles the host-wide backstop rules and the trace config.
func (c *compiler) finish() {
	b := &c.plan.Backstop
	for _, name := range sortedKeys(c.syscalls) {
		r := c.syscalls[name]
		if r.Action == enforce.ActionAllow {
			continue
		}
		b.Syscalls = append(b.Syscalls, backstop.SyscallRule{Name: name, Rule: r})
	}
	if c.ioUringOpenKill {
		b.IOUringOpen = backstop.Rule{Action: enforce.ActionKill, ID: c.rules.ID("io-uring")}
	}
	if c.cloneFilesKill {
		b.CloneFiles = backstop.Rule{Action: enforce.ActionKill, ID: c.rules.ID("clone-files")}
	}
	// Where another sandbox's rule made a host-wide rule stricter, say so.
	for _, u := range c.globalUses {
		var got uint32
		var what string
		if u.category != nil {
			got, what = u.category.Action, "category"
		} else {
			got, what = c.syscalls[u.syscall].Action, u.syscall
		}
		if got > u.action {
			l := &c.plan.Layers[u.layer]
			note := fmt.Sprintf("host-wide backstop rule (%s) is stricter because of another sandbox: %s", what, actionWord(got))
			if !strings.Contains(l.Note, note) {
				l.Note = strings.TrimPrefix(l.Note+"; "+note, "; ")
			}
		}
	}
	// Module attempts: the raw syscall tracepoint records them when no
	// backstop syscall rule sees them (this machine returns ENOSYS before
	// any LSM hook runs, so the attempt is all there is to record).
	if c.moduleSeen {
		c.plan.Trace.ModuleAlerts = true
		c.plan.Trace.ModuleRuleID = c.moduleRuleID
		if _, ok := c.syscalls["init_module"]; !ok {
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

func actionWord(a uint32) string {
	switch a {
	case enforce.ActionRecord:
		return "record"
	case enforce.ActionBlock:
		return "block"
	case enforce.ActionKill:
		return "kill"
	}
	return "allow"
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
