/* Own subtree: System V IPC objects and POSIX message queues. */
#pragma once

/* Objects a sandbox created, so only its own subtree reaches them. System V
 * objects are keyed by their kern_ipc_perm: the alloc hooks run in the
 * creating task (shmget, semget, msgget with IPC_CREAT making a new one)
 * and the free hooks (fentry on security_*_free: the LSM's free hooks are
 * void, no fmod_ret) drop the entry, so a freed object's address handed
 * to a host object later is no match. ipc_permission (every ipcperms:
 * shmat, shmget of an existing key, semop, semctl, msgsnd, msgrcv, the
 * *_STAT commands) and the *ctl hooks (IPC_RMID, IPC_SET, SHM_LOCK, which
 * ask ownership or CAP_SYS_ADMIN instead) judge the rest. */
struct ipc_owner {
	__u64 sandbox_cg; /* root cgroup of the sandbox that created it */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 32768);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u64); /* struct kern_ipc_perm * */
	__type(value, struct ipc_owner);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lsm_ipc_owner SEC(".maps");

/* POSIX message queues a sandbox created, by {mqueue superblock dev_t,
 * inode number} (mqueue inode numbers come from get_next_ino(): not handed
 * out again until it wraps). mq_open(O_CREAT) creates through vfs_mkobj
 * (inode_create, on the negative dentry) and opens with dentry_open
 * (file_open, no FMODE_CREATED): the pending map carries the dentry from
 * the one hook to the other within the call. open(O_CREAT) on a mounted
 * mqueue filesystem sets FMODE_CREATED. */
struct mq_key {
	__u32 dev;
	__u32 pad;
	__u64 ino;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct mq_key);
	__type(value, struct ipc_owner);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lsm_mq_owner SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);   /* pid_tgid of the creating thread */
	__type(value, __u64); /* the dentry being created */
} lsm_mq_pending SEC(".maps");

const struct ipc_owner *unused_ipc_owner __attribute__((unused));
const struct mq_key *unused_mq_key __attribute__((unused));

#define MQUEUE_MAGIC 0x19800202
#define FMODE_CREATED (1U << 20)
#define IPC_TAG 0x20000000u /* task_event.mode of an other-ipc event: tag | what (IPC_WHAT_*) << 16 | detail */
#define IPC_WHAT_PERM 1     /* ipc_permission: detail is the access flag (S_IRUGO, S_IWUGO bits) */
#define IPC_WHAT_CTL 2      /* shmctl, semctl, msgctl: detail is the command */

static __always_inline int record_ipc_owner(__u32 mech, struct kern_ipc_perm *perm, int ret)
{
	(void)mech; /* nothing to report: creation is never refused here */
	if (ret)
		return ret;
	__u64 root = 0;
	if (!current_sandbox(&root))
		return 0;
	__u64 k = (__u64)perm;
	struct ipc_owner o = { .sandbox_cg = root };
	bpf_map_update_elem(&lsm_ipc_owner, &k, &o, BPF_ANY);
	return 0;
}
WATCHER_HOOK(shm_alloc_security, security_shm_alloc, record_ipc_owner(mech, perm, ret), struct kern_ipc_perm *perm, int ret)
WATCHER_HOOK(sem_alloc_security, security_sem_alloc, record_ipc_owner(mech, perm, ret), struct kern_ipc_perm *perm, int ret)
WATCHER_HOOK(msg_queue_alloc_security, security_msg_queue_alloc, record_ipc_owner(mech, perm, ret),
	     struct kern_ipc_perm *perm, int ret)

