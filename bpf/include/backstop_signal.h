/* Signals to the agent and to other processes, by any route. */
#pragma once

/* signal_generate sees every signal the kernel queues, whatever sent it:
 * kill, tgkill, pidfd_send_signal, process groups, kill(-1), SIGIO/SIGURG
 * of a file owner, the SIGSTOP of a ptrace attach. A tracepoint cannot
 * refuse it: the sender is killed, a stop is undone with SIGCONT, and the
 * count per signal lets the agent ignore a termination request it did not
 * get from its operator.
 */
#define SIGNAL_GROUP_EXIT_ 0x4

/* dying: the caller's process is exiting already (killed at sys_enter):
 * one event per refusal. */
static __always_inline bool dying(void)
{
	struct task_struct *cur = (struct task_struct *)bpf_get_current_task_btf();
	return BPF_CORE_READ(cur, signal, flags) & SIGNAL_GROUP_EXIT_;
}

/* send_after is the event of a refusal seen after the fact (a signal
 * queued, a capability granted): the caller is killed, the call done. */
static __always_inline void send_after(struct sandbox *sb, __u64 root, __u32 verdict, __u32 rule_id, __u32 cat,
				       __u64 arg0, __u32 target, long ret)
{
	struct syscall_event *e = reserve_event(SYSCALL_EVENT_COMPACT, true);
	if (!e)
		return;
	__builtin_memset(e, 0, SYSCALL_EVENT_COMPACT);
	fill_hdr(&e->hdr, EV_KILL_SYSCALL, verdict, rule_id, root, sb);
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs((struct task_struct *)bpf_get_current_task_btf());
	e->nr = regs ? BPF_CORE_READ(regs, orig_ax) : -1;
	e->ret = ret;
	e->args[0] = arg0;
	e->category = cat;
	e->target_pid = target;
	e->mnt_ns = current_mnt_ns();
	submit_event(e, true);
}

/* other_signal: a signal a sandboxed process sent (kill, sigqueue,
 * tgkill, pidfd, process groups, kill(-1)) to a process outside its
 * subtree, judged on the task the kernel picked. The signal is queued:
 * the sender is killed after the fact (calls aimed at one process were
 * killed at sys_enter already, also after their one call). Signals the
 * kernel sends (SEND_SIG_NOINFO/PRIV, positive codes: SIGCHLD, a file
 * owner's SIGIO, faults) are not the sender's doing. */
static __always_inline void other_signal(int sig, struct kernel_siginfo *info, struct task_struct *task, int result)
{
	if (sig <= 0 || sig > 64 || (unsigned long)info <= 1 || !any_category(CAT_OTHER_TASK))
		return;
	int code = 1;
	bpf_probe_read_kernel(&code, sizeof(code), (void *)info + bpf_core_field_offset(struct kernel_siginfo, si_code));
	if (code != 0 && code != -1 && code != -6) /* SI_USER, SI_QUEUE, SI_TKILL */
		return;
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb || st_task_in(task, root) || dying())
		return;
	__u32 rule_id = 0;
	__u32 action = sandbox_category(sb->id, CAT_OTHER_TASK, &rule_id);
	if (!action)
		return;
	__u32 verdict = backstop_verdict(sb, action);
	if (verdict == VERDICT_KILLED)
		bpf_send_signal(SIGKILL);
	send_after(sb, root, verdict, rule_id, CAT_OTHER_TASK, sig, BPF_CORE_READ(task, tgid), result);
}

SEC("tp_btf/signal_generate")
int BPF_PROG(backstop_signal, int sig, struct kernel_siginfo *info, struct task_struct *task,
	     int group, int result)
{
	__u32 tgid = BPF_CORE_READ(task, tgid);
	if (!is_agent(tgid)) {
		other_signal(sig, info, task, result);
		return 0;
	}
	/* SIGCHLD: the kernel tells a parent (watcher exec's private agent)
	 * that its sandboxed child ended; harmless from any sender. */
	if (sig <= 0 || sig > 64 || sig == 17)
		return 0;
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	__u32 signo = sig;
	if (!sb) {
		/* SEND_SIG_NOINFO and SEND_SIG_PRIV (0, 1) fail the read: code 0. */
		int code = 0;
		bpf_probe_read_kernel(&code, sizeof(code), (void *)info + bpf_core_field_offset(struct kernel_siginfo, si_code));
		__u64 *oc = bpf_map_lookup_elem(&bs_operator_signals, &signo);
		if (oc && code <= 0)
			__sync_fetch_and_add(oc, 1);
		return 0;
	}
	__u64 *cnt = bpf_map_lookup_elem(&bs_agent_signals, &signo);
	if (cnt)
		__sync_fetch_and_add(cnt, 1);
	__u32 rule_id = 0;
	__u32 action = sandbox_category(sb->id, CAT_SIGNAL_AGENT, &rule_id);
	if (!action)
		action = ACTION_RECORD;
	__u32 verdict = backstop_verdict(sb, action);
	bool stop = sig == 19 || sig == 20 || sig == 21 || sig == 22;
	/* Both sends go through one per-CPU irq_work here (interrupts are off
	 * under the siglock): for a stop signal, undoing the stop comes first;
	 * its sender (kill-family syscall, ptrace) was killed at sys_enter. */
	if (stop && bpf_ksym_exists(bpf_send_signal_task))
		bpf_send_signal_task(task, 18 /* SIGCONT */, PIDTYPE_TGID, 0);
	else if (verdict == VERDICT_KILLED)
		bpf_send_signal(SIGKILL);
	struct syscall_event *e = reserve_event(SYSCALL_EVENT_COMPACT, true);
	if (!e)
		return 0;
	__builtin_memset(e, 0, SYSCALL_EVENT_COMPACT);
	fill_hdr(&e->hdr, EV_KILL_SYSCALL, verdict, rule_id, root, sb);
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs((struct task_struct *)bpf_get_current_task_btf());
	e->nr = regs ? BPF_CORE_READ(regs, orig_ax) : -1;
	e->ret = result;
	e->args[0] = sig;
	e->args[1] = sig;
	e->args[2] = sig;
	e->category = CAT_SIGNAL_AGENT;
	e->target_pid = tgid;
	e->mnt_ns = current_mnt_ns();
	submit_event(e, true);
	return 0;
}
