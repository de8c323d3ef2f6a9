/* Files judged as a whole by an op rule: notify marks, mq_unlink. */
#pragma once

/* Paths where a sandbox may put an inotify or fanotify mark: its
 * workspaces (same LPM layout as lsm_path_rules; a key ending in "/"
 * covers the tree, one ending in NUL that path). Judged only when the
 * sandbox has a LSM_OP_NOTIFY_MARK rule. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 4096);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct path_key);
	__type(value, struct decision);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lsm_notify_paths SEC(".maps");

#define FSNOTIFY_OBJ_SB 2

/* file_op_begin fills c and op's decision d for a file judged as a whole
 * by an op rule; false when there is nothing to judge. */
static __always_inline bool file_op_begin(struct file_ctx *c, __u32 op, struct decision *d)
{
	if (!file_begin(c))
		return false;
	*d = op_decision(c->sb->id, op, ACTION_ALLOW);
	return d->action != ACTION_ALLOW;
}

/* A mark sees what other processes do to the file (fanotify's permission
 * events even hold their opens): on a file outside the workspaces it reads
 * a host process's secrets as they are opened. A filesystem-wide mark
 * (FAN_MARK_FILESYSTEM) sees every file of the filesystem: refused
 * wherever it is put. */
static __always_inline int decide_path_notify(__u32 mech, const struct path *path, unsigned int obj_type, int ret)
{
	if (ret)
		return ret;
	struct file_ctx c;
	struct decision d;
	if (!file_op_begin(&c, LSM_OP_NOTIFY_MARK, &d))
		return 0;
	struct path p = { .mnt = BPF_CORE_READ(path, mnt), .dentry = BPF_CORE_READ(path, dentry) };
	bool truncated = key_from_walk(c.key, c.pw, &p);
	c.key->sandbox_id = c.sb->id;
	if (obj_type != FSNOTIFY_OBJ_SB && bpf_map_lookup_elem(&lsm_notify_paths, c.key))
		return 0;
	struct file_facts f;
	facts_of(&f, BPF_CORE_READ(p.dentry, d_inode), BPF_CORE_READ(p.dentry, d_sb));
	return emit_file(EV_FILE_OP + mech, &c, d.action, d.rule_id, &f, obj_type, 0, MATCH_NOTIFY,
			 truncated ? FILE_F_TRUNCATED : 0, PATH_OP_NOTIFY);
}
WATCHER_HOOK(path_notify, security_path_notify, decide_path_notify(mech, path, obj_type, ret),
	     const struct path *path, __u64 mask, unsigned int obj_type, int ret)

/* mq_unlink(2) removes a queue by name without opening it (vfs_unlink:
 * inode_unlink, no path_unlink): a queue the caller's sandbox did not
 * create is judged by the other-IPC rule. */
static __always_inline int decide_inode_unlink(__u32 mech, struct inode *dir, struct dentry *dentry, int ret)
{
	if (ret || BPF_CORE_READ(dir, i_sb, s_magic) != MQUEUE_MAGIC)
		return ret;
	struct file_ctx c;
	struct decision d;
	if (!file_op_begin(&c, LSM_OP_OTHER_IPC, &d))
		return 0;
	struct file_facts f;
	facts_of(&f, BPF_CORE_READ(dentry, d_inode), BPF_CORE_READ(dir, i_sb));
	struct mq_key k = { .dev = f.dev, .ino = f.ino };
	struct ipc_owner *own = bpf_map_lookup_elem(&lsm_mq_owner, &k);
	if (own && own->sandbox_cg == c.root)
		return 0;
	bpf_probe_read_kernel_str(c.key->path, sizeof(c.key->path), BPF_CORE_READ(dentry, d_name.name));
	return emit_file(EV_FILE_OP + mech, &c, d.action, d.rule_id, &f, 0, 0, MATCH_OTHER_IPC, 0, PATH_OP_UNLINK);
}
WATCHER_HOOK(inode_unlink, security_inode_unlink, decide_inode_unlink(mech, dir, dentry, ret),
	     struct inode *dir, struct dentry *dentry, int ret)
