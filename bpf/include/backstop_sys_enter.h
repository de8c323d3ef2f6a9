/* sys_enter: syscall rules and argument-checked categories, killed before the call runs. */
#pragma once

/* judge_file (backstop_file.h) judges the file an mmap or mprotect maps
 * executable, by the exec rules. */
static __always_inline bool judge_file(struct file *file, __u32 ops, long nr, __u64 root,
				       struct sandbox *sb);

/* Bit n of word n / 64: syscall n is in the set (the bitmaps below and
 * sys_exit's). */
#define NR_BIT(n, w) (((n) >> 6) == (w) ? 1ULL << ((n) & 63) : 0)
_Static_assert(MAX_SYSCALLS == 512, "the syscall bitmaps cover 512 numbers");

/* sys_enter_judged is everything but the fast path below: a subprogram
 * of its own, so the program every syscall of the host enters stays a few
 * instructions with a small frame. */
static __noinline int sys_enter_judged(struct pt_regs *regs, long id, bool compat)
{
	if (vc_mount_syscall(id, compat))
		vc_mount_enter(); /* any task: see the verdict cache */
	if (compat)
		return compat_enter(regs, id);
	if ((unsigned long)id >= MAX_SYSCALLS)
		return 0;
	__u32 nr = id;
	struct syscall_rule *r = bpf_map_lookup_elem(&bs_syscall_rules, &nr);
	if (!r || (!r->action && !r->category))
		return 0;
	__u32 cat = r->category, rule_id = 0, target = 0;
	if (cat == CAT_MMAP_EXEC) {
		/* The category's action only turns the check on: the exec
		 * rule matching the file decides. */
		struct file *file = id == NR_mmap ? mmap_exec_file(regs) : mprotect_exec_file(regs);
		__u64 root = 0;
		struct sandbox *sb = file ? current_sandbox(&root) : NULL;
		if (sb && sandbox_rule(sb->id, SBR_CATEGORY | CAT_MMAP_EXEC, &rule_id))
			judge_file(file, OP_EXEC, id, root, sb);
		return 0;
	}

	if (cat) {
		cat = entry_category(cat, id, regs);
		if (!cat)
			return 0;
	}
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb)
		return 0;

	__u32 action;
	if (cat == CAT_OTHER_TASK && signal_nr(id) && target_is_agent(id, regs, &target)) {
		/* The agent: the first process outside the subtree, with a rule
		 * of its own (kill_agent). */
		cat = CAT_SIGNAL_AGENT;
		action = sandbox_category(sb->id, cat, &rule_id);
		if (!action)
			return 0;
	} else if (cat >= CAT_OTHER_TASK) {
		action = sandbox_category(sb->id, cat, &rule_id);
		if (!action)
			return 0;
		switch (cat) {
		case CAT_OTHER_TASK:
			target = subtree_target(id, regs, root);
			if (!target)
				return 0;
			break;
		case CAT_CLOCK_ADJUST:
			if (!clock_adjust_sets(id, regs))
				return 0;
			break;
		case CAT_NAMESPACES:
			if (id == NR_setns && !setns_foreign(BPF_CORE_READ(regs, di), root))
				return 0;
			break;
		case CAT_OTHER_IPC:
			if (!ipc_foreign(id, regs, root, &target))
				return 0;
			break;
		}
		int cap = host_cap_of(id, cat);
		if (cap >= 0 && !host_cap_held(cap))
			return 0;
	} else if (cat) {
		action = sandbox_rule(sb->id, SBR_CATEGORY | cat, &rule_id);
		if (!action)
			return 0;
		if (!category_matches(cat, id, regs, &target))
			return 0;
	} else {
		action = sandbox_rule(sb->id, SBR_SYSCALL | nr, &rule_id);
		int cap = host_cap_of(id, CAT_NONE);
		if (action && cap >= 0 && !host_cap_held(cap))
			return 0;
	}
	if (action == ACTION_ALLOW)
		return 0;
	__u32 verdict = backstop_verdict(sb, action);

	struct scratch *s = get_scratch();
	if (!s)
		return 0;
	/* Filled in place in the task's pending slot; when there is none
	 * (allocation failed), in the scratch, sent at once below. */
	struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
	struct syscall_event *e = bpf_task_storage_get(&bs_pending, task, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	bool stashed = e != NULL;
	if (!e)
		e = &s->ev;
	__builtin_memset(e, 0, sizeof(*e));
	fill_hdr(&e->hdr, EV_KILL_SYSCALL, verdict, rule_id, root, sb);
	e->nr = id;
	e->ret = RET_UNKNOWN;
	e->args[0] = BPF_CORE_READ(regs, di);
	e->args[1] = BPF_CORE_READ(regs, si);
	e->args[2] = BPF_CORE_READ(regs, dx);
	e->args[3] = BPF_CORE_READ(regs, r10);
	e->args[4] = BPF_CORE_READ(regs, r8);
	e->args[5] = BPF_CORE_READ(regs, r9);
	e->category = cat;
	e->mnt_ns = current_mnt_ns();
	e->target_pid = target ? target : target_of(id, e->args);
	fill_strings(s, e, id, e->args);

	if (verdict == VERDICT_KILLED)
		bpf_send_signal(SIGKILL);

	if (!stashed)
		emit_syscall(e); /* cannot stash: send now, without the return value */
	return 0;
}

/* Native syscalls sys_enter_judged looks at whatever the rules: the mount
 * family (the verdict cache's busy count). By number, as sys_exit's. */
#define ENTER_ALWAYS(X, w) (X(155, w) | X(161, w) | X(165, w) | X(166, w) | X(428, w) | X(429, w) | \
	X(432, w) | X(442, w) | X(467, w))
static const volatile __u64 bs_enter_always[MAX_SYSCALLS / 64] = {
	ENTER_ALWAYS(NR_BIT, 0), ENTER_ALWAYS(NR_BIT, 1), ENTER_ALWAYS(NR_BIT, 2), ENTER_ALWAYS(NR_BIT, 3),
	ENTER_ALWAYS(NR_BIT, 4), ENTER_ALWAYS(NR_BIT, 5), ENTER_ALWAYS(NR_BIT, 6), ENTER_ALWAYS(NR_BIT, 7),
};

/* The fast path: a native syscall no sandbox has a rule or category for,
 * outside the mount family, leaves after one array lookup (inlined by the
 * verifier), whoever makes it; the sandbox is never looked up. */
SEC("tp_btf/sys_enter")
int BPF_PROG(backstop_sys_enter, struct pt_regs *regs, long id)
{
	bool compat = in_compat_syscall(id);
	if (!compat && (unsigned long)id < MAX_SYSCALLS && !((bs_enter_always[id >> 6] >> (id & 63)) & 1)) {
		__u32 nr = id;
		struct syscall_rule *r = bpf_map_lookup_elem(&bs_syscall_rules, &nr);
		if (r && !r->action && !r->category)
			return 0;
	}
	return sys_enter_judged(regs, id, compat);
}
