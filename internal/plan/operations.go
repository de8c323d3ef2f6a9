package plan

// The operations section: ptrace, mount, module, bpf, kill-agent, the fixed
// operations, io_uring, 32-bit syscalls, the kernel interfaces,
// cgroup_write, capabilities, devices and raw sockets.

import (
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/watcherhq/watcher/internal/control"
	"github.com/watcherhq/watcher/internal/dangerous"
	"github.com/watcherhq/watcher/internal/enforce/rules"
	"github.com/watcherhq/watcher/internal/enforce/rules/backstoprules"
	"github.com/watcherhq/watcher/internal/enforce/rules/cgrouprules"
	"github.com/watcherhq/watcher/internal/enforce/rules/lsmrules"
	"github.com/watcherhq/watcher/internal/policy"
)

// opPart is one LSM op of a policy operation, with what stands in for it
// in the backstop when its hook is missing.
type opPart struct {
	op       lsmrules.Op
	hook     string
	syscalls []string
	category func(*backstoprules.SandboxRules) *backstoprules.Rule
	// bsNote says what the backstop's category does for the part (""
	// for the agent's signals).
	bsNote string
}

// otherTask and ttyInject select the backstop categories of the own-subtree
// operations.
var (
	otherTask  = func(r *backstoprules.SandboxRules) *backstoprules.Rule { return &r.OtherTask }
	otherIPC   = func(r *backstoprules.SandboxRules) *backstoprules.Rule { return &r.OtherIPC }
	notifyMark = func(r *backstoprules.SandboxRules) *backstoprules.Rule { return &r.NotifyMark }
	ttyInject  = func(r *backstoprules.SandboxRules) *backstoprules.Rule { return &r.TTYInject }
)

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
			{op: lsmrules.OpPtraceAttach, hook: "ptrace_access_check", syscalls: []string{"ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd"}},
			{op: lsmrules.OpPtraceTraceme, hook: "ptrace_traceme", syscalls: []string{"ptrace"}},
		},
		seccomp: "ptrace, process_vm_readv/writev, pidfd_getfd",
	},
	{
		name:   "mount",
		action: func(o *policy.Operations) policy.Action { return o.Mount },
		parts: []opPart{
			{op: lsmrules.OpMount, hook: "sb_mount", syscalls: []string{"mount"}},
			{op: lsmrules.OpUmount, hook: "sb_umount", syscalls: []string{"umount2"}},
			// open_tree clones a tree that only move_mount can attach.
			{op: lsmrules.OpMoveMount, hook: "move_mount", syscalls: []string{"move_mount", "open_tree", "open_tree_attr"}},
			{op: lsmrules.OpPivotRoot, hook: "sb_pivotroot", syscalls: []string{"pivot_root"}},
			{op: lsmrules.OpChroot, hook: "path_chroot", syscalls: []string{"chroot"}},
			// fsopen itself has no hook; every fsconfig parameter does.
			{op: lsmrules.OpFSConfig, hook: "fs_context_parse_param", syscalls: []string{"fsopen", "fsconfig", "fsmount", "fspick"}},
			// mount_setattr has no hook: it asks for CAP_SYS_ADMIN
			// (may_mount) before anything, judged in that syscall.
			{op: lsmrules.OpMount, hook: dangerous.HookCapable, syscalls: []string{"mount_setattr"}},
		},
		seccomp: "the mount family, pivot_root, chroot",
	},
	{
		name:   "module",
		action: func(o *policy.Operations) policy.Action { return o.Module },
		parts: []opPart{
			{op: lsmrules.OpKernelReadFile, hook: "kernel_read_file", syscalls: []string{"finit_module", "kexec_file_load"}},
			{op: lsmrules.OpKernelLoadData, hook: "kernel_load_data", syscalls: []string{"init_module", "kexec_load"}},
			// delete_module has no hook: it asks for CAP_SYS_MODULE first.
			{op: lsmrules.OpKernelLoadData, hook: dangerous.HookCapable, syscalls: []string{"delete_module"}},
		},
		seccomp: "module loading and removal, kexec",
	},
	{
		name:    "bpf",
		action:  func(o *policy.Operations) policy.Action { return o.BPF },
		parts:   []opPart{{op: lsmrules.OpBPF, hook: "bpf", syscalls: []string{"bpf"}}},
		seccomp: "bpf",
	},
	{
		name:   "kill-agent",
		action: func(o *policy.Operations) policy.Action { return o.KillAgent },
		parts: []opPart{
			{op: lsmrules.OpAgentSignal, hook: "task_kill", category: func(r *backstoprules.SandboxRules) *backstoprules.Rule { return &r.SignalAgent }},
			// Without the hook, ptrace of the agent is covered by the
			// ptrace rule's backstop (every ptrace is killed).
			{op: lsmrules.OpAgentPtrace, hook: "ptrace_access_check"},
			// SIGIO/SIGURG through F_SETOWN: no kill syscall at all.
			{op: lsmrules.OpAgentSignal, hook: "file_send_sigiotask"},
		},
	},
	{
		// Own subtree only: the target of each hook is judged against the
		// sandbox's cgroup subtree (issue 25). The kill backstop's parts
		// and watcher exec's namespaces are named per part.
		name:   "other-processes",
		action: func(o *policy.Operations) policy.Action { return o.OtherProcesses },
		parts: []opPart{
			{op: lsmrules.OpOtherTask, hook: "task_kill", category: otherTask, bsNote: "judged at entry on the target's cgroup (the call itself completes before the process dies): " +
				"kill, tkill, tgkill, rt_sigqueueinfo, rt_tgsigqueueinfo, pidfd_send_signal (pidfd or /proc/PID descriptor), pidfd_open of a process outside the subtree, kill(-1); " +
				"process-group signals judged after the fact, per member the kernel signals (signal_generate; signal 0 to a group unjudged)"},
			{op: lsmrules.OpOtherTask, hook: "file_send_sigiotask", category: otherTask, bsNote: "SIGIO/SIGURG owners outside the subtree and every process-group owner, at entry: fcntl F_SETOWN (a register), " +
				"F_SETOWN_EX, ioctl FIOSETOWN, SIOCSPGRP (owner read from user memory: another thread may change it after the check); F_SETSIG and owners set before the sandbox not judged"},
			// setrlimit and prlimit with new limits (task_prlimit has
			// only credentials on 6.1).
			{op: lsmrules.OpOtherTask, hook: "task_setrlimit", category: otherTask, bsNote: "prlimit64 setting a limit of a process outside"},
			{op: lsmrules.OpOtherTask, hook: "task_setnice", category: otherTask, bsNote: "setpriority of a process outside, every PRIO_PGRP and PRIO_USER call"},
			{op: lsmrules.OpOtherTask, hook: "task_setscheduler", category: otherTask, bsNote: "sched_setscheduler, sched_setparam, sched_setattr, sched_setaffinity of a task outside"},
			{op: lsmrules.OpOtherTask, hook: "task_setioprio", category: otherTask, bsNote: "ioprio_set of a process outside, every IOPRIO_WHO_PGRP and IOPRIO_WHO_USER call"},
			{op: lsmrules.OpOtherTask, hook: "task_movememory", category: otherTask, bsNote: "migrate_pages, move_pages, process_madvise of a process outside"},
			{op: lsmrules.OpOtherTask, hook: "ptrace_access_check", category: otherTask, bsNote: "kcmp naming a process outside; " +
				"opens of /proc/PID/{environ,auxv,maps,smaps,numa_maps,pagemap,stack,syscall,io,personality,timers,fd,fdinfo,map_files} of a process outside, " +
				"killed when the open returns (nothing read; cmdline, stat and status stay readable); " +
				"process_vm_readv/writev and pidfd_getfd are the ptrace rule's"},
		},
	},
	{
		name:   "other-ipc",
		action: func(o *policy.Operations) policy.Action { return o.OtherIPC },
		// System V objects by their creator (the alloc hooks), POSIX
		// message queues at open (mq_open creates through inode_create).
		parts: []opPart{
			{op: lsmrules.OpOtherIPC, hook: "ipc_permission", category: otherIPC, bsNote: "System V objects and message queues the sandbox did not create " +
				"(creations recorded by the IPC tracking tracepoints, attached while needed): shmat, semop, semtimedop, msgsnd, msgrcv, " +
				"and IPC_RMID, IPC_SET, SETVAL, SETALL, SHM_LOCK/UNLOCK, at entry (the call completes first: a shmat maps the segment, " +
				"the process dies before it returns; objects made before tracking count as another's); reads (IPC_STAT, *_INFO) allowed; " +
				"POSIX message queues likewise at mq_timedsend, mq_timedreceive and mq_notify (the open is not judged); 32-bit calls killed at entry (ia32_syscalls)"},
			{op: lsmrules.OpOtherIPC, hook: "shm_shmctl"},
			{op: lsmrules.OpOtherIPC, hook: "sem_semctl"},
			{op: lsmrules.OpOtherIPC, hook: "msg_queue_msgctl"},
			{op: lsmrules.OpOtherIPC, hook: "shm_alloc_security"},
			{op: lsmrules.OpOtherIPC, hook: "sem_alloc_security"},
			{op: lsmrules.OpOtherIPC, hook: "msg_queue_alloc_security"},
			{op: lsmrules.OpOtherIPC, hook: "inode_create"},
			{op: lsmrules.OpOtherIPC, hook: "file_open"},
		},
	},
	{
		name:   "terminals",
		action: func(o *policy.Operations) policy.Action { return o.Terminals },
		parts: []opPart{
			{op: lsmrules.OpTTYInject, hook: "file_ioctl", category: ttyInject,
				bsNote: "ioctl TIOCSTI and TIOCLINUX on any terminal, at entry (the call itself completes before the process dies)"},
			// A pty controlled from outside: the operator's shell, a login.
			{op: lsmrules.OpTTYInject, hook: "file_open", category: ttyInject,
				bsNote: "opens of /dev/pts/N whose session leader is outside the subtree, killed when the open returns (the descriptor exists " +
					"for that moment); its own controlling terminal and ptys no session controls pass"},
		},
	},
	{
		name:   "notify-marks",
		action: func(o *policy.Operations) policy.Action { return o.NotifyMarks },
		parts: []opPart{{op: lsmrules.OpNotifyMark, hook: "path_notify", category: notifyMark,
			bsNote: "inotify_add_watch: a mark outside the writable places killed when the call returns (the mark dies with the process's " +
				"inotify descriptor unless it was passed on first); fanotify: fanotify_init needs CAP_SYS_ADMIN, killed at entry where held"}},
	},
}

