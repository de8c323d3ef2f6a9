/* Leaving the sandbox at creation, namespaces, perf, keys. */
#pragma once

#define CLONE_INTO_CGROUP 0x200000000ULL
#define CLONE_FILES 0x00000400ULL
#define CLONE_THREAD 0x00010000ULL

/* task_alloc gets the flags the kernel copied (clone's register, or
 * clone3's clone_args after copy_from_user): kernel state, not user memory
 * a sibling thread can still flip.
 *
 * clone3(CLONE_INTO_CGROUP) starts the child in the cgroup of a directory
 * fd, without a cgroup.procs write the file rules would see. task_alloc
 * runs before the kernel resolves that fd, so the flag itself is judged.
 *
 * CLONE_FILES without CLONE_THREAD: a second process sharing the file
 * table, so one process's descriptors are another's (the event's mode is
 * the low 32 bits of the flags). Threads share it by design and stay
 * allowed. */
static __always_inline int decide_task_alloc(__u32 mech, unsigned long long clone_flags, int ret)
{
	if (ret)
		return ret;
	if (clone_flags & CLONE_INTO_CGROUP)
		return judge_op(mech, LSM_OP_CLONE_INTO_CGROUP, EV_OPERATION, (__u32)(clone_flags >> 32));
	if ((clone_flags & CLONE_FILES) && !(clone_flags & CLONE_THREAD))
		return judge_op(mech, LSM_OP_CLONE_FILES, EV_OPERATION, (__u32)clone_flags);
	return 0;
}
WATCHER_HOOK(task_alloc, security_task_alloc, decide_task_alloc(mech, clone_flags, ret),
	     struct task_struct *task, unsigned long long clone_flags, int ret)

/* perf_event_open: 6.1 passes (attr, type), 6.18 only (type), so the
 * previous return value moves: not read (see bpf in lsm_task.h). */
WATCHER_HOOK(perf_event_open, security_perf_event_open, judge_op(mech, LSM_OP_PERF_EVENT, EV_OPERATION, 0), void *unused)

static __always_inline int decide_op(__u32 mech, __u32 op, int ret)
{
	if (ret)
		return ret;
	return judge_op(mech, op, EV_OPERATION, 0);
}
/* clone(CLONE_NEWUSER) and unshare(CLONE_NEWUSER); the kernel function is
 * security_create_user_ns. */
WATCHER_HOOK(userns_create, security_create_user_ns, decide_op(mech, LSM_OP_USERNS, ret),
	     const struct cred *cred, int ret)
/* add_key(2) and keyctl(2) creating keys or keyrings (KEYCTL_JOIN_SESSION_KEYRING...). */
WATCHER_HOOK(key_alloc, security_key_alloc, decide_op(mech, LSM_OP_KEYRING, ret),
	     struct key *key, const struct cred *cred, unsigned long flags, int ret)

/* Every keyctl(2), add_key(2) and request_key(2) that touches a key or
 * keyring (reading, linking, searching, updating, the keyring a new key
 * goes to) asks key_permission first: refused while the task is in one of
 * those syscalls. The kernel's own lookups on the task's behalf
 * (fscrypt, ecryptfs at open) are left alone. */
static __always_inline int decide_key_permission(__u32 mech, int ret)
{
	if (ret)
		return ret;
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb)
		return 0;
	__u32 nr = current_syscall();
	__u32 op = syscall_check(nr, CHECK_KEY);
	if (!op)
		return 0;
	struct decision d = op_decision(sb->id, op, ACTION_ALLOW);
	return judge_task(mech, op, EV_OPERATION, d, sb, root, NULL, SYSCALL_TAG | nr, -1, false);
}
WATCHER_HOOK(key_permission, security_key_permission, decide_key_permission(mech, ret),
	     key_ref_t key_ref, const struct cred *cred, enum key_need_perm need_perm, int ret)
