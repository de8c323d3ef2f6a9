/* The verdict cache: allowed opens of single-name files, one lookup when repeated. */
#pragma once

/* Judging an open walks its path (pathwalk.h) and matches the rules; most
 * opens of a sandbox are the same files again, allowed. The cache keeps
 * those "nothing to do" verdicts so a repeated open costs one lookup.
 *
 * A verdict depends on the name the file was reached by, so only files
 * whose inode has one name are cached: regular files with i_nlink == 1 and
 * directories, on filesystems whose names change only through local
 * operations on this kernel (ext2/3/4, xfs, tmpfs: no btrfs, whose
 * snapshots copy inode numbers and generations, no network, FUSE or
 * overlay filesystems). The key holds the inode (dev, ino, generation),
 * the mount (mnt_id_unique: never reused, unlike mnt_id), the task's root
 * (its mount and directory inode: paths are relative to it), the sandbox
 * and the access asked.
 *
 * An entry is valid while two generations are those it was stored under:
 * - rules (VC_RULES_GEN, written by the agent only): odd while a rule set
 *   is being written or while the cache is off (0 until an agent set it),
 *   so a half-written table never produces entries;
 * - names (VC_NAME_GEN, bumped here only): every change of a directory's
 *   ctime, from any task, syscall, io_uring request or kernel thread (an
 *   entry added, removed or renamed: rename, link, unlink, rmdir, ...;
 *   filesystems update the directories before the dcache shows the new
 *   name), and every mount-family syscall of any task, native or 32-bit,
 *   at entry and exit; while one runs (VC_BUSY) nothing is cached.
 * The generations are read before anything else, so a change that lands
 * during a judgement makes its entry stale at once.
 *
 * Only allowed, unrecorded verdicts are cached: a match still walks the
 * path (the event names it).
 */
#define S_IFMT_ 00170000
#define S_IFREG_ 0100000
#define S_IFDIR_ 0040000
#define S_IFLNK_ 0120000
#define EXT4_SUPER_MAGIC_ 0xEF53
#define XFS_SUPER_MAGIC_ 0x58465342
#define TMPFS_MAGIC_ 0x01021994

enum vc_ctl {
	VC_RULES_GEN = 0, /* agent-owned */
	VC_NAME_GEN = 1,  /* BPF-owned, atomic */
	VC_BUSY = 2,      /* mount-family syscalls running (BPF, atomic) */
	VC_CTL_MAX = 4,
};

enum vc_stat {
	VC_HITS = 0,
	VC_STORES = 1,
	VC_STAT_MAX = 4,
};

struct vc_key {
	__u64 ino;
	__u64 mnt;      /* mnt_id_unique of the file's mount */
	__u64 root_mnt; /* mnt_id_unique of the task root's mount */
	__u64 root_ino; /* the task root's directory */
	__u32 dev;
	__u32 generation; /* i_generation */
	__u32 sandbox_id;
	__u32 ops;
};

struct vc_entry {
	__u64 rules_gen;
	__u64 name_gen;
};

const struct vc_key *unused_vc_key __attribute__((unused));
const struct vc_entry *unused_vc_entry __attribute__((unused));

BS_MAP(bs_vcache, BPF_MAP_TYPE_LRU_HASH, struct vc_key, struct vc_entry, 16384);
BS_MAP(bs_vcache_ctl, BPF_MAP_TYPE_ARRAY, __u32, __u64, VC_CTL_MAX);

/* Hits and stores per CPU (tests check the cache is used). */
BS_MAP(bs_vcache_stats, BPF_MAP_TYPE_PERCPU_ARRAY, __u32, __u64, VC_STAT_MAX);

/* The key and generations of the open being judged, kept in map memory
 * across judge_file: a flag on the stack would double the states the
 * verifier explores there. */
struct vc_pending {
	struct vc_key k;
	struct vc_entry gens;
	__u32 ok;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct vc_pending);
} bs_vcache_pending SEC(".maps");

static __always_inline struct vc_pending *vc_pending(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&bs_vcache_pending, &zero);
}

/* Set while this task runs a mount-family syscall (its share of VC_BUSY). */
BS_TASK_STORAGE(bs_vcache_busy, __u32);

static __always_inline __u64 *vc_ctl(__u32 i)
{
	return bpf_map_lookup_elem(&bs_vcache_ctl, &i);
}

static __always_inline void vc_count(__u32 i)
{
	__u64 *n = bpf_map_lookup_elem(&bs_vcache_stats, &i);
	if (n)
		*n += 1;
}

static __always_inline void vc_bump_names(void)
{
	__u64 *g = vc_ctl(VC_NAME_GEN);
	if (g)
		__sync_fetch_and_add(g, 1);
}

/* The mount-family syscalls (they move, detach or cover mounts, or change
 * a root), by table: i386 numbers when i386, else x86_64 (x32 too). */
