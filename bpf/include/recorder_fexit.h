/* Refusals of `watcher exec` commands without a syscall-wide program,
 * where fexit programs load (stock distribution kernels; not every VM):
 * - seccomp: fexit on __secure_computing, which the syscall entry calls
 *   only for tasks with a seccomp filter (everyone else never reaches
 *   it). It returns -1 when the filter skipped the syscall; a
 *   SECCOMP_RET_ERRNO has put its errno in the saved ax register by then.
 *   Only an EPERM of a watched syscall counts (as at sys_exit), and, since
 *   the skip is seen where it happens, no sys_enter mark is needed.
 * - Landlock: fexit on the security_* functions Landlock refuses path
 *   operations from (EACCES). They run for every task, but only on the
 *   operation, not on every syscall: the record is made when the hook
 *   returned EACCES or EPERM inside a watched syscall. A security_*
 *   function returns only what the LSMs said: an EACCES here is never
 *   file modes' (DENY_F_LSM_HOOK).
 * The records are the ones sys_exit makes (record_denial): the saved
 * registers still hold the syscall's number and arguments. */
#pragma once

static __always_inline int record_seccomp_skip(void *ctx)
{
	__u64 rv = 0;
	bpf_get_func_ret(ctx, &rv);
	if ((int)rv != -1)
		return 0;
	struct task_struct *task = bpf_get_current_task_btf();
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task);
	long ret = BPF_CORE_READ(regs, ax);
	if (ret != -EPERM)
		return 0;
	long nr = BPF_CORE_READ(regs, orig_ax);
	bool ia32 = in_ia32_syscall(task);
	if (ia32) {
		/* Every i386 syscall: the launcher's arch guard refuses them. */
		__u32 zero = 0;
		struct trace_config *cfg = bpf_map_lookup_elem(&tr_config, &zero);
		if (!cfg || !cfg->record_denials)
			return 0;
	} else if (!(watch_flags(nr) & DW_SECCOMP)) {
		return 0;
	}
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb || !launcher_task(task))
		return 0;
	record_denial(task, regs, nr, ret, DENIAL_SECCOMP, 0, ia32, root, sb);
	return 0;
}

SEC("fexit/__secure_computing")
int rec_seccomp(void *ctx)
{
	return record_seccomp_skip(ctx);
}

static __always_inline int record_lsm_refusal(void *ctx)
{
	__u64 rv = 0;
	bpf_get_func_ret(ctx, &rv);
	long ret = (int)rv;
	if (ret != -EACCES && ret != -EPERM)
		return 0;
	struct task_struct *task = bpf_get_current_task_btf();
	/* The arch guard refuses i386 syscalls before any path is looked up. */
	if (in_ia32_syscall(task))
		return 0;
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task);
	long nr = BPF_CORE_READ(regs, orig_ax);
	if (!(watch_flags(nr) & DW_OPEN))
		return 0;
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb || !launcher_task(task))
		return 0;
	record_denial(task, regs, nr, ret, DENIAL_OPEN, DENY_F_LSM_HOOK, false, root, sb);
	return 0;
}

/* The hooks Landlock's filesystem rights refuse from (opens and execs
 * through file_open; creating, removing, linking, renaming; truncate). */
#define RECORD_LSM_REFUSAL(hook)                   \
	SEC("fexit/security_" #hook)               \
	int rec_##hook(void *ctx)                  \
	{                                          \
		return record_lsm_refusal(ctx);    \
	}
RECORD_LSM_REFUSAL(file_open)
RECORD_LSM_REFUSAL(path_mkdir)
RECORD_LSM_REFUSAL(path_mknod)
RECORD_LSM_REFUSAL(path_rmdir)
RECORD_LSM_REFUSAL(path_unlink)
RECORD_LSM_REFUSAL(path_symlink)
RECORD_LSM_REFUSAL(path_link)
RECORD_LSM_REFUSAL(path_rename)
RECORD_LSM_REFUSAL(path_truncate)