// notifyPaths allows inotify and fanotify marks in the sandbox's
// workspaces (a file watcher there is everyday work) where the notify
// marks rule refuses them elsewhere.
func notifyPaths(sb *policy.Sandbox, lr *lsmrules.Rules) {
	if d, ok := lr.Ops[lsmrules.OpNotifyMark]; !ok || d.Action == rules.ActionAllow {
		return
	}
	for _, w := range sb.Workspace {
		w = strings.TrimSuffix(w, "/")
		if w == "" {
			lr.NotifyPaths = append(lr.NotifyPaths, "/")
			continue
		}
		lr.NotifyPaths = append(lr.NotifyPaths, w, w+"/")
	}
}

// OperationOfSyscall names the policy operation (its YAML key) whose rule
// covers the syscall, "" when none does (the launcher's fixed list).
func OperationOfSyscall(name string) string {
	if strings.HasPrefix(name, "io_uring_") {
		return "io_uring"
	}
	for _, op := range operations {
		for _, part := range op.parts {
			if slices.Contains(part.syscalls, name) {
				return strings.ReplaceAll(op.name, "-", "_")
			}
		}
		if slices.Contains(op.always, name) {
			return strings.ReplaceAll(op.name, "-", "_")
		}
	}
	return ""
}

// OperationOfSubtreeEvent names the policy operation (its YAML key) of
// an own-subtree LSM event (other processes, IPC objects, terminals,
// notify marks) from the event's message, which opens with the LSM op's
// name ("other_process: signal 9 to pid 42 ..."); "" for other events.
func OperationOfSubtreeEvent(message string) string {
	name, _, ok := strings.Cut(message, ":")
	if !ok {
		return ""
	}
	for _, op := range operations {
		for _, part := range op.parts {
			switch part.op {
			case lsmrules.OpOtherTask, lsmrules.OpOtherIPC, lsmrules.OpTTYInject, lsmrules.OpNotifyMark:
				if part.op.String() == name {
					return strings.ReplaceAll(op.name, "-", "_")
				}
			}
		}
	}
	return ""
}

