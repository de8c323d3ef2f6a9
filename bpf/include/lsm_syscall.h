/* The syscall a hook runs in, for checks of the dangerous list without a hook of their own. */
#pragma once

#include "compat.h"

/* Entries of the one dangerous list (internal/dangerous) without a hook of
 * their own are judged where the kernel checks them before any effect,
 * while the task is in that syscall: the capability the syscall asks for
 * first (iopl, acct, reboot, delete_module, mount_setattr...), the key
 * permission every keyctl, add_key and request_key needs, or, for those
 * with no check at all, the entry of the syscall itself (fentry: killed
 * at entry, at no cost to other syscalls). The Go loader fills
 * lsm_syscall_checks from the list: {syscall, check} -> the op whose rule
 * decides. */
#define SYSCALL_COMPAT 0x10000        /* i386 numbers are keyed as SYSCALL_COMPAT + nr */
#define SYSCALL_NONE 0xffffffffu
#define SYSCALL_TAG 0x80000000u       /* task_event.mode of a syscall-scoped decision: tag | syscall */
#define CHECK_KEY 64                  /* check: the key_permission hook */
#define CHECK_ENTRY 65                /* check: the syscall's entry (fentry) */

struct syscall_check_key {
	__u32 nr;    /* x86_64 number, or SYSCALL_COMPAT + i386 number */
	__u32 check; /* capability number (< 64), CHECK_KEY or CHECK_ENTRY */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, struct syscall_check_key);
	__type(value, __u32); /* enum lsm_op */
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lsm_syscall_checks SEC(".maps");

const struct syscall_check_key *unused_syscall_check_key __attribute__((unused));

/* current_syscall returns the syscall the current task is in, from its
 * saved registers: orig_ax is what the entry code dispatched (after
 * ptrace or seccomp had their say), TS_COMPAT marks the i386 table (int
 * 0x80, sysenter), x32 calls carry X32_SYSCALL_BIT on x86_64 numbers.
 * io_uring workers have zeroed registers: never a listed syscall. */
static __always_inline __u32 current_syscall(void)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task);
	__u64 nr = BPF_CORE_READ(regs, orig_ax);
	if (nr > 0xffffffffULL)
		return SYSCALL_NONE;
	if (BPF_CORE_READ(task, thread_info.status) & TS_COMPAT)
		return SYSCALL_COMPAT + (__u32)nr;
	return (__u32)nr & ~X32_SYSCALL_BIT;
}

/* syscall_check returns the op deciding check in syscall nr, 0 for none. */
static __always_inline __u32 syscall_check(__u32 nr, __u32 check)
{
	if (nr == SYSCALL_NONE)
		return 0;
	struct syscall_check_key k = { .nr = nr, .check = check };
	__u32 *op = bpf_map_lookup_elem(&lsm_syscall_checks, &k);
	return op ? *op : 0;
}
