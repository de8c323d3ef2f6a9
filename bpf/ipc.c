//go:build ignore

/* IPC objects sandboxes create, so a workspace rollback can remove them
 * (internal/enforce/ipcobj).
 *
 * A sandbox a runtime placed (a container with --ipc=host, a process
 * written into the sandbox cgroup) shares an IPC namespace and a /dev/shm
 * with the host: what it creates there outlives its processes. This group
 * records, in ipc_objects (pinned by name, read by `watcher workspace
 * rollback`), every System V shared memory segment, semaphore set and
 * message queue, and every file under /dev/shm, that a process of a
 * sandbox created, keyed by the object's kernel identity:
 *
 * - System V: the IPC namespace's inode number, the kind and the id the
 *   kernel returned. Created, not merely opened: ids are handed out in
 *   order (ipc_idr_alloc: cyclic index ipc_ids.last_idx, and a sequence
 *   number ipc_ids.seq bumped each time the index wraps), so the
 *   namespace's (seq, last_idx) is read at entry and at exit and the
 *   object counts only when its id's (seq, index) lies between them. An
 *   shmget(IPC_CREAT) that found a host segment returns an older id and is
 *   not recorded. An id chosen through kernel.*_next_id (checkpoint/
 *   restore) counts when next_id was set at entry and used during the
 *   call. (Both calls creating the same key at the same instant is the
 *   one race, and its winner is a coin flip either way.)
 * - /dev/shm (POSIX shm_open, or any file there): the device and inode of
 *   a file the open-family call created (FMODE_CREATED, set by the VFS,
 *   not the flags passed), when its path resolved by the kernel's dentries
 *   starts with /dev/shm/.
 * - POSIX message queues: the IPC namespace's inode and the queue's inode
 *   number in that namespace's mqueue filesystem. mq_open creates through
 *   vfs_mkobj and opens with dentry_open, which set no FMODE_CREATED, so
 *   creation is judged by order: a superblock keeps its inodes in a list
 *   new ones join at the head (inode_sb_list_add), so mq_open(O_CREAT)
 *   notes the newest inode at entry and the queue it returns counts only
 *   when it comes before that mark at exit (do_mq_open looks up and
 *   creates under the directory's lock). An opened queue, or a mark the
 *   walk cannot reach (evicted meanwhile, more than MQ_WALK inodes made
 *   in the call), records nothing. A queue made by open(O_CREAT) on a
 *   mounted mqueue filesystem (/dev/mqueue) is FMODE_CREATED like any
 *   file and is recorded the same way.
 *
 * Both 64-bit and 32-bit (int 0x80: ipc(2) and the direct calls) entries
 * are followed. The programs sit on raw syscall tracepoints (the kernel
 * has no IPC tracepoints and this host loads no kprobes or fentry), so
 * they are attached only while a sandbox needs them; each returns after
 * one comparison for every other syscall.
 */
#include "common.h"
#include "pathwalk.h"
#include "ipcobj.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define IPC_PRIVATE 0
#define IPC_CREAT 01000
#define IPC_RMID 0
#define IPC_64 0x100
#define FMODE_CREATED (1U << 20)

#include "compat.h" /* TS_COMPAT, X32_SYSCALL_BIT */

#define O_CREAT 0100
#define MQUEUE_MAGIC 0x19800202
/* Inodes mq_exit walks from the head of the superblock's list. */
#define MQ_WALK 64

/* ipc(2) calls (i386). */
#define IPCCALL_SEMCTL 3
#define IPCCALL_SEMGET 2
#define IPCCALL_MSGGET 13
#define IPCCALL_MSGCTL 14
#define IPCCALL_SHMGET 23
#define IPCCALL_SHMCTL 24

struct ipc_config {
	__u32 seq_shift; /* ipcmni_seq_shift(): 15, or 24 with ipcmni_extend */
};

/* Names of sandbox root cgroups (written by the agent as it registers
 * them, kept after the cgroup is gone): a rollback finds the objects of a
 * container that was already removed. */
struct ipc_root_name {
	char name[64];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_SANDBOXES * 4);
	__type(key, __u64);
	__type(value, struct ipc_root_name);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ipc_roots SEC(".maps");


/* Creations not recorded because ipc_objects was full (a rollback says the
 * list is incomplete). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ipc_overflow SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ipc_config);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ipc_cfg SEC(".maps");

/* A System V get or an mq_open(O_CREAT) in flight: entry state of the
 * calling thread. */
