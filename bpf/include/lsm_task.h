/* Other tasks: ptrace, signals, limits and scheduling, capabilities, low mappings, bpf(2). */
#pragma once

/* Sub-operations of LSM_OP_OTHER_TASK judged outside the signal and
 * ptrace hooks: task_event.mode is OTHER_* | a detail. */
#define OTHER_SETRLIMIT 0x01000000u  /* | resource */
#define OTHER_SETNICE 0x02000000u    /* | (nice & 0xff) */
#define OTHER_SCHED 0x03000000u      /* sched_setscheduler, setattr, setaffinity */
#define OTHER_IOPRIO 0x04000000u     /* | (ioprio & 0xffff) */
#define OTHER_MOVEMEM 0x05000000u    /* migrate_pages, move_pages */

/* judge_other_task judges an operation of the current task on target by
 * the other-processes rule when target is outside the caller's sandbox
 * subtree. */
static __always_inline int judge_other_task(__u32 mech, __u32 kind, struct task_struct *target, __u32 mode)
{
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb || !target || st_task_below(target, root))
		return 0;
	struct decision d = op_decision(sb->id, LSM_OP_OTHER_TASK, ACTION_ALLOW);
	return judge_task(mech, LSM_OP_OTHER_TASK, kind, d, sb, root, target, mode, -1, false);
}

/* judge_ptrace judges ptrace access to target by op's rule, or by the
 * agent's (blocked unless a rule says otherwise) when target is the agent.
 * A target outside the sandbox's subtree is judged by the other-processes
 * rule too (subtree: false for PTRACE_TRACEME, which offers the caller to
 * its parent), the stricter of the two deciding. */
static __always_inline int judge_ptrace(__u32 mech, __u32 op, struct task_struct *target, __u32 mode, bool quiet,
					bool subtree)
{
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb)
		return 0;
	struct decision d;
	if (is_agent(BPF_CORE_READ(target, tgid))) {
		op = LSM_OP_AGENT_PTRACE;
		d = op_decision(sb->id, op, ACTION_BLOCK);
	} else {
		d = op_decision(sb->id, op, ACTION_ALLOW);
		if (subtree && !st_task_below(target, root)) {
			struct decision o = op_decision(sb->id, LSM_OP_OTHER_TASK, ACTION_ALLOW);
			if (o.action > d.action) {
				op = LSM_OP_OTHER_TASK;
				d = o;
			}
		}
	}
	return judge_task(mech, op, EV_PTRACE, d, sb, root, target, mode, -1, quiet);
}

static __always_inline int decide_ptrace_access_check(__u32 mech, struct task_struct *child, unsigned int mode, int ret)
{
	if (ret)
		return ret;
	__u32 op = (mode & PTRACE_MODE_ATTACH) ? LSM_OP_PTRACE_ATTACH : LSM_OP_PTRACE_READ;
	return judge_ptrace(mech, op, child, mode, mode & PTRACE_MODE_NOAUDIT, true);
}
WATCHER_HOOK(ptrace_access_check, security_ptrace_access_check,
	     decide_ptrace_access_check(mech, child, mode, ret),
	     struct task_struct *child, unsigned int mode, int ret)

static __always_inline int decide_ptrace_traceme(__u32 mech, struct task_struct *parent, int ret)
{
	if (ret)
		return ret;
	return judge_ptrace(mech, LSM_OP_PTRACE_TRACEME, parent, 0, false, false);
}
WATCHER_HOOK(ptrace_traceme, security_ptrace_traceme, decide_ptrace_traceme(mech, parent, ret),
	     struct task_struct *parent, int ret)

/* task_kill is called once per target task, for kill, tgkill, tkill,
 * pidfd_send_signal, rt_sigqueueinfo, process groups and kill(-1) alike.
 * The agent is the first target outside the subtree, with its own rule;
 * every other target outside is judged by the other-processes rule. A
 * non-NULL cred is a USB async I/O completion signalling on behalf of the
 * file's opener, not the current task: not the sandbox's doing. */
