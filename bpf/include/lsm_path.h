/* Path operations: changing data without opening for write. */
#pragma once

/* Each is judged by the file write rules, the tables file_open uses, on
 * the path the operation changes (a new name's path is its parent's plus
 * the name: the negative dentry already hangs below the parent). The path
 * walk of pathwalk.h works under both mechanisms. */
enum path_op {
	PATH_OP_TRUNCATE = 1,    /* truncate, ftruncate, open(O_TRUNC) with any access mode */
	PATH_OP_CREATE = 2,      /* mknod(2), and open(O_CREAT) creating a file */
	PATH_OP_MKDIR = 3,
	PATH_OP_UNLINK = 4,
	PATH_OP_RMDIR = 5,
	PATH_OP_SYMLINK = 6,     /* the new symlink's name */
	PATH_OP_LINK_SOURCE = 7, /* the file a hard link would give another name: read and write rules */
	PATH_OP_LINK = 8,        /* the new name */
	PATH_OP_RENAME_FROM = 9,
	PATH_OP_RENAME_TO = 10,
	PATH_OP_CHMOD = 11,
	PATH_OP_CHOWN = 12,
	PATH_OP_SETXATTR = 13,
	PATH_OP_REMOVEXATTR = 14,
	PATH_OP_EXEC = 15,       /* a file execve runs: the binary, then a script's interpreter */
	PATH_OP_MMAP_EXEC = 16,  /* a file mapped executable (ld.so /tmp/x, a preloaded library) */
	PATH_OP_UTIMES = 17,     /* utimensat, utimes, futimesat: the times alone */
	PATH_OP_NOTIFY = 18,     /* an inotify or fanotify mark (path_notify) */
};

/* judge_path judges op on the file at {mnt, dentry} (dentry may be
 * negative: a name about to be created). read_too adds the read rules
 * (strictest wins): a new name for a file is a way to read it too. */
static __always_inline int judge_path(__u32 mech, __u32 op, struct vfsmount *mnt, struct dentry *dentry, bool read_too)
{
	struct file_ctx c;
	if (!file_begin(&c))
		return 0;
	struct path p = { .mnt = mnt, .dentry = dentry };
	bool truncated = key_from_walk(c.key, c.pw, &p);
	struct file_facts f;
	facts_of(&f, BPF_CORE_READ(dentry, d_inode), BPF_CORE_READ(dentry, d_sb));

	struct file_verdict v = {};
	judge_file_rules(&v, c.sb->id, c.key, &f, true, read_too);
	if (v.action == ACTION_ALLOW)
		return 0;
	return emit_file(EV_FILE_OP + mech, &c, v.action, v.rule_id, &f, 0, 0, v.match,
			 FILE_F_WRITE | (truncated ? FILE_F_TRUNCATED : 0), op);
}

static __always_inline int judge_path_at(__u32 mech, __u32 op, const struct path *path, int ret)
{
	if (ret)
		return ret;
	return judge_path(mech, op, BPF_CORE_READ(path, mnt), BPF_CORE_READ(path, dentry), false);
}

/* judge_entry judges a name in dir (existing or about to be created). */
static __always_inline int judge_entry(__u32 mech, __u32 op, const struct path *dir, struct dentry *dentry, int ret)
{
	if (ret)
		return ret;
	return judge_path(mech, op, BPF_CORE_READ(dir, mnt), dentry, false);
}

/* 6.1 truncates through path_truncate for truncate(2), ftruncate(2) and
 * open(O_TRUNC); from 6.2 the last two go through file_truncate. */
WATCHER_HOOK(path_truncate, security_path_truncate, judge_path_at(mech, PATH_OP_TRUNCATE, path, ret),
	     const struct path *path, int ret)

static __always_inline int decide_file_truncate(__u32 mech, struct file *file, int ret)
{
	if (ret)
		return ret;
	return judge_path(mech, PATH_OP_TRUNCATE, BPF_CORE_READ(file, f_path.mnt), BPF_CORE_READ(file, f_path.dentry), false);
}
WATCHER_HOOK(file_truncate, security_file_truncate, decide_file_truncate(mech, file, ret), struct file *file, int ret)

/* open(O_CREAT) of a name that does not exist calls path_mknod too
 * (may_o_create), whatever the access mode. */
WATCHER_HOOK(path_mknod, security_path_mknod, judge_entry(mech, PATH_OP_CREATE, dir, dentry, ret),
	     const struct path *dir, struct dentry *dentry, umode_t mode, unsigned int dev, int ret)
WATCHER_HOOK(path_mkdir, security_path_mkdir, judge_entry(mech, PATH_OP_MKDIR, dir, dentry, ret),
	     const struct path *dir, struct dentry *dentry, umode_t mode, int ret)
WATCHER_HOOK(path_unlink, security_path_unlink, judge_entry(mech, PATH_OP_UNLINK, dir, dentry, ret),
	     const struct path *dir, struct dentry *dentry, int ret)
WATCHER_HOOK(path_rmdir, security_path_rmdir, judge_entry(mech, PATH_OP_RMDIR, dir, dentry, ret),
	     const struct path *dir, struct dentry *dentry, int ret)
WATCHER_HOOK(path_symlink, security_path_symlink, judge_entry(mech, PATH_OP_SYMLINK, dir, dentry, ret),
	     const struct path *dir, struct dentry *dentry, const char *old_name, int ret)

/* A hard link stays on one mount (EXDEV otherwise): the source's mount is
 * the new directory's. */