struct ipc_pending {
	__u64 sandbox_cg;
	__u32 sandbox_id;
	__u32 kind;
	__s32 key;
	__u32 ns;
	__u32 seq0;
	__s32 last0;
	__s32 next0;
	__u32 pad;
	__u64 mq_sb;   /* mqueue: the namespace's mqueue superblock */
	__u64 mq_mark; /* mqueue: the head of its inode list at entry */
};

/* Per thread (task storage: no capacity another thread could exhaust);
 * kind 0 when no call is in flight. */
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct ipc_pending);
} ipc_pending_calls SEC(".maps");

struct ipc_scratch {
	struct pathwalk pw;
	struct ipc_obj obj;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ipc_scratch);
} ipc_scratch_buf SEC(".maps");

const struct ipc_obj_key *unused_ipc_obj_key __attribute__((unused));
const struct ipc_obj *unused_ipc_obj __attribute__((unused));
const struct ipc_config *unused_ipc_config __attribute__((unused));
const struct ipc_root_name *unused_ipc_root_name __attribute__((unused));

/* A syscall this group follows, decoded from the table it came through. */
struct ipc_call {
	__u32 kind;  /* 0: not followed */
	bool get;    /* shmget/semget/msgget */
	bool rmid;   /* *ctl(IPC_RMID) */
	bool open;   /* open, openat, openat2, creat */
	bool mq;     /* mq_open */
	__s32 key;
	__u32 flags;
	__s32 id;    /* *ctl: the object */
};

static __always_inline bool compat_call(void)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
	return BPF_CORE_READ(task, thread_info.status) & TS_COMPAT;
}

static __always_inline bool is_rmid(long cmd)
{
	return (cmd & ~IPC_64) == IPC_RMID;
}

/* decode_call sorts the syscall nr with its arguments (registers, the
 * kernel's copy of what the call was given). Most syscalls fail the first
 * comparisons. */
static __always_inline void decode_call(struct pt_regs *regs, long nr, struct ipc_call *c)
{
	c->kind = 0;
	if (nr & X32_SYSCALL_BIT)
		nr &= ~X32_SYSCALL_BIT; /* x32 uses the 64-bit numbers for these */
	switch (nr) {
	case 2: case 257: case 85: case 437: /* x86_64 open, openat, creat, openat2 */
	case 5: case 295: case 8:            /* i386 open, openat, creat (openat2 is 437 in both) */
		if ((nr == 5 || nr == 295 || nr == 8) != compat_call() && nr != 437)
			return;
		c->kind = IPC_KIND_SHM_FILE;
		c->open = true;
		return;
	case 240: case 277: /* x86_64 mq_open, i386 mq_open */
		if ((nr == 277) != compat_call())
			return;
		c->kind = IPC_KIND_MQUEUE;
		c->mq = true;
		c->flags = nr == 277 ? BPF_CORE_READ(regs, cx) : BPF_CORE_READ(regs, si);
		return;
	case 29: case 64: case 68: /* x86_64 shmget, semget, msgget */
	case 31: case 66: case 71: /* x86_64 shmctl, semctl, msgctl */
		if (compat_call())
			return;
		c->kind = (nr == 29 || nr == 31) ? IPC_KIND_SHM : (nr == 64 || nr == 66) ? IPC_KIND_SEM : IPC_KIND_MSG;
		if (nr == 29 || nr == 64 || nr == 68) {
			c->get = true;
			c->key = BPF_CORE_READ(regs, di);
			c->flags = nr == 68 ? BPF_CORE_READ(regs, si) : BPF_CORE_READ(regs, dx);
		} else {
			c->id = BPF_CORE_READ(regs, di);
			c->rmid = is_rmid(nr == 66 ? BPF_CORE_READ(regs, dx) : BPF_CORE_READ(regs, si));
		}
		return;
	case 393: case 395: case 399: /* i386 semget, shmget, msgget */
	case 394: case 396: case 402: /* i386 semctl, shmctl, msgctl */
		if (!compat_call())
			return;
		c->kind = (nr == 395 || nr == 396) ? IPC_KIND_SHM : (nr == 393 || nr == 394) ? IPC_KIND_SEM : IPC_KIND_MSG;
		if (nr == 393 || nr == 395 || nr == 399) {
			c->get = true;
			c->key = BPF_CORE_READ(regs, bx);
			c->flags = nr == 399 ? BPF_CORE_READ(regs, cx) : BPF_CORE_READ(regs, dx);
		} else {
			c->id = BPF_CORE_READ(regs, bx);
			c->rmid = is_rmid(nr == 394 ? BPF_CORE_READ(regs, dx) : BPF_CORE_READ(regs, cx));
		}
		return;
	case 117: { /* i386 ipc(call, first, second, third, ptr, fifth) */
		if (!compat_call())
			return;
		__u32 call = (__u32)BPF_CORE_READ(regs, bx) & 0xffff;
		long first = (int)BPF_CORE_READ(regs, cx), second = (int)BPF_CORE_READ(regs, dx),
		     third = (int)BPF_CORE_READ(regs, si);
		switch (call) {
		case IPCCALL_SEMGET: c->kind = IPC_KIND_SEM; c->get = true; c->key = first; c->flags = third; return;
		case IPCCALL_SHMGET: c->kind = IPC_KIND_SHM; c->get = true; c->key = first; c->flags = third; return;
		case IPCCALL_MSGGET: c->kind = IPC_KIND_MSG; c->get = true; c->key = first; c->flags = second; return;
		case IPCCALL_SEMCTL: c->kind = IPC_KIND_SEM; c->id = first; c->rmid = is_rmid(third); return;
		case IPCCALL_SHMCTL: c->kind = IPC_KIND_SHM; c->id = first; c->rmid = is_rmid(second); return;
		case IPCCALL_MSGCTL: c->kind = IPC_KIND_MSG; c->id = first; c->rmid = is_rmid(second); return;
		}
		return;
	}
	}
}

