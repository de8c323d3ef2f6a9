/* LSM decisions: op rules, the hook's result and task events. */
#pragma once

/* op_decision returns the sandbox's rule for op, else the default
 * (sandbox 0), else dflt. */
static __always_inline struct decision op_decision(__u32 sid, __u32 op, __u32 dflt)
{
	struct op_key k = { .sandbox_id = sid, .op = op };
	struct decision *d = bpf_map_lookup_elem(&lsm_op_rules, &k);
	if (!d) {
		k.sandbox_id = 0;
		d = bpf_map_lookup_elem(&lsm_op_rules, &k);
	}
	if (d)
		return *d;
	struct decision def = { .action = dflt };
	return def;
}

/* conclude turns an action into the hook's return value: -EPERM for a
 * denial, SIGKILL plus -EPERM for a kill. */
static __always_inline int conclude(__u32 verdict)
{
	if (verdict == VERDICT_KILLED) {
		bpf_send_signal(SIGKILL);
		return -EPERM;
	}
	return verdict == VERDICT_DENIED ? -EPERM : 0;
}

/* quiet: the kernel's NOAUDIT probes (/proc/PID/stat asking whether it may
 * show wchan, ptrace_has_cap on a non-dumpable target, ns_capable_noaudit)
 * are the kernel asking on the process's behalf and degrade gracefully when
 * refused: decided like any check but not reported, the kernel's own audit
 * convention (otherwise every `ps` in a sandbox is a refusal of the agent). */
static __always_inline int judge_task(__u32 mech, __u32 op, __u32 kind, struct decision d, struct sandbox *sb,
				      __u64 root, struct task_struct *target, __u32 mode, __s32 cap, bool quiet)
{
	if (d.action == ACTION_ALLOW)
		return 0;
	__u32 verdict = effective_verdict(sb, d.action);
	struct task_event *e = quiet ? NULL : reserve_event(sizeof(*e), true);
	if (e) {
		fill_hdr(&e->hdr, kind + mech, verdict, d.rule_id, root, sb);
		e->op = op;
		e->mode = mode;
		e->cap = cap;
		if (target) {
			e->target_pid = BPF_CORE_READ(target, tgid);
			BPF_CORE_READ_STR_INTO(&e->target_comm, target, comm);
		} else {
			e->target_pid = 0;
			e->target_comm[0] = 0;
		}
		submit_event(e, true);
	}
	return conclude(verdict);
}

/* An operation judged by its op rule: the caller's sandbox and the rule's
 * decision, shared by the mount and kernel-code hooks. */
struct op_ctx {
	__u64 root;
	struct sandbox *sb;
	struct decision d;
};

/* op_begin fills c for op; false when there is nothing to judge (the task
 * is in no sandbox, or the rule allows). */
static __always_inline bool op_begin(struct op_ctx *c, __u32 op)
{
	c->root = 0;
	c->sb = current_sandbox(&c->root);
	if (!c->sb)
		return false;
	c->d = op_decision(c->sb->id, op, ACTION_ALLOW);
	return c->d.action != ACTION_ALLOW;
}

/* judge_op is the whole body of hooks judged by one op rule. */
static __always_inline int judge_op(__u32 mech, __u32 op, __u32 kind, __u32 mode)
{
	struct op_ctx c;
	if (!op_begin(&c, op))
		return 0;
	return judge_task(mech, op, kind, c.d, c.sb, c.root, NULL, mode, -1, false);
}