static __always_inline int decide_task_kill(__u32 mech, struct task_struct *p, int sig, const struct cred *cred, int ret)
{
	if (ret)
		return ret;
	if (!is_agent(BPF_CORE_READ(p, tgid))) {
		if (cred)
			return 0;
		return judge_other_task(mech, EV_SIGNAL, p, (__u32)sig);
	}
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb)
		return 0;
	struct decision d = op_decision(sb->id, LSM_OP_AGENT_SIGNAL, ACTION_BLOCK);
	return judge_task(mech, LSM_OP_AGENT_SIGNAL, EV_SIGNAL, d, sb, root, p, (__u32)sig, -1, false);
}
WATCHER_HOOK(task_kill, security_task_kill, decide_task_kill(mech, p, sig, cred, ret),
	     struct task_struct *p, struct kernel_siginfo *info, int sig, const struct cred *cred, int ret)

/* Limits, priority, scheduling, I/O priority and page migration of another
 * process. setrlimit and prlimit(2) with new limits both pass
 * task_setrlimit with the target (task_prlimit has only credentials on
 * 6.1); a process's limits are readable in /proc/PID/limits anyway, so
 * reading them is not judged. setpriority(PRIO_PGRP, PRIO_USER) asks once
 * per task. sched_setaffinity and sched_setattr ask task_setscheduler. */
static __always_inline int decide_setrlimit(__u32 mech, struct task_struct *p, unsigned int resource, int ret)
{
	return ret ? ret : judge_other_task(mech, EV_OPERATION, p, OTHER_SETRLIMIT | (resource & 0xff));
}
WATCHER_HOOK(task_setrlimit, security_task_setrlimit, decide_setrlimit(mech, p, resource, ret),
	     struct task_struct *p, unsigned int resource, struct rlimit *new_rlim, int ret)

static __always_inline int decide_setnice(__u32 mech, struct task_struct *p, int nice, int ret)
{
	return ret ? ret : judge_other_task(mech, EV_OPERATION, p, OTHER_SETNICE | ((__u32)nice & 0xff));
}
WATCHER_HOOK(task_setnice, security_task_setnice, decide_setnice(mech, p, nice, ret),
	     struct task_struct *p, int nice, int ret)

static __always_inline int decide_setioprio(__u32 mech, struct task_struct *p, int ioprio, int ret)
{
	return ret ? ret : judge_other_task(mech, EV_OPERATION, p, OTHER_IOPRIO | ((__u32)ioprio & 0xffff));
}
WATCHER_HOOK(task_setioprio, security_task_setioprio, decide_setioprio(mech, p, ioprio, ret),
	     struct task_struct *p, int ioprio, int ret)

static __always_inline int decide_task_only(__u32 mech, struct task_struct *p, __u32 what, int ret)
{
	return ret ? ret : judge_other_task(mech, EV_OPERATION, p, what);
}
WATCHER_HOOK(task_setscheduler, security_task_setscheduler, decide_task_only(mech, p, OTHER_SCHED, ret),
	     struct task_struct *p, int ret)
WATCHER_HOOK(task_movememory, security_task_movememory, decide_task_only(mech, p, OTHER_MOVEMEM, ret),
	     struct task_struct *p, int ret)

/* Credentials the kernel substituted for the task's own (override_creds:
 * overlayfs acting as its mounter on the layers below a container root,
 * access(2) checking with the real ids) ask for the substitute's
 * capabilities, not the sandbox's: overlayfs checks the caller's own
 * credentials on the overlay inode before it switches. Judging them
 * refuses or records what the sandbox never asked for (every file of a
 * container root on overlayfs). The one substitution a sandboxed task can
 * choose, an io_uring personality, carries its own earlier credentials:
 * judged whenever the sandbox may use io_uring at all. */
static __always_inline bool substituted_cred(const struct cred *cred, __u32 sid)
{
	struct task_struct *cur = (struct task_struct *)bpf_get_current_task_btf();
	const struct cred *subjective = BPF_CORE_READ(cur, cred);
	if (cred != subjective || subjective == BPF_CORE_READ(cur, real_cred))
		return false;
	return op_decision(sid, LSM_OP_IO_URING, ACTION_ALLOW).action == ACTION_BLOCK;
}

/* cap_decision is the capability rule of cap (0..63) in sandbox sid, or of
 * the defaults (id 0) when the sandbox has no capability table. */
static __always_inline struct decision cap_decision(__u32 sid, int cap)
{
	struct decision d = { .action = ACTION_ALLOW };
	struct cap_rules *r = bpf_map_lookup_elem(&lsm_cap_rules, &sid);
	if (!r) {
		sid = 0;
		r = bpf_map_lookup_elem(&lsm_cap_rules, &sid);
		if (!r)
			return d;
	}
	__u64 bit = 1ULL << (cap & 63);
	if (r->block & bit)
		d.action = ACTION_BLOCK;
	else if (r->record & bit)
		d.action = ACTION_RECORD;
	else
		return d;
	d.rule_id = r->rule_id[cap & 63];
	return d;
}