// fixedOperations are refused by watcher exec's seccomp filter whatever
// the policy says; where their LSM hook runs, enforce-mode sandboxes get
// the same refusal on the kernel-hook path (record mode records). Without
// the hook they are left to the backstop's list of dangerous operations.
var fixedOperations = []struct {
	name, hook, seccomp string
	op                  lsmrules.Op
}{
	{"perf-event-open", "perf_event_open", "perf_event_open", lsmrules.OpPerfEvent},
	{"keyrings", "key_alloc", "add_key, keyctl, request_key", lsmrules.OpKeyring},
	{"user-namespaces", "userns_create", "unshare/clone of namespaces", lsmrules.OpUserNS},
	{"userfaultfd", "inode_init_security_anon", "userfaultfd", lsmrules.OpUserfaultfd},
}

func (c *compiler) fixed(sb *policy.Sandbox, lr *lsmrules.Rules) {
	if c.hook("task_alloc") {
		// A second process sharing the file table: judged on the flags the
		// kernel copied, so flipping clone3's flags after a check is moot.
		lr.Ops[lsmrules.OpCloneFiles] = lsmrules.Decision{Action: rules.ActionBlock, RuleID: c.rules.ID("clone-files")}
		c.add(sb, "clone-files", policy.ActionBlock, layer{mech: MechLSM, notes: []string{
			"lsm task_alloc: clone/clone3 with CLONE_FILES and without CLONE_THREAD (threads stay allowed)"}})
	}
	for _, f := range fixedOperations {
		if !c.hook(f.hook) {
			continue
		}
		id := c.rules.ID(f.name)
		lr.Ops[f.op] = lsmrules.Decision{Action: rules.ActionBlock, RuleID: id}
		c.add(sb, f.name, policy.ActionBlock, layer{mech: MechLSM, notes: []string{
			"lsm " + f.hook, "watcher exec: seccomp refuses " + f.seccomp}})
	}
}