static __always_inline struct ipc_namespace *current_ipc_ns(void)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
	return BPF_CORE_READ(task, nsproxy, ipc_ns);
}

/* ids_state reads where the namespace's id allocation of a kind stands. */
struct ids_state {
	__u32 seq;
	__s32 last;
	__s32 next;
};

static __always_inline struct ids_state ids_state(struct ipc_namespace *ns, __u32 kind)
{
	/* ids[] order: sem, msg, shm. */
	struct ids_state st = { .last = -1, .next = -1 };
	__u32 idx = kind - 1;
	if (idx > 2)
		return st;
	st.seq = BPF_CORE_READ(ns, ids[idx].seq);
	st.last = BPF_CORE_READ(ns, ids[idx].last_idx);
	if (bpf_core_field_exists(ns->ids[idx].next_id))
		st.next = BPF_CORE_READ(ns, ids[idx].next_id);
	return st;
}

static __always_inline void count_overflow(void)
{
	__u32 zero = 0;
	__u64 *n = bpf_map_lookup_elem(&ipc_overflow, &zero);
	if (n)
		__sync_fetch_and_add(n, 1);
}

static __always_inline void fill_obj(struct ipc_obj *o, __u64 root, struct sandbox *sb)
{
	o->sandbox_cg = root;
	o->sandbox_id = sb->id;
	o->ts_ns = bpf_ktime_get_boot_ns();
	o->tgid = bpf_get_current_pid_tgid() >> 32;
	o->uid = (__u32)bpf_get_current_uid_gid();
	bpf_get_current_comm(&o->comm, sizeof(o->comm));
}

/* mq_enter notes, for an mq_open(O_CREAT) of a sandbox process, the
 * namespace's mqueue superblock and the newest inode on it. */
static __always_inline int mq_enter(struct ipc_call *c)
{
	if (!(c->flags & O_CREAT))
		return 0;
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb)
		return 0;
	struct ipc_namespace *ns = current_ipc_ns();
	struct vfsmount *mnt = BPF_CORE_READ(ns, mq_mnt);
	if (!mnt)
		return 0;
	struct super_block *msb = BPF_CORE_READ(mnt, mnt_sb);
	struct ipc_pending p = {
		.sandbox_cg = root, .sandbox_id = sb->id, .kind = IPC_KIND_MQUEUE,
		.ns = BPF_CORE_READ(ns, ns.inum), .mq_sb = (__u64)msb,
		.mq_mark = (__u64)BPF_CORE_READ(msb, s_inodes.next),
	};
	struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
	struct ipc_pending *slot = bpf_task_storage_get(&ipc_pending_calls, task, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (slot)
		*slot = p;
	return 0;
}