static __always_inline int decide_capable(__u32 mech, const struct cred *cred, int cap, unsigned int opts, int ret)
{
	if (ret)
		return ret;
	if (cap < 0 || cap >= 64)
		return 0;
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb)
		return 0;
	if (substituted_cred(cred, sb->id))
		return 0;
	/* A dangerous syscall asking for the capability it checks before any
	 * effect (iopl, acct, reboot, swapon, delete_module, mount_setattr,
	 * open_by_handle_at): refused by the rule of its group. */
	__u32 nr = current_syscall();
	__u32 op = syscall_check(nr, (__u32)cap);
	if (op) {
		struct decision od = op_decision(sb->id, op, ACTION_ALLOW);
		int r = judge_task(mech, op, EV_OPERATION, od, sb, root, NULL, SYSCALL_TAG | nr, cap,
				   opts & CAP_OPT_NOAUDIT);
		if (r)
			return r;
	}
	struct decision d = cap_decision(sb->id, cap);
	if (d.action == ACTION_ALLOW)
		return 0;
	return judge_task(mech, 0, EV_CAPABILITY, d, sb, root, NULL, opts, cap, opts & CAP_OPT_NOAUDIT);
}
WATCHER_HOOK(capable, security_capable, decide_capable(mech, cred, cap, opts, ret),
	     const struct cred *cred, struct user_namespace *ns, int cap, unsigned int opts, int ret)

/* Mappings below vm.mmap_min_addr (page 0: the kernel NULL-dereference
 * exploit's landing pad) need CAP_SYS_RAWIO, but the kernel's
 * cap_mmap_addr asks cap_capable() directly, never security_capable(): the
 * capable hook above does not see it. security_mmap_addr is where mmap and
 * mmap2 with MAP_FIXED(_NOREPLACE), mremap(MREMAP_FIXED) and shmat at an
 * address, from either syscall table, arrive with the address the kernel
 * chose: judged here as a use of CAP_SYS_RAWIO by the capability rules.
 * The agent writes the sysctl's value into lsm_mmap_min_addr when it loads
 * and at every policy apply (0, or never written: nothing to judge, as the
 * kernel then checks nothing). Every mmap of every task on the host passes
 * here: an address at or above the minimum returns after one inlined
 * array lookup. */
#define CAP_SYS_RAWIO 17
#define MMAP_ADDR_MODE 0x40000000u /* task_event.mode of a capability event from mmap_addr: tag | page number */
#define MMAP_ADDR_PAGE_MAX 0x3fffffffu

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64); /* vm.mmap_min_addr (the kernel's dac_mmap_min_addr) */
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lsm_mmap_min_addr SEC(".maps");

static __always_inline int decide_mmap_addr(__u32 mech, unsigned long addr, int ret)
{
	if (ret)
		return ret;
	__u32 zero = 0;
	__u64 *min = bpf_map_lookup_elem(&lsm_mmap_min_addr, &zero);
	if (!min || addr >= *min)
		return 0;
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb)
		return 0;
	struct decision d = cap_decision(sb->id, CAP_SYS_RAWIO);
	if (d.action == ACTION_ALLOW)
		return 0;
	__u64 page = addr >> 12;
	if (page > MMAP_ADDR_PAGE_MAX)
		page = MMAP_ADDR_PAGE_MAX;
	return judge_task(mech, 0, EV_CAPABILITY, d, sb, root, NULL, MMAP_ADDR_MODE | (__u32)page, CAP_SYS_RAWIO, false);
}
WATCHER_HOOK(mmap_addr, security_mmap_addr, decide_mmap_addr(mech, addr, ret), unsigned long addr, int ret)

/* bpf(2): 6.1 passes (cmd, attr, size), 6.18 adds a `kernel` flag, so the
 * previous program's return value sits at another index: this hook does
 * not read it (watcher is the only BPF program judging bpf(2)). */
WATCHER_HOOK(bpf, security_bpf, judge_op(mech, LSM_OP_BPF, EV_BPF, (__u32)cmd), int cmd)