func (c *compiler) operations(sb *policy.Sandbox, lr *lsmrules.Rules) {
	for _, op := range operations {
		a := orAllow(op.action(&sb.Operations))
		id := c.rules.ID(op.name)
		var hooks []string
		for _, part := range op.parts {
			hooks = append(hooks, part.hook)
		}
		// Part of the operation may only reach the backstop: the weakest
		// part decides what the rule is worth.
		l := c.choose(MechKill, hooks...)
		var lsmOps, killed []string
		for _, part := range op.parts {
			if c.hook(part.hook) {
				lr.Ops[part.op] = lsmrules.Decision{Action: kernelAction(a), RuleID: id}
				lsmOps = append(lsmOps, part.op.String())
				continue
			}
			for _, s := range part.syscalls {
				c.bsSyscall(s, backstopAction(a), id)
				killed = append(killed, s)
			}
			if part.category != nil {
				c.bsCategory(part.category, backstopAction(a), id)
				note := part.bsNote
				if note == "" {
					note = "kill-family syscalls aimed at the agent (the signal is still delivered)"
				}
				killed = append(killed, note)
			}
		}
		var always []string
		for _, s := range op.always {
			c.bsSyscall(s, backstopAction(a), id)
			always = append(always, s)
		}
		switch {
		case l.mech == MechLSM:
			l.notes = append(l.notes, "lsm: "+strings.Join(dedupe(lsmOps), ", "))
		case len(lsmOps) == 0 && len(killed) == 0 && len(op.always) == 0:
			// No hook loads and the backstop has no part for it.
			// Only an LSM hook judges it (other_ipc, notify_marks): missing
			// only under require_lsm, like capability rules; watcher exec's
			// namespaces and dropped capabilities cover part of it.
			l.mech = MechNone
			l.lsmOnly = true
			l.notes = append(l.notes, "nothing on this host enforces it for runtime-placed processes (lsm hooks missing: "+
				strings.Join(dedupe(l.lsmMissing), ", ")+"); watcher exec: own IPC namespace, no CAP_SYS_ADMIN for fanotify, "+
				"the backstop kills fanotify_init where CAP_SYS_ADMIN is held and refused")
		case len(lsmOps) == 0:
			l.notes = append(l.notes, "backstop: "+strings.Join(dedupe(killed), ", "))
		default:
			l.notes = append(l.notes, "lsm: "+strings.Join(dedupe(lsmOps), ", "), "backstop: "+strings.Join(dedupe(killed), ", "))
		}
		for _, part := range op.parts {
			if part.hook == dangerous.HookCapable && c.hook(part.hook) {
				l.notes = append(l.notes, "lsm capable in "+strings.Join(part.syscalls, ", ")+": the capability it checks first")
			}
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
		c.add(sb, op.name, a, l)
		if op.name == "module" && a != policy.ActionAllow {
			c.moduleSeen = true
			c.moduleRuleID = id
		}
	}

	// io_uring: no LSM hook judges the syscalls. Where fentry programs
	// run on their entry points they kill at entry, per syscall; else the
	// backstop kills io_uring_setup (and, for rings from elsewhere,
	// io_uring_enter/register) on sys_enter, per sandbox; seccomp too for
	// watcher exec.
	a := orAllow(sb.Operations.IOUring)
	id := c.rules.ID("io-uring")
	var uringHooks []string
	for _, o := range dangerous.ByGroup(dangerous.GroupIOUring) {
		uringHooks = append(uringHooks, o.Hooks()...)
	}
	atEntry := c.hooks(uringHooks...)
	var l layer
	if blocking(a) && atEntry {
		lr.Ops[lsmrules.OpIOUring] = lsmrules.Decision{Action: kernelAction(a), RuleID: id}
		entries := "x86_64 and i386 entry points"
		if c.env.IA32 != nil {
			entries = "x86_64 entry points"
		}
		l = layer{mech: MechEntry, notes: []string{"fentry: io_uring_enter, io_uring_register killed at entry, io_uring_setup on return when it made a ring (" + entries + "; nothing else pays for it)"}}
	} else {
		c.bsCategory(func(r *backstoprules.SandboxRules) *backstoprules.Rule { return &r.IOUring }, backstopAction(a), id)
		l = layer{mech: MechKill, notes: []string{"backstop: io_uring_setup, io_uring_enter, io_uring_register (no LSM hook; killed at entry)"}}
		if blocking(a) {
			// A ring's descriptor can come from outside (SCM_RIGHTS).
			for _, name := range []string{"io_uring_enter", "io_uring_register"} {
				c.bsSyscall(name, backstopAction(a), id)
			}
		}
	}
	if blocking(a) && c.hook("inode_init_security_anon") {
		// Kernels that give a ring a secure anonymous inode (6.1 does)
		// refuse it before the fact; others leave it to the kill.
		lr.Ops[lsmrules.OpIOUring] = lsmrules.Decision{Action: kernelAction(a), RuleID: id}
		l.notes = append(l.notes, "also refused at io_uring_setup by lsm inode_init_security_anon where the kernel gives rings a secure anonymous inode")
	}
	if blocking(a) {
		l.notes = append(l.notes, "watcher exec: seccomp refuses io_uring_*")
	} else {
		l.mech = MechNone
		l.notes = []string{"io_uring allowed"}
		if a == policy.ActionRecord {
			// The sandbox's own category records io_uring_setup.
			l.mech = MechKill
			l.notes = []string{"backstop: io_uring_setup recorded, rings allowed"}
		}
		if !c.hook("file_open") && c.hasBlockingFiles(sb) {
			c.bsCategory(func(r *backstoprules.SandboxRules) *backstoprules.Rule { return &r.IOUringOpen }, rules.ActionKill, id)
			l.notes = append(l.notes, "open requests submitted to a ring are killed: the backstop cannot judge their paths")
		}
	}
	c.add(sb, "io_uring", a, l)

	// 32-bit system calls: decided per sandbox at its end (ia32Line),
	// once every rule of it that may rely on the backstop's x86_64
	// numbers is known. The line keeps its place here.
	c.ia32Layer = c.add(sb, "ia32_syscalls", policy.ActionKill, layer{mech: MechKill})

	// The kernel group of the one dangerous list: refused whatever the
	// policy says.
	id = c.rules.ID("kernel-interfaces")
	var kernelOps, lsmKernelOps, entryOps []string
	for _, o := range dangerous.ByGroup(dangerous.GroupKernel) {
		switch {
		case !c.hooks(o.Hooks()...):
			c.bsSyscall(o.Name, rules.ActionKill, id)
			kernelOps = append(kernelOps, o.Name)
			continue
		case o.AtEntry():
			entryOps = append(entryOps, o.Name)
		default:
			lsmKernelOps = append(lsmKernelOps, o.Name+" ("+o.Hook+")")
		}
		switch o.Hook {
		case dangerous.HookKeyPermission:
			lr.Ops[lsmrules.OpKeyring] = lsmrules.Decision{Action: rules.ActionBlock, RuleID: c.rules.ID("keyrings")}
		case dangerous.HookCapable, "":
			lr.Ops[lsmrules.OpKernelIface] = lsmrules.Decision{Action: rules.ActionBlock, RuleID: id}
		}
	}
	var kl layer
	switch {
	case len(kernelOps) > 0:
		kl = layer{mech: MechKill, notes: []string{"backstop: killed at entry (the call itself may complete before the process dies): " + strings.Join(kernelOps, ", ")}}
	case len(entryOps) > 0:
		kl = layer{mech: MechEntry}
	default:
		kl = layer{mech: MechLSM}
	}
	if len(entryOps) > 0 {
		kl.notes = append(kl.notes, "fentry: killed at entry, per syscall (the call itself may complete before the process dies): "+strings.Join(entryOps, ", "))
	}
	if len(lsmKernelOps) > 0 {
		kl.notes = append(kl.notes, "lsm refuses "+strings.Join(lsmKernelOps, ", ")+" before any effect (capable and key_permission: while the task is in that syscall)")
	}
	kl.notes = append(kl.notes, "watcher exec: seccomp refuses them")
	ka := policy.ActionKill
	if kl.mech == MechLSM {
		ka = policy.ActionBlock
	}
	c.add(sb, "kernel_interfaces", ka, kl)

	// cgroup_write: an LSM filesystem rule on cgroupfs, or the backstop's
	// category; a move out of the sandbox is always at least recorded.
	a = orAllow(sb.Operations.CgroupWrite)
	id = c.rules.ID("cgroup-write")
	if l = c.choose(MechKill, "file_open"); l.mech == MechLSM {
		for _, magic := range []uint64{unix.CGROUP2_SUPER_MAGIC, unix.CGROUP_SUPER_MAGIC} {
			lr.FS = append(lr.FS, lsmrules.FSRule{Magic: magic, Access: lsmrules.AccessWrite, Decision: lsmrules.Decision{Action: kernelAction(a), RuleID: id}})
		}
		l.notes = []string{"lsm file_open: write-opens on cgroupfs"}
		if c.hook("task_alloc") {
			// clone3(CLONE_INTO_CGROUP) moves a child without a write:
			// refused with the rule, recorded at least.
			lr.Ops[lsmrules.OpCloneIntoCgroup] = lsmrules.Decision{Action: max(kernelAction(a), rules.ActionRecord), RuleID: id}
			l.notes = append(l.notes, "lsm task_alloc: clone3(CLONE_INTO_CGROUP)")
		}
		c.bsCategory(func(r *backstoprules.SandboxRules) *backstoprules.Rule { return &r.CgroupEscape }, max(rules.ActionRecord, min(backstopAction(a), rules.ActionRecord)), id)
		l.notes = append(l.notes, "moves out of the sandbox recorded by the backstop")
	} else {
		c.bsCategory(func(r *backstoprules.SandboxRules) *backstoprules.Rule { return &r.CgroupWrite }, backstopAction(a), id)
		c.bsCategory(func(r *backstoprules.SandboxRules) *backstoprules.Rule { return &r.CgroupEscape }, max(rules.ActionRecord, backstopAction(a)), id)
		l.notes = []string{"backstop: write-opens on cgroupfs, and moves out of the sandbox"}
	}
	if a == policy.ActionAllow {
		l = layer{mech: MechNone, notes: []string{"moves out of the sandbox still recorded"}}
	}
	c.add(sb, "cgroup_write", a, l)
}

func (c *compiler) capabilities(sb *policy.Sandbox, lr *lsmrules.Rules) {
	caps := &sb.Operations.Capabilities
	capLayer := c.choose(MechNone, "capable")
	capLayer.lsmOnly = true
	ok := capLayer.mech == MechLSM
	if ok {
		capLayer.notes = []string{"lsm capable"}
	} else {
		capLayer.notes = []string{"no capable hook without BPF LSM; the operations the capability unlocks have rules of their own"}
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
			lr.Caps = append(lr.Caps, lsmrules.CapRule{Cap: n, Decision: lsmrules.Decision{Action: kernelAction(r.Action), RuleID: c.rules.ID(name)}})
		}
		l := capLayer
		if n == unix.CAP_SYS_RAWIO {
			l = c.lowMappings(sb, l, r.Action, c.rules.ID(name))
		}
		c.add(sb, "capability "+policy.CapabilityName(n), r.Action, l)
	}
	def := orAllow(caps.Default)
	if def == policy.ActionAllow {
		return
	}
	id := c.rules.ID("cap-default")
	if ok {
		for n := 0; policy.CapabilityName(n) != ""; n++ {
			if !explicit[n] {
				lr.Caps = append(lr.Caps, lsmrules.CapRule{Cap: n, Decision: lsmrules.Decision{Action: kernelAction(def), RuleID: id}})
			}
		}
	}
	if !explicit[unix.CAP_SYS_RAWIO] {
		capLayer = c.lowMappings(sb, capLayer, def, id)
	}
	c.add(sb, "capabilities (default)", def, capLayer)
}