#define WATCHER_IPC_FREE(fn)                                     \
	SEC("fentry/" #fn)                                       \
	int BPF_PROG(entry_##fn, struct kern_ipc_perm *perm)     \
	{                                                        \
		__u64 k = (__u64)perm;                           \
		bpf_map_delete_elem(&lsm_ipc_owner, &k);         \
		return 0;                                        \
	}
WATCHER_IPC_FREE(security_shm_free)
WATCHER_IPC_FREE(security_sem_free)
WATCHER_IPC_FREE(security_msg_queue_free)

/* judge_ipc judges access to a System V object by the other-IPC rule
 * unless the caller's sandbox created it. The event's target_pid is the
 * object's id. */
static __always_inline int judge_ipc(__u32 mech, struct kern_ipc_perm *perm, __u32 what, __u32 detail)
{
	struct op_ctx c;
	if (!perm || !op_begin(&c, LSM_OP_OTHER_IPC))
		return 0;
	__u64 k = (__u64)perm;
	struct ipc_owner *o = bpf_map_lookup_elem(&lsm_ipc_owner, &k);
	if (o && o->sandbox_cg == c.root)
		return 0;
	__u32 verdict = effective_verdict(c.sb, c.d.action);
	struct task_event *e = reserve_event(sizeof(*e), true);
	if (e) {
		fill_hdr(&e->hdr, EV_OPERATION + mech, verdict, c.d.rule_id, c.root, c.sb);
		e->op = LSM_OP_OTHER_IPC;
		e->target_pid = (__u32)BPF_CORE_READ(perm, id);
		e->mode = IPC_TAG | (what << 16) | (detail & 0xffff);
		e->cap = BPF_CORE_READ(perm, key); /* the object's key */
		e->target_comm[0] = 0;
		submit_event(e, true);
	}
	return conclude(verdict);
}

static __always_inline int decide_ipc_permission(__u32 mech, struct kern_ipc_perm *ipcp, short flag, int ret)
{
	return ret ? ret : judge_ipc(mech, ipcp, IPC_WHAT_PERM, (__u32)(unsigned short)flag);
}
WATCHER_HOOK(ipc_permission, security_ipc_permission, decide_ipc_permission(mech, ipcp, flag, ret),
	     struct kern_ipc_perm *ipcp, short flag, int ret)

static __always_inline int decide_ipc_ctl(__u32 mech, struct kern_ipc_perm *perm, int cmd, int ret)
{
	return ret ? ret : judge_ipc(mech, perm, IPC_WHAT_CTL, (__u32)cmd);
}
WATCHER_HOOK(shm_shmctl, security_shm_shmctl, decide_ipc_ctl(mech, perm, cmd, ret),
	     struct kern_ipc_perm *perm, int cmd, int ret)
WATCHER_HOOK(sem_semctl, security_sem_semctl, decide_ipc_ctl(mech, perm, cmd, ret),
	     struct kern_ipc_perm *perm, int cmd, int ret)
WATCHER_HOOK(msg_queue_msgctl, security_msg_queue_msgctl, decide_ipc_ctl(mech, perm, cmd, ret),
	     struct kern_ipc_perm *perm, int cmd, int ret)

/* mq_open(O_CREAT) of a new queue: note the dentry for file_open. */
static __always_inline int decide_inode_create(__u32 mech, struct inode *dir, struct dentry *dentry, int ret)
{
	(void)mech;
	if (ret || BPF_CORE_READ(dir, i_sb, s_magic) != MQUEUE_MAGIC)
		return ret;
	__u64 root = 0;
	if (!current_sandbox(&root))
		return 0;
	__u64 id = bpf_get_current_pid_tgid();
	__u64 d = (__u64)dentry;
	bpf_map_update_elem(&lsm_mq_pending, &id, &d, BPF_ANY);
	return 0;
}
WATCHER_HOOK(inode_create, security_inode_create, decide_inode_create(mech, dir, dentry, ret),
	     struct inode *dir, struct dentry *dentry, umode_t mode, int ret)

/* mq_decision is the file_open decision on a message queue: allowed when
 * the caller's sandbox created it (now or before), else the other-IPC
 * rule. */
static __always_inline struct decision mq_decision(struct file *file, __u32 sid, __u64 root, __u32 dev, __u64 ino)
{
	struct decision allow = { .action = ACTION_ALLOW };
	struct mq_key k = { .dev = dev, .ino = ino };
	struct ipc_owner o = { .sandbox_cg = root };
	__u64 id = bpf_get_current_pid_tgid();
	__u64 *pending = bpf_map_lookup_elem(&lsm_mq_pending, &id);
	bool created = BPF_CORE_READ(file, f_mode) & FMODE_CREATED;
	if (pending && *pending == (__u64)BPF_CORE_READ(file, f_path.dentry))
		created = true;
	if (pending)
		bpf_map_delete_elem(&lsm_mq_pending, &id);
	if (created) {
		bpf_map_update_elem(&lsm_mq_owner, &k, &o, BPF_ANY);
		return allow;
	}
	struct ipc_owner *own = bpf_map_lookup_elem(&lsm_mq_owner, &k);
	if (own && own->sandbox_cg == root)
		return allow;
	return op_decision(sid, LSM_OP_OTHER_IPC, ACTION_ALLOW);
}
