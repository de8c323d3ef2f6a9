/* Sandbox membership across fork and cgroup moves. */
#pragma once

/* cgroup_sandbox returns the sandbox root id cg is in (0 for none), outermost
 * first like lookup_sandbox_cg. */
static __always_inline __u64 cgroup_sandbox(struct cgroup *cg, struct sandbox **out)
{
	int level = BPF_CORE_READ(cg, level);
	for (int i = 1; i <= MAX_CGROUP_DEPTH; i++) {
		if (i > level)
			break;
		struct cgroup *anc = NULL;
		bpf_probe_read_kernel(&anc, sizeof(anc), &cg->ancestors[i]);
		if (!anc)
			break;
		__u64 id = BPF_CORE_READ(anc, kn, id);
		struct sandbox *s = bpf_map_lookup_elem(&sandboxes, &id);
		if (s) {
			*out = s;
			return id;
		}
	}
	return 0;
}

/* kill_task kills another task's process (bpf_send_signal_task, Linux >=
 * 6.13); false where this kernel lacks it. */
static __always_inline bool kill_task(struct task_struct *t)
{
	if (!bpf_ksym_exists(bpf_send_signal_task))
		return false;
	bpf_send_signal_task(t, SIGKILL, PIDTYPE_TGID, 0);
	return true;
}

/* fork_judged applies the fork-time checks on the new task, from kernel
 * state (the clone arguments in user memory may have changed since any
 * check at sys_enter): a child of a sandboxed parent that starts outside
 * the sandbox (clone3 CLONE_INTO_CGROUP), or a new process sharing the
 * parent's file table. Both are killed before they run, the parent too. */
static __always_inline void fork_judged(struct task_struct *parent, struct task_struct *child,
					 __u64 child_sb)
{
	__u64 root = 0;
	struct sandbox *psb = current_sandbox(&root);
	if (!psb)
		return;
	__u32 cat = CAT_NONE;
	if (child_sb != root)
		cat = CAT_CGROUP_ESCAPE;
	else if (BPF_CORE_READ(child, files) == BPF_CORE_READ(parent, files) &&
		 BPF_CORE_READ(child, tgid) != BPF_CORE_READ(parent, tgid))
		cat = CAT_CLONE_FILES;
	if (!cat)
		return;
	__u32 rule_id = 0;
	__u32 action = sandbox_category(psb->id, cat, &rule_id);
	if (cat == CAT_CGROUP_ESCAPE && !action)
		action = ACTION_RECORD; /* leaving the sandbox is always an alert */
	if (!action)
		return;
	__u32 verdict = backstop_verdict(psb, action);
	if (verdict == VERDICT_KILLED) {
		if (!kill_task(child) && cat == CAT_CGROUP_ESCAPE)
			verdict = VERDICT_RECORDED;
		bpf_send_signal(SIGKILL);
	}
	if (cat == CAT_CGROUP_ESCAPE) {
		struct cgroup_event *e = reserve_event(sizeof(*e), true);
		if (!e)
			return;
		fill_hdr(&e->hdr, EV_KILL_CGROUP, verdict, rule_id, root, psb);
		struct cgroup *cg = BPF_CORE_READ(child, cgroups, dfl_cgrp);
		e->dst_cgroup = BPF_CORE_READ(cg, kn, id);
		e->from_sandbox = root;
		e->moved_pid = BPF_CORE_READ(child, tgid);
		e->mover_pid = bpf_get_current_pid_tgid() >> 32;
		BPF_CORE_READ_STR_INTO(&e->moved_comm, child, comm);
		__builtin_memcpy(e->dst_path, "(created there: clone3 CLONE_INTO_CGROUP)", 42);
		submit_event(e, true);
		return;
	}
	struct syscall_event *e = reserve_event(SYSCALL_EVENT_COMPACT, true);
	if (!e)
		return;
	__builtin_memset(e, 0, SYSCALL_EVENT_COMPACT);
	fill_hdr(&e->hdr, EV_KILL_SYSCALL, verdict, rule_id, root, psb);
	e->nr = NR_clone3;
	e->ret = BPF_CORE_READ(child, tgid);
	e->category = cat;
	e->target_pid = BPF_CORE_READ(child, tgid);
	e->mnt_ns = current_mnt_ns();
	submit_event(e, true);
}