// lowMappings adds to the layer of the rule deciding CAP_SYS_RAWIO (action
// a, rule id) what judges mappings below vm.mmap_min_addr, which the
// kernel checks for that capability without the capable hook
// (cap_mmap_addr): the mmap_addr hook where it loads, else the backstop's
// low-mapping category of this sandbox, which kills or records after the
// fact, and watcher exec's seccomp filter for a blocking rule (launch,
// DenyLowMappings).
func (c *compiler) lowMappings(sb *policy.Sandbox, l layer, a policy.Action, id uint32) layer {
	l.notes = slices.Clone(l.notes)
	a = orAllow(a)
	hooked := l.mech == MechLSM && c.hook("mmap_addr")
	sel := func(r *backstoprules.SandboxRules) *backstoprules.Rule { return &r.LowMapping }
	switch {
	case hooked:
		if a != policy.ActionAllow {
			l.notes = append(l.notes, "lsm mmap_addr: mappings below vm.mmap_min_addr (page 0), which the kernel checks without the capable hook")
		}
		return l
	case a == policy.ActionAllow:
		return l
	}
	c.bsCategory(sel, backstopAction(a), id)
	probed, i386Call := "exec and i386 results judged on the VMAs of the first MiB", " or an i386 mapping call"
	if c.env.IA32 != nil {
		probed, i386Call = "exec results judged on the VMAs of the first MiB", ""
	}
	if blocking(a) && sb.Mode != policy.ModeRecord {
		if len(l.lsmMissing) > 0 && !c.hook("mmap_addr") {
			l.lsmMissing = append(slices.Clone(l.lsmMissing), "mmap_addr")
		}
		l.notes = append(l.notes, "mappings below vm.mmap_min_addr (page 0): no mmap_addr hook here; backstop: killed when mmap, mremap, shmat"+i386Call+" returns with one, not refused "+
			"(the mapping exists until the kill lands: another thread of the process could use it in that window), and at exec when the ELF loader mapped one "+
			"(a low ELF, MMAP_PAGE_ZERO: the new program never runs; "+probed+"); watcher exec: seccomp refuses them before the fact")
	} else {
		l.notes = append(l.notes, "mappings below vm.mmap_min_addr (page 0): no mmap_addr hook here; recorded by the backstop when mmap, mremap, shmat"+strings.Replace(i386Call, " or", ",", 1)+" or an exec leaves one ("+probed+")")
	}
	return l
}

