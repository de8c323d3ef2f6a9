/* Syscalls no hook judges: killed at their entry. */
#pragma once

/* personality(2), name_to_handle_at(2) and io_uring_enter/register check
 * nothing an LSM hook sees. An fentry program on each syscall's own entry
 * point kills the caller as the backstop does, before the call returns to
 * user space, while every other syscall of the host runs untaxed: nothing
 * the call changed outlives the process (a personality is the dying
 * task's, a handle is useless with open_by_handle_at refused, a ring dies
 * with its only user). Tracing programs cannot return an errno: block is
 * a kill. */
static __always_inline int kill_in_syscall(void)
{
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb)
		return 0;
	__u32 nr = current_syscall();
	__u32 op = syscall_check(nr, CHECK_ENTRY);
	if (!op)
		return 0;
	struct decision d = op_decision(sb->id, op, ACTION_ALLOW);
	if (d.action == ACTION_BLOCK)
		d.action = ACTION_KILL;
	judge_task(EV_FENTRY, op, EV_OPERATION, d, sb, root, NULL, SYSCALL_TAG | nr, -1, false);
	return 0;
}

#define WATCHER_ENTRY(fn)                   \
	SEC("fentry/" #fn)                  \
	int BPF_PROG(entry_##fn)            \
	{                                   \
		return kill_in_syscall();   \
	}

/* io_uring_setup: where the ring gets a secure anonymous inode (6.1)
 * inode_init_security_anon refuses it with EPERM, a refusal a program
 * probing for io_uring survives; elsewhere the ring comes back and the
 * caller is killed on the way out (fexit), before user space runs. */
#define WATCHER_EXIT(fn)                                                \
	SEC("fexit/" #fn)                                               \
	int BPF_PROG(exit_##fn, const struct pt_regs *regs, long ret)   \
	{                                                               \
		return ret < 0 ? 0 : kill_in_syscall();                 \
	}
WATCHER_ENTRY(__x64_sys_personality)
WATCHER_ENTRY(__ia32_sys_personality)
/* Debian 6.1's BTF lists the name_to_handle_at wrappers twice (an
 * ambiguous attach target): the function both entries call, after the
 * path lookup and before the handle is encoded, instead. */
WATCHER_ENTRY(do_sys_name_to_handle)
WATCHER_EXIT(__x64_sys_io_uring_setup)
WATCHER_EXIT(__ia32_sys_io_uring_setup)
WATCHER_ENTRY(__x64_sys_io_uring_enter)
WATCHER_ENTRY(__ia32_sys_io_uring_enter)
WATCHER_ENTRY(__x64_sys_io_uring_register)
WATCHER_ENTRY(__ia32_sys_io_uring_register)
