/* 32-bit syscalls (int 0x80, x32): refused outright or by their i386 number. */
#pragma once

#include "compat.h"

#define COMPAT_NR_BASE 0x10000      /* event nr of i386 syscall n: BASE + n */
#define NR32_mount 21

static __always_inline bool in_compat_syscall(long id)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
	/* A direct load (the task is a BTF pointer), no helper call: every
	 * syscall of the host runs this. */
	return (task->thread_info.status & TS_COMPAT) || (id & X32_SYSCALL_BIT);
}

/* compat_enter judges a 32-bit syscall: refused outright (CAT_COMPAT), or
 * by its i386 number. Sent at once (no return value): the pending slot and
 * sys_exit speak the x86_64 table. */
static __always_inline int compat_enter(struct pt_regs *regs, long id)
{
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb)
		return 0;
	__u32 rule_id = 0, cat = CAT_COMPAT;
	__u32 action = sandbox_category(sb->id, CAT_COMPAT, &rule_id);
	if (!action && (unsigned long)id < MAX_SYSCALLS) {
		__u32 nr = id;
		struct syscall_rule *r = bpf_map_lookup_elem(&bs_syscall_rules32, &nr);
		if (!r || !r->action)
			return 0;
		action = sandbox_rule(sb->id, SBR_SYSCALL32 | nr, &rule_id);
		cat = CAT_NONE;
	}
	if (action == ACTION_ALLOW)
		return 0;
	__u32 verdict = backstop_verdict(sb, action);
	if (verdict == VERDICT_KILLED)
		bpf_send_signal(SIGKILL);
	if (id == NR32_mount) {
		/* The mount happens before the kill lands: recorded as a mount,
		 * with its strings and return value, so the agent undoes it. */
		struct scratch *s = get_scratch();
		struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
		struct syscall_event *pe = bpf_task_storage_get(&bs_pending, task, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
		if (s && pe) {
			__builtin_memset(pe, 0, sizeof(*pe));
			fill_hdr(&pe->hdr, EV_KILL_SYSCALL, verdict, rule_id, root, sb);
			pe->nr = 165; /* x86_64 mount: the agent's undo reads it */
			pe->ret = RET_UNKNOWN;
			pe->args[0] = (__u32)BPF_CORE_READ(regs, bx);
			pe->args[1] = (__u32)BPF_CORE_READ(regs, cx);
			pe->args[2] = (__u32)BPF_CORE_READ(regs, dx);
			pe->args[3] = (__u32)BPF_CORE_READ(regs, si);
			pe->args[4] = (__u32)BPF_CORE_READ(regs, di);
			pe->category = cat;
			pe->mnt_ns = current_mnt_ns();
			fill_strings(s, pe, 165, pe->args);
			return 0;
		}
	}
	struct syscall_event *e = reserve_event(SYSCALL_EVENT_COMPACT, true);
	if (!e)
		return 0;
	__builtin_memset(e, 0, SYSCALL_EVENT_COMPACT);
	fill_hdr(&e->hdr, EV_KILL_SYSCALL, verdict, rule_id, root, sb);
	e->nr = COMPAT_NR_BASE + (id & 0xffff);
	e->ret = RET_UNKNOWN;
	/* i386 arguments: ebx, ecx, edx, esi, edi, ebp. */
	e->args[0] = (__u32)BPF_CORE_READ(regs, bx);
	e->args[1] = (__u32)BPF_CORE_READ(regs, cx);
	e->args[2] = (__u32)BPF_CORE_READ(regs, dx);
	e->args[3] = (__u32)BPF_CORE_READ(regs, si);
	e->args[4] = (__u32)BPF_CORE_READ(regs, di);
	e->args[5] = (__u32)BPF_CORE_READ(regs, bp);
	e->category = cat;
	e->mnt_ns = current_mnt_ns();
	submit_event(e, true);
	return 0;
}