static __always_inline bool vc_mount_syscall(long id, bool compat)
{
	if (compat && !(id & X32_SYSCALL_BIT)) {
		switch (id) {
		case 21: case 22: case 52: case 61: case 217: /* mount umount umount2 chroot pivot_root */
		case 428: case 429: case 432: case 442: case 467: /* open_tree move_mount fsmount mount_setattr open_tree_attr */
			return true;
		}
		return false;
	}
	switch (id & ~X32_SYSCALL_BIT) {
	case 155: case 161: case 165: case 166: /* pivot_root chroot mount umount2 */
	case 428: case 429: case 432: case 442: case 467:
		return true;
	}
	return false;
}

static __always_inline void vc_mount_enter(void)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
	__u32 *busy = bpf_task_storage_get(&bs_vcache_busy, task, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	__u64 *b = vc_ctl(VC_BUSY);
	if (busy && b && !*busy) {
		*busy = 1;
		__sync_fetch_and_add(b, 1);
	}
	vc_bump_names();
}

static __always_inline void vc_mount_exit(void)
{
	vc_bump_names();
	struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
	__u32 *busy = bpf_task_storage_get(&bs_vcache_busy, task, 0, 0);
	__u64 *b = vc_ctl(VC_BUSY);
	if (busy && b && *busy) {
		*busy = 0;
		__sync_fetch_and_add(b, -1);
	}
}

/* The key is read with plain loads through BTF pointers (bpf_rdonly_cast,
 * Linux >= 6.2: before 6.8 the cache is off anyway), not a helper call per
 * field: every repeated open of a sandbox pays these reads. */
static __always_inline __u64 vc_mnt_id(struct vfsmount *vm)
{
	struct mount *m = bs_cast((void *)vm - bpf_core_field_offset(struct mount, mnt), struct mount);
	return m->mnt_id_unique;
}

/* vc_prepare fills the key of an open's file and the generations now;
 * false when the verdict may not be cached. */
static __always_inline bool vc_prepare(struct file *fp, __u32 ops, struct sandbox *sb, struct vc_key *k,
				       struct vc_entry *gens)
{
	if (!bpf_core_field_exists(struct mount, mnt_id_unique) || !bpf_ksym_exists(bpf_rdonly_cast))
		return false; /* Linux < 6.8: mount ids are reused */
	__u64 *rg = vc_ctl(VC_RULES_GEN), *ng = vc_ctl(VC_NAME_GEN), *busy = vc_ctl(VC_BUSY);
	if (!rg || !ng || !busy)
		return false;
	gens->rules_gen = *(volatile __u64 *)rg;
	gens->name_gen = *(volatile __u64 *)ng;
	/* Odd: off or rules being written; 0: never set by an agent. */
	if ((gens->rules_gen & 1) || !gens->rules_gen || *(volatile __u64 *)busy)
		return false;
	struct file *file = bs_cast(fp, struct file);
	struct inode *inode = file->f_inode;
	__u32 mode = inode->i_mode & S_IFMT_;
	if (mode == S_IFREG_) {
		if (inode->__i_nlink != 1)
			return false; /* more names than the one judged, or none */
	} else if (mode != S_IFDIR_) {
		return false;
	}
	struct super_block *isb = inode->i_sb;
	unsigned long magic = isb->s_magic;
	if (magic != EXT4_SUPER_MAGIC_ && magic != XFS_SUPER_MAGIC_ && magic != TMPFS_MAGIC_)
		return false;
	struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
	struct fs_struct *fs = task->fs;
	k->ino = inode->i_ino;
	k->mnt = vc_mnt_id(file->f_path.mnt);
	k->root_mnt = vc_mnt_id(fs->root.mnt);
	k->root_ino = fs->root.dentry->d_inode->i_ino;
	k->dev = isb->s_dev;
	k->generation = inode->i_generation;
	k->sandbox_id = sb->id;
	k->ops = ops;
	return true;
}

/* vc_hit reports whether k has an entry valid under gens. */
static __always_inline bool vc_hit(struct vc_key *k, struct vc_entry *gens)
{
	struct vc_entry *e = bpf_map_lookup_elem(&bs_vcache, k);
	if (!e || e->rules_gen != gens->rules_gen || e->name_gen != gens->name_gen)
		return false;
	vc_count(VC_HITS);
	return true;
}

/* vc_store_pending keeps the allowed verdict of the pending open, when it
 * was cacheable and its walk (in the scratch) reached the task's root by
 * dentries that all have names. */
static __always_inline void vc_store_pending(void)
{
	struct vc_pending *vp = vc_pending();
	struct scratch *s = get_scratch();
	if (!vp || !s || !vp->ok)
		return;
	if (s->pw.flags & (PW_F_TRUNCATED | PW_F_DETACHED | PW_F_DISCONNECTED))
		return;
	if (!bpf_map_update_elem(&bs_vcache, &vp->k, &vp->gens, BPF_ANY))
		vc_count(VC_STORES);
}