/* A child inherits its parent's sandbox; with CLONE_INTO_CGROUP it may start
 * elsewhere, so the child's own cgroup decides. */
SEC("tp_btf/sched_process_fork")
int BPF_PROG(backstop_fork, struct task_struct *parent, struct task_struct *child)
{
	struct cgroup *cg = BPF_CORE_READ(child, cgroups, dfl_cgrp);
	struct sandbox *sb = NULL;
	__u64 sbcg = cgroup_sandbox(cg, &sb);
	fork_judged(parent, child, sbcg);
	if (!sbcg || !sb)
		return 0;
	struct task_sandbox *ts = bpf_task_storage_get(&bs_tasks, child, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (ts) {
		ts->sandbox_cg = sbcg;
		ts->sandbox_id = sb->id;
	}
	return 0;
}

SEC("tp_btf/cgroup_attach_task")
int BPF_PROG(backstop_cgroup_attach, struct cgroup *dst, const char *path, struct task_struct *task,
	     bool threadgroup)
{
	/* Only the default (v2) hierarchy defines sandboxes. */
	if (BPF_CORE_READ(dst, root, hierarchy_id) != 0)
		return 0;
	struct sandbox *dsb = NULL;
	__u64 dst_sb = cgroup_sandbox(dst, &dsb);
	struct task_sandbox *ts = bpf_task_storage_get(&bs_tasks, task, 0,
						       dst_sb ? BPF_LOCAL_STORAGE_GET_F_CREATE : 0);
	if (!ts)
		return 0;
	__u64 from = ts->sandbox_cg;
	__u32 from_id = ts->sandbox_id;
	ts->sandbox_cg = dst_sb;
	ts->sandbox_id = dsb ? dsb->id : 0;
	if (!from || from == dst_sb)
		return 0;
	/* The agent itself moves tasks when it tears a sandbox down. */
	if (is_agent(bpf_get_current_pid_tgid() >> 32))
		return 0;

	struct sandbox from_sb = { .id = from_id };
	struct sandbox *fsb = bpf_map_lookup_elem(&sandboxes, &from);
	if (fsb)
		from_sb = *fsb;
	__u32 rule_id = 0;
	__u32 action = sandbox_category(from_sb.id, CAT_CGROUP_ESCAPE, &rule_id);
	if (!action)
		action = ACTION_RECORD; /* a move out is always an alert */
	__u32 verdict = backstop_verdict(&from_sb, action);
	if (verdict == VERDICT_KILLED) {
		__u32 task_tgid = BPF_CORE_READ(task, tgid);
		if (task_tgid == (bpf_get_current_pid_tgid() >> 32))
			bpf_send_signal(SIGKILL);
		else if (bpf_ksym_exists(bpf_send_signal_task))
			bpf_send_signal_task(task, SIGKILL, PIDTYPE_TGID, 0);
		else
			verdict = VERDICT_RECORDED; /* cannot signal another task here */
	}
	struct cgroup_event *e = reserve_event(sizeof(*e), true);
	if (!e)
		return 0;
	fill_hdr(&e->hdr, EV_KILL_CGROUP, verdict, rule_id, from, &from_sb);
	e->dst_cgroup = BPF_CORE_READ(dst, kn, id);
	e->from_sandbox = from;
	e->moved_pid = BPF_CORE_READ(task, tgid);
	e->mover_pid = bpf_get_current_pid_tgid() >> 32;
	BPF_CORE_READ_STR_INTO(&e->moved_comm, task, comm);
	if (path)
		bpf_probe_read_kernel_str(e->dst_path, sizeof(e->dst_path), path);
	else
		e->dst_path[0] = 0;
	submit_event(e, true);
	return 0;
}
