/* System V objects of other sandboxes and the host, judged at sys_enter. */
#pragma once

/* Without the LSM's ipc hooks, a System V object is the sandbox's own when
 * bpf/ipc.c recorded its creation by a process of the sandbox (its
 * tracepoints are attached while a sandbox needs this). Using another's
 * (shmat, semop, semtimedop, msgsnd, msgrcv) or changing it (the *ctl
 * commands below) is judged by the other-IPC rule at entry: the call
 * completes before the kill, so a shmat maps the segment and the process
 * dies before it returns. Reads of an object's state (IPC_STAT, *_INFO,
 * GETVAL...) stay allowed, as ipcs needs. */
#define NR_shmat 30 /* also backstop_lowmap.h's */
#define NR_shmctl 31
#define NR_semop 65
#define NR_semctl 66
#define NR_msgsnd 69
#define NR_msgrcv 70
#define NR_msgctl 71
#define NR_semtimedop 220
#define IPC_64_ 0x100
#define NR_mq_timedsend 242
#define NR_mq_timedreceive 243
#define NR_mq_notify 244
#define MQUEUE_MAGIC_ 0x19800202

/* ipc_ctl_changes: a *ctl command that removes or changes the object. */
static __always_inline bool ipc_ctl_changes(long nr, __u64 cmd)
{
	cmd &= ~(__u64)IPC_64_;
	if (cmd == 0 || cmd == 1) /* IPC_RMID, IPC_SET */
		return true;
	if (nr == NR_semctl)
		return cmd == 16 || cmd == 17; /* SETVAL, SETALL */
	if (nr == NR_shmctl)
		return cmd == 11 || cmd == 12; /* SHM_LOCK, SHM_UNLOCK */
	return false;
}

/* ipc_foreign returns whether the object the call names was not created by
 * the sandbox rooted at root; *creator is its creator's tgid when known. */
static __always_inline bool ipc_foreign(long nr, struct pt_regs *regs, __u64 root, __u32 *creator)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
	struct ipc_obj_key k = {
		.kind = (nr == NR_shmat || nr == NR_shmctl) ? IPC_KIND_SHM :
			(nr == NR_msgsnd || nr == NR_msgrcv || nr == NR_msgctl) ? IPC_KIND_MSG : IPC_KIND_SEM,
		.ns = BPF_CORE_READ(task, nsproxy, ipc_ns, ns.inum),
		.obj = (__u64)(__u32)BPF_CORE_READ(regs, di),
	};
	if (nr == NR_mq_timedsend || nr == NR_mq_timedreceive || nr == NR_mq_notify) {
		/* A POSIX message queue, by the descriptor's inode. */
		struct file *f = pw_fd_file((long)BPF_CORE_READ(regs, di));
		struct inode *inode = f ? BPF_CORE_READ(f, f_inode) : NULL;
		if (!inode || BPF_CORE_READ(inode, i_sb, s_magic) != MQUEUE_MAGIC_)
			return false; /* not a queue: the kernel fails the call */
		k.kind = IPC_KIND_MQUEUE;
		k.obj = BPF_CORE_READ(inode, i_ino);
	}
	struct ipc_obj *o = bpf_map_lookup_elem(&ipc_objects, &k);
	if (o && o->sandbox_cg == root)
		return false;
	*creator = o ? o->tgid : 0;
	return true;
}