SEC("tp_btf/sys_enter")
int BPF_PROG(ipc_sys_enter, struct pt_regs *regs, long nr)
{
	struct ipc_call c = {};
	decode_call(regs, nr, &c);
	if (c.mq)
		return mq_enter(&c);
	if (!c.get || !(c.key == IPC_PRIVATE || (c.flags & IPC_CREAT)))
		return 0; /* without IPC_CREAT a get never creates */
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb)
		return 0;
	struct ipc_namespace *ns = current_ipc_ns();
	struct ids_state st = ids_state(ns, c.kind);
	struct ipc_pending p = {
		.sandbox_cg = root, .sandbox_id = sb->id, .kind = c.kind, .key = c.key,
		.ns = BPF_CORE_READ(ns, ns.inum), .seq0 = st.seq, .last0 = st.last, .next0 = st.next,
	};
	struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
	struct ipc_pending *slot = bpf_task_storage_get(&ipc_pending_calls, task, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (slot)
		*slot = p;
	return 0;
}

/* allocated_between reports whether id (seq s, index i) comes after
 * (s0, l0) and not after (s1, l1) in the kernel's allocation order: the
 * index counts up, the sequence number steps when it wraps, and the
 * sequence number itself wraps at m. */
static __always_inline bool allocated_between(__u32 s, __s32 i, __u32 s0, __s32 l0, __u32 s1, __s32 l1, __u32 m)
{
	if (m == 0 || s >= m || s0 >= m || s1 >= m)
		return false;
	__u32 ds = (s + m - s0) % m, d1 = (s1 + m - s0) % m;
	bool after0 = ds > 0 || i > l0;
	bool upto1 = ds < d1 || (ds == d1 && i <= l1);
	return after0 && upto1;
}

static __always_inline int sysv_exit(struct ipc_call *c, long ret)
{
	if (c->rmid) {
		/* The sandbox removed an object it may have recorded. */
		if (ret != 0)
			return 0;
		__u64 root = 0;
		if (!current_sandbox(&root))
			return 0;
		struct ipc_namespace *ns = current_ipc_ns();
		struct ipc_obj_key k = { .kind = c->kind, .ns = BPF_CORE_READ(ns, ns.inum), .obj = (__u64)(__u32)c->id };
		bpf_map_delete_elem(&ipc_objects, &k);
		return 0;
	}
	struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
	struct ipc_pending *p = bpf_task_storage_get(&ipc_pending_calls, task, 0, 0);
	if (!p || !p->kind)
		return 0;
	struct ipc_pending pc = *p;
	p->kind = 0;
	if (ret < 0 || pc.kind != c->kind)
		return 0;
	struct ipc_namespace *ns = current_ipc_ns();
	if (BPF_CORE_READ(ns, ns.inum) != pc.ns)
		return 0;
	__u32 zero = 0;
	struct ipc_config *cfg = bpf_map_lookup_elem(&ipc_cfg, &zero);
	__u32 shift = cfg && cfg->seq_shift ? cfg->seq_shift : 15;
	if (shift < 8 || shift > 24)
		return 0;
	__u32 m = 0x7fffffff >> shift; /* ipcid_seq_max(): seq runs 0..m-1 */
	struct ids_state st = ids_state(ns, c->kind);
	__u32 s = (__u32)ret >> shift;
	__s32 i = (__u32)ret & ((1U << shift) - 1);
	bool created = allocated_between(s, i, pc.seq0, pc.last0, st.seq, st.last, m);
	if (!created && pc.next0 >= 0 && (__s32)ret == pc.next0 && st.next != pc.next0)
		created = true; /* the id kernel.*_next_id asked for, used now */
	if (!created)
		return 0; /* an existing object: opened, not created */
	struct ipc_obj o = { .key = pc.key };
	struct sandbox sb = { .id = pc.sandbox_id };
	fill_obj(&o, pc.sandbox_cg, &sb);
	struct ipc_obj_key k = { .kind = c->kind, .ns = pc.ns, .obj = (__u64)(__u32)ret };
	if (bpf_map_update_elem(&ipc_objects, &k, &o, BPF_ANY))
		count_overflow();
	return 0;
}

/* mq_inode_newer reports whether ino was added to sb's inode list after
 * mark was its head: it comes first walking from the head now. */
static __always_inline bool mq_inode_newer(struct super_block *sb, struct inode *ino, __u64 mark)
{
	__u64 head = (__u64)sb + bpf_core_field_offset(struct super_block, s_inodes);
	__u64 ours = (__u64)ino + bpf_core_field_offset(struct inode, i_sb_list);
	struct list_head *n = BPF_CORE_READ(sb, s_inodes.next);
	bool seen = false;
	for (int i = 0; i < MQ_WALK; i++) {
		__u64 a = (__u64)n;
		if (a == mark)
			return seen;
		if (a == ours)
			seen = true;
		if (a == head || !a)
			return false;
		n = BPF_CORE_READ(n, next);
	}
	return false;
}