// Terminal devices no sandbox owns, under operations.terminals: virtual
// consoles and serial ports (char major 4), /dev/console (5:1), console
// screen memory /dev/vcs* (major 7). /dev/tty (5:0) is the caller's own
// terminal, /dev/ptmx (5:2) makes a new pty: both stay open.
var consoleDevices = []struct{ major, minor int }{{4, cgrouprules.Any}, {5, 1}, {7, cgrouprules.Any}}

// terminalDevices refuses the console devices by number, before the
// open, on every kernel (cgroup/dev), and in file_open where it runs.
func (c *compiler) terminalDevices(sb *policy.Sandbox, sid uint32, lr *lsmrules.Rules) {
	a := orAllow(sb.Operations.Terminals)
	if a == policy.ActionAllow {
		return
	}
	id := c.rules.ID("terminals")
	var l layer
	if c.cgroupOK {
		for _, d := range consoleDevices {
			c.plan.Devices = append(c.plan.Devices, cgrouprules.DeviceRule{Sandbox: sid, Type: cgrouprules.CharDevice,
				Major: d.major, Minor: d.minor, Action: kernelAction(a), RuleID: id})
		}
		l = layer{mech: MechCgroupBPF, notes: []string{"cgroup/dev: virtual consoles and serial ports (char 4:*), /dev/console (5:1), " +
			"console memory /dev/vcs* (7:*), at open and mknod; /dev/tty and /dev/ptmx stay open, ptys are judged by their session (terminals line)"}}
	}
	if c.hook("file_open") {
		for _, d := range consoleDevices {
			minor := uint32(d.minor)
			if d.minor == cgrouprules.Any {
				minor = lsmrules.AnyDevice
			}
			lr.Devices = append(lr.Devices, lsmrules.DeviceRule{Major: uint32(d.major), Minor: minor, Decision: lsmrules.Decision{Action: kernelAction(a), RuleID: id}})
		}
		if l.mech == "" {
			l = layer{mech: MechLSM, notes: []string{"lsm file_open by device number: virtual consoles, serial ports, /dev/console, /dev/vcs*"}}
		} else {
			l.notes = append(l.notes, "also lsm file_open")
		}
	}
	if l.mech == "" {
		l = layer{mech: MechNone, notes: []string{"cgroup BPF unavailable: " + c.env.CgroupBPF.Error()}}
	}
	c.add(sb, "terminals: consoles", a, l)
}