static __always_inline int decide_path_link(__u32 mech, struct dentry *old_dentry, const struct path *new_dir,
					    struct dentry *new_dentry, int ret)
{
	if (ret)
		return ret;
	struct vfsmount *mnt = BPF_CORE_READ(new_dir, mnt);
	int r = judge_path(mech, PATH_OP_LINK_SOURCE, mnt, old_dentry, true);
	if (r)
		return r;
	return judge_path(mech, PATH_OP_LINK, mnt, new_dentry, false);
}
WATCHER_HOOK(path_link, security_path_link, decide_path_link(mech, old_dentry, new_dir, new_dentry, ret),
	     struct dentry *old_dentry, const struct path *new_dir, struct dentry *new_dentry, int ret)

/* Both names are judged: moving a protected file away, and replacing one
 * (RENAME_EXCHANGE swaps both). */
static __always_inline int decide_path_rename(__u32 mech, const struct path *old_dir, struct dentry *old_dentry,
					      const struct path *new_dir, struct dentry *new_dentry, int ret)
{
	if (ret)
		return ret;
	int r = judge_path(mech, PATH_OP_RENAME_FROM, BPF_CORE_READ(old_dir, mnt), old_dentry, false);
	if (r)
		return r;
	return judge_path(mech, PATH_OP_RENAME_TO, BPF_CORE_READ(new_dir, mnt), new_dentry, false);
}
WATCHER_HOOK(path_rename, security_path_rename, decide_path_rename(mech, old_dir, old_dentry, new_dir, new_dentry, ret),
	     const struct path *old_dir, struct dentry *old_dentry, const struct path *new_dir,
	     struct dentry *new_dentry, unsigned int flags, int ret)

WATCHER_HOOK(path_chmod, security_path_chmod, judge_path_at(mech, PATH_OP_CHMOD, path, ret),
	     const struct path *path, umode_t mode, int ret)
WATCHER_HOOK(path_chown, security_path_chown, judge_path_at(mech, PATH_OP_CHOWN, path, ret),
	     const struct path *path, unsigned int uid, unsigned int gid, int ret)

/* The xattr hooks get a dentry without its mount: walk from the
 * superblock's first mount, which names the file where it was first
 * mounted (a bind mount elsewhere reports the original path, which is
 * what the rules name). */
struct super_block___list {
	struct list_head s_mounts;
} __attribute__((preserve_access_index));

struct mount___list {
	struct list_head mnt_instance;
} __attribute__((preserve_access_index));

static __always_inline int judge_dentry(__u32 mech, __u32 op, struct dentry *dentry, int ret)
{
	if (ret)
		return ret;
	struct super_block *s = BPF_CORE_READ(dentry, d_sb);
	void *m;
	if (bpf_core_field_exists(struct mount, mnt_next_for_sb)) {
		/* 6.13+: s_mounts points at the first mount. */
		m = BPF_CORE_READ(s, s_mounts);
	} else {
		/* Before: a list of struct mount through mnt_instance. */
		struct super_block___list *sl = (void *)s;
		void *first = BPF_CORE_READ(sl, s_mounts.next);
		m = first - bpf_core_field_offset(struct mount___list, mnt_instance);
	}
	if (!m)
		return 0;
	struct vfsmount *mnt = (struct vfsmount *)(m + bpf_core_field_offset(struct mount, mnt));
	return judge_path(mech, op, mnt, dentry, false);
}
/* The first argument is a user namespace on 6.1, an idmap from 6.3: unused. */
WATCHER_HOOK(inode_setxattr, security_inode_setxattr, judge_dentry(mech, PATH_OP_SETXATTR, dentry, ret),
	     void *idmap, struct dentry *dentry, const char *name, const void *value, size_t size, int flags, int ret)
WATCHER_HOOK(inode_removexattr, security_inode_removexattr, judge_dentry(mech, PATH_OP_REMOVEXATTR, dentry, ret),
	     void *idmap, struct dentry *dentry, const char *name, int ret)

/* From include/linux/fs.h (struct iattr's ia_valid). */
#define ATTR_MODE (1 << 0)
#define ATTR_UID (1 << 1)
#define ATTR_GID (1 << 2)
#define ATTR_SIZE (1 << 3)
#define ATTR_ATIME (1 << 4)
#define ATTR_MTIME (1 << 5)

/* utimensat(2), utimes(2) and futimesat(2) reach no path hook: only
 * notify_change's inode_setattr. Judged when the times change and nothing
 * a path hook judged already does (chmod, chown, truncate set ATTR_MODE,
 * ATTR_UID/GID, ATTR_SIZE). The arguments moved across kernels: 6.1's LSM
 * hook is (dentry, attr) while its security_inode_setattr is (userns,
 * dentry, attr); from 6.9 both are (idmap, dentry, attr). So they are read
 * by count. The previous program's return value is not read (see bpf). */
static __always_inline int decide_inode_setattr(__u32 mech, void *ctx)
{
	__u64 d = 0, a = 0;
	__u32 first = bpf_get_func_arg_cnt(ctx) >= 3 ? 1 : 0;
	if (bpf_get_func_arg(ctx, first, &d) || bpf_get_func_arg(ctx, first + 1, &a) || !d || !a)
		return 0;
	unsigned int valid = BPF_CORE_READ((struct iattr *)a, ia_valid);
	if (!(valid & (ATTR_ATIME | ATTR_MTIME)) || (valid & (ATTR_MODE | ATTR_UID | ATTR_GID | ATTR_SIZE)))
		return 0;
	return judge_dentry(mech, PATH_OP_UTIMES, (struct dentry *)d, 0);
}
WATCHER_HOOK(inode_setattr, security_inode_setattr, decide_inode_setattr(mech, ctx), void *first_arg)