/* record_mq records the queue open as f (an inode of the mqueue
 * superblock msb), created by the current sandbox process. */
static __always_inline void record_mq(struct file *f, struct super_block *msb, __u64 root, struct sandbox *sb)
{
	__u32 zero = 0;
	struct ipc_scratch *s = bpf_map_lookup_elem(&ipc_scratch_buf, &zero);
	if (!s)
		return;
	/* The superblock's key is its IPC namespace (mqueue_get_tree). */
	struct ipc_namespace *ns = BPF_CORE_READ(msb, s_fs_info);
	struct ipc_obj_key k = { .kind = IPC_KIND_MQUEUE, .ns = BPF_CORE_READ(ns, ns.inum), .obj = BPF_CORE_READ(f, f_inode, i_ino) };
	__builtin_memset(&s->obj, 0, sizeof(s->obj));
	fill_obj(&s->obj, root, sb);
	s->obj.name[0] = '/';
	const unsigned char *name = BPF_CORE_READ(f, f_path.dentry, d_name.name);
	bpf_probe_read_kernel_str(&s->obj.name[1], sizeof(s->obj.name) - 1, name);
	if (bpf_map_update_elem(&ipc_objects, &k, &s->obj, BPF_ANY))
		count_overflow();
}

static __always_inline int mq_exit(long ret)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
	struct ipc_pending *p = bpf_task_storage_get(&ipc_pending_calls, task, 0, 0);
	if (!p || p->kind != IPC_KIND_MQUEUE)
		return 0;
	struct ipc_pending pc = *p;
	p->kind = 0;
	if (ret < 0)
		return 0;
	struct file *f = pw_fd_file(ret);
	if (!f)
		return 0;
	struct inode *ino = BPF_CORE_READ(f, f_inode);
	struct super_block *msb = BPF_CORE_READ(ino, i_sb);
	if ((__u64)msb != pc.mq_sb || !mq_inode_newer(msb, ino, pc.mq_mark))
		return 0; /* an existing queue: opened, not created */
	struct sandbox sb = { .id = pc.sandbox_id };
	record_mq(f, msb, pc.sandbox_cg, &sb);
	return 0;
}

static __always_inline int open_exit(long ret)
{
	if (ret < 0)
		return 0;
	/* Membership first: one cached lookup for the host's tasks. */
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb)
		return 0;
	struct file *f = pw_fd_file(ret);
	if (!f || !(BPF_CORE_READ(f, f_mode) & FMODE_CREATED))
		return 0;
	struct super_block *fsb = BPF_CORE_READ(f, f_inode, i_sb);
	if (BPF_CORE_READ(fsb, s_magic) == MQUEUE_MAGIC) {
		record_mq(f, fsb, root, sb);
		return 0;
	}
	__u32 zero = 0;
	struct ipc_scratch *s = bpf_map_lookup_elem(&ipc_scratch_buf, &zero);
	if (!s)
		return 0;
	pw_resolve_file(&s->pw, f);
	if (s->pw.flags || s->pw.len < 10)
		return 0;
	/* "/dev/shm/" */
	const char want[] = "/dev/shm/";
	for (int i = 0; i < 9; i++)
		if (s->pw.buf[i] != want[i])
			return 0;
	struct inode *ino = BPF_CORE_READ(f, f_inode);
	dev_t dev = BPF_CORE_READ(ino, i_sb, s_dev);
	struct ipc_obj_key k = { .kind = IPC_KIND_SHM_FILE, .ns = dev, .obj = BPF_CORE_READ(ino, i_ino) };
	__builtin_memset(&s->obj, 0, sizeof(s->obj));
	fill_obj(&s->obj, root, sb);
	bpf_probe_read_kernel_str(s->obj.name, sizeof(s->obj.name), s->pw.buf);
	if (bpf_map_update_elem(&ipc_objects, &k, &s->obj, BPF_ANY))
		count_overflow();
	return 0;
}

SEC("tp_btf/sys_exit")
int BPF_PROG(ipc_sys_exit, struct pt_regs *regs, long ret)
{
	long nr = BPF_CORE_READ(regs, orig_ax);
	struct ipc_call c = {};
	decode_call(regs, nr, &c);
	if (!c.kind)
		return 0;
	if (c.open)
		return open_exit(ret);
	if (c.mq)
		return mq_exit(ret);
	if (c.get || c.rmid)
		return sysv_exit(&c, ret);
	return 0;
}