// Device numbers covered by operations.devices besides every block
// device: /dev/mem, /dev/kmem, /dev/port, /dev/kmsg (char major 1).
var memDevices = []uint32{1, 2, 4, 11}

func (c *compiler) devices(sb *policy.Sandbox, sid uint32, lr *lsmrules.Rules) {
	a := orAllow(sb.Operations.Devices)
	id := c.rules.ID("devices")
	if a == policy.ActionAllow {
		c.add(sb, "devices", a, layer{mech: MechNone})
		return
	}
	var l layer
	if c.cgroupOK {
		c.plan.Devices = append(c.plan.Devices, cgrouprules.DeviceRule{Sandbox: sid, Type: cgrouprules.BlockDevice,
			Major: cgrouprules.Any, Minor: cgrouprules.Any, Action: kernelAction(a), RuleID: id})
		for _, minor := range memDevices {
			c.plan.Devices = append(c.plan.Devices, cgrouprules.DeviceRule{Sandbox: sid, Type: cgrouprules.CharDevice,
				Major: 1, Minor: int(minor), Action: kernelAction(a), RuleID: id})
		}
		l = layer{mech: MechCgroupBPF, notes: []string{"cgroup/dev: block devices, /dev/mem, /dev/kmem, /dev/port, /dev/kmsg (open and mknod)"}}
	}
	if c.hook("file_open") {
		lr.Devices = append(lr.Devices, lsmrules.DeviceRule{Block: true, Major: lsmrules.AnyDevice, Minor: lsmrules.AnyDevice,
			Decision: lsmrules.Decision{Action: kernelAction(a), RuleID: id}})
		for _, minor := range memDevices {
			lr.Devices = append(lr.Devices, lsmrules.DeviceRule{Major: 1, Minor: minor, Decision: lsmrules.Decision{Action: kernelAction(a), RuleID: id}})
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

func (c *compiler) rawSockets(sb *policy.Sandbox, sid uint32, lr *lsmrules.Rules) {
	a := orAllow(sb.Operations.RawSockets)
	if a == policy.ActionAllow {
		c.add(sb, "raw_sockets", a, layer{mech: MechNone})
		return
	}
	id := c.rules.ID("raw-sockets")
	note := "AF_PACKET: cgroup/sock_create does not run for packet sockets; the backstop kills socket(AF_PACKET) at entry (no LSM socket_create program here), seccomp refuses it under watcher exec"
	if !c.cgroupOK {
		c.add(sb, "raw_sockets", a, layer{mech: MechNone, notes: []string{"cgroup BPF unavailable: " + c.env.CgroupBPF.Error(), note}})
		return
	}
	c.plan.Sockets = append(c.plan.Sockets, cgrouprules.SocketRule{Sandbox: sid, Family: cgrouprules.Any,
		Type: unix.SOCK_RAW, Protocol: cgrouprules.Any, Action: kernelAction(a), RuleID: id})
	if c.hook("socket_create") {
		// Every family passes socket_create, from every entry.
		lr.Sockets = append(lr.Sockets, lsmrules.SocketRule{Family: unix.AF_PACKET, Type: lsmrules.AnySocket, Protocol: lsmrules.AnySocket,
			Decision: lsmrules.Decision{Action: kernelAction(a), RuleID: c.rules.ID("packet-sockets")}})
		note = "AF_PACKET refused by lsm socket_create (cgroup/sock_create does not run for packet sockets); seccomp refuses it under watcher exec"
	} else {
		c.bsCategory(func(r *backstoprules.SandboxRules) *backstoprules.Rule { return &r.PacketSocket }, backstopAction(a), c.rules.ID("packet-sockets"))
	}
	c.add(sb, "raw_sockets", a, layer{mech: MechCgroupBPF, notes: []string{"cgroup/sock_create: SOCK_RAW on IPv4 and IPv6", note}})
}

// ia32Line decides 32-bit system calls for sandbox sb (the backstop's
// compat category, per sandbox) and rewrites its layer line. They are
// killed at entry when its policy refuses them, or when one of its rules
// rests on a backstop check keyed on x86_64 syscall numbers (an int 0x80
// open would pass the backstop's open checks unjudged). Otherwise they run
// and are judged like 64-bit calls: LSM and cgroup hooks see kernel state
// whatever the entry, and the backstop's syscall rules are also keyed by
// i386 number (internal/dangerous). Another sandbox's rules never decide
// them.
func (c *compiler) ia32Line(sb *policy.Sandbox, sid uint32) {
	b := c.bs
	if c.env.IA32 != nil {
		// Nothing reaches the i386 table here: no compat rule, no entry by
		// i386 number, and the line claims no layer (nor a missing one).
		b.NoI386 = true
		c.plan.Layers[c.ia32Layer] = control.Layer{Rule: sb.Name + ": ia32_syscalls", Mechanism: MechUnavailable,
			Note: c.env.IA32.Error() + "; nothing to enforce (policy: " + string(orAllow(sb.Operations.IA32Syscalls)) + ")"}
		return
	}
	var why []string
	if slices.ContainsFunc(c.plan.Backstop.Paths, func(p backstoprules.PathRule) bool { return p.SandboxID == sid || p.SandboxID == 0 }) {
		why = append(why, "file rules judged at open by the backstop")
	}
	for _, cat := range []struct {
		r    backstoprules.Rule
		what string
	}{{b.CgroupWrite, "cgroup_write opens"}, {b.ProcMem, "/proc/PID/mem opens"}, {b.CloneFiles, "CLONE_FILES clones"},
		{b.IOUringOpen, "io_uring opens"}, {b.SignalAgent, "kill-family syscalls to the agent"},
		{b.PacketSocket, "socket(AF_PACKET)"}, {b.UnixPeer, "unix connects"},
		{b.OtherTask, "calls reaching other processes"}, {b.TTYInject, "terminal injection"},
		{b.NetConfig, "network configuration ioctls"}, {b.ClockAdjust, "clock adjustments"},
		{b.Namespaces, "namespace changes"}, {b.Syslog, "syslog actions"}, {b.Quota, "quotactl"},
		{b.OtherIPC, "System V and message-queue use"}, {b.NotifyMark, "inotify marks"}} {
		if cat.r.Action != rules.ActionAllow {
			why = append(why, cat.what+" checked by the backstop")
		}
	}
	if b.MmapExec.Action != rules.ActionAllow && !c.hook("mmap_file") {
		why = append(why, "mmap PROT_EXEC checked by the backstop")
	}
	a := orAllow(sb.Operations.IA32Syscalls)
	var l layer
	switch {
	case blocking(a):
		l = layer{mech: MechKill, notes: []string{"backstop: every 32-bit syscall (int 0x80) killed at entry (the call itself may complete before the process dies)"}}
	case len(why) > 0:
		a = policy.ActionKill
		l = layer{mech: MechKill, notes: []string{"the policy allows them, but they are killed at entry (the call itself may complete before the process dies): " +
			strings.Join(why, "; ") + ", keyed on x86_64 syscall numbers"}}
	default:
		l = layer{mech: MechNone, notes: []string{"judged like 64-bit calls: lsm and cgroup hooks see kernel state whatever the entry; the backstop's syscall rules by i386 number too"}}
	}
	if l.mech == MechKill {
		b.Compat = backstoprules.Rule{Action: rules.ActionKill, ID: c.rules.ID("ia32-syscalls")}
	}
	l.notes = append(l.notes, "watcher exec: the seccomp arch guard refuses them whatever the policy says")
	n := len(c.plan.Layers)
	c.add(sb, "ia32_syscalls", a, l)
	c.plan.Layers[c.ia32Layer] = c.plan.Layers[n]
	c.plan.Layers = c.plan.Layers[:n]
}
