/* SIGIO and SIGURG: owners a sandbox set, the agent and other processes. */
#pragma once

/* F_SETOWN (or F_SETOWN_EX, or a process group containing the agent) plus
 * O_ASYNC makes the kernel signal the owner when I/O is ready: no kill
 * syscall and no task_kill hook. The agent never asks for SIGIO, so every
 * such delivery to it is refused; the sandbox is the current task's when
 * it is in one (the delivery may run in another task's context). Another
 * owner outside the sandbox's subtree is judged by the other-processes
 * rule when the task making the I/O ready is in the sandbox (a host task
 * readying the file signals on its own account).
 *
 * The kernel sends a file's SIGIO or SIGURG from whatever task makes the
 * event happen: the writer, a task closing its files as it exits, a
 * kworker finishing a delayed close. Judged by that task alone, an owner
 * a sandbox set on the host escapes whenever the signal comes from outside
 * the sandbox (a socket's hang-up at its close killed the host process).
 * So the sandbox that sets a file's owner (fcntl F_SETOWN, F_SETOWN_EX;
 * ioctl FIOSETOWN, SIOCSPGRP) is recorded with the file, and every signal
 * for that file is judged as that sandbox's, whoever triggers it. */

struct fown_setter {
	__u64 root; /* the sandbox's root cgroup */
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64); /* struct file * */
	__type(value, struct fown_setter);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lsm_fown_setters SEC(".maps");

/* Before Linux 6.12 the owner was part of struct file. */
struct file___fown_inline {
	struct fown_struct f_owner;
} __attribute__((preserve_access_index));

static __always_inline struct file *fown_file(struct fown_struct *fown)
{
	if (bpf_core_field_exists(fown->file))
		return BPF_CORE_READ(fown, file);
	return (struct file *)((void *)fown - bpf_core_field_offset(struct file___fown_inline, f_owner));
}

static __always_inline void record_fown_setter(struct file *file)
{
	__u64 root = 0;
	if (!file || !current_sandbox(&root))
		return;
	__u64 k = (__u64)file;
	struct fown_setter v = { .root = root };
	bpf_map_update_elem(&lsm_fown_setters, &k, &v, BPF_ANY);
}

static __always_inline int decide_file_fcntl(__u32 mech, struct file *file, unsigned int cmd, int ret)
{
	(void)mech; /* recorded, never refused here (the pid names no task yet) */
	if (!ret && (cmd == F_SETOWN_ || cmd == F_SETOWN_EX_))
		record_fown_setter(file);
	return ret;
}
WATCHER_HOOK(file_fcntl, security_file_fcntl, decide_file_fcntl(mech, file, cmd, ret),
	     struct file *file, unsigned int cmd, unsigned long arg, int ret)

SEC("fentry/security_file_free")
int BPF_PROG(entry_security_file_free, struct file *file)
{
	__u64 k = (__u64)file;
	bpf_map_delete_elem(&lsm_fown_setters, &k);
	return 0;
}

/* judge_sigio judges a SIGIO/SIGURG (sig 0: SIGIO) for tsk as sandbox sb's
 * (rooted at root): the agent by its own rule, any other task outside the
 * subtree by the other-processes rule. */
static __always_inline int judge_sigio(__u32 mech, struct task_struct *tsk, int sig, struct sandbox *sb, __u64 root)
{
	if (!is_agent(BPF_CORE_READ(tsk, tgid))) {
		if (st_task_below(tsk, root))
			return 0;
		struct decision d = op_decision(sb->id, LSM_OP_OTHER_TASK, ACTION_ALLOW);
		return judge_task(mech, LSM_OP_OTHER_TASK, EV_SIGNAL, d, sb, root, tsk, (__u32)(sig ? sig : 29), -1, false);
	}
	struct decision d = op_decision(sb->id, LSM_OP_AGENT_SIGNAL, ACTION_BLOCK);
	if (d.action < ACTION_BLOCK && sig != 0)
		d.action = ACTION_RECORD;
	return judge_task(mech, LSM_OP_AGENT_SIGNAL, EV_SIGNAL, d, sb, root, tsk, (__u32)(sig ? sig : 29), -1, false);
}

static __always_inline int decide_file_send_sigiotask(__u32 mech, struct task_struct *tsk, struct fown_struct *fown,
						      int sig, int ret)
{
	if (ret)
		return ret;
	/* An owner a sandbox set: that sandbox's signal, whoever sends it. */
	__u64 fk = (__u64)fown_file(fown);
	struct fown_setter *st = bpf_map_lookup_elem(&lsm_fown_setters, &fk);
	if (st) {
		__u64 root = st->root;
		struct sandbox *owner = bpf_map_lookup_elem(&sandboxes, &root);
		if (owner)
			return judge_sigio(mech, tsk, sig, owner, root);
	}
	if (!is_agent(BPF_CORE_READ(tsk, tgid)))
		return judge_other_task(mech, EV_SIGNAL, tsk, (__u32)(sig ? sig : 29 /* SIGIO */));
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	struct sandbox none = {};
	struct decision d = { .action = ACTION_BLOCK };
	if (sb)
		d = op_decision(sb->id, LSM_OP_AGENT_SIGNAL, ACTION_BLOCK);
	else
		sb = &none;
	if (d.action < ACTION_BLOCK && sig != 0)
		d.action = ACTION_RECORD;
	return judge_task(mech, LSM_OP_AGENT_SIGNAL, EV_SIGNAL, d, sb, root, tsk, (__u32)(sig ? sig : 29 /* SIGIO */), -1, false);
}
WATCHER_HOOK(file_send_sigiotask, security_file_send_sigiotask, decide_file_send_sigiotask(mech, tsk, fown, sig, ret),
	     struct task_struct *tsk, struct fown_struct *fown, int sig, int ret)
