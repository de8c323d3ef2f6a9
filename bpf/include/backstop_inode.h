/* Changes of inodes outside writable places (ctime updates). */
#pragma once

/* truncate, chmod, chown, setxattr, utimensat, link, unlink, rename,
 * symlink, mknod, mkdir and O_TRUNC all set the changed inode's ctime (the
 * directory's for entries added or removed), whatever the syscall, entry
 * point or name used. Judged on the inode: the deepest bs_dirs entry among
 * its dentry's ancestors decides, by inode number, so every name of a file
 * is judged alike. Stopped after the fact: the change is made when the
 * process dies.
 */

#define PIPEFS_MAGIC 0x50495045
#define SOCKFS_MAGIC 0x534F434B
#define SYSFS_MAGIC 0x62656572
#define DEVPTS_SUPER_MAGIC 0x1cd1
#define BPF_FS_MAGIC 0xcafe4a11
#define TRACEFS_MAGIC 0x74726163
#define DEBUGFS_MAGIC 0x64626720
#define NSFS_MAGIC 0x6e736673
#define SECURITYFS_MAGIC 0x73636673
#define OVERLAYFS_SUPER_MAGIC 0x794c7630

struct dir_walk {
	struct dentry *d;
	__u32 dev;
	__u32 sandbox_id;
	struct dir_rule found;
	__u32 hit;
	/* On overlayfs over two filesystems a directory's number (drawn by
	 * overlayfs) can be a file's (its layer's) under the same device,
	 * and the agent's entries under an overlay's device are always
	 * directories (stat gives a file's layer device): a file's own
	 * dentry is not looked up there. */
	__u32 overlay;
};

static long dir_walk_step(__u64 i, void *arg)
{
	struct dir_walk *w = arg;
	struct dentry *d = w->d;
	if (!d)
		return 1;
	struct inode *inode = BPF_CORE_READ(d, d_inode);
	if (w->overlay && (BPF_CORE_READ(inode, i_mode) & S_IFMT_) != S_IFDIR_)
		goto up;
	struct dir_key k = {
		.ino = BPF_CORE_READ(inode, i_ino),
		.dev = w->dev,
		.sandbox_id = w->sandbox_id,
	};
	/* An entry of another file with this number is no entry. */
	struct dir_rule *r = bpf_map_lookup_elem(&bs_dirs, &k);
	if (r && !same_generation(r->generation, inode))
		r = NULL;
	if (!r) {
		k.sandbox_id = 0; /* rules of every sandbox */
		r = bpf_map_lookup_elem(&bs_dirs, &k);
		if (r && !same_generation(r->generation, inode))
			r = NULL;
	}
	if (r) {
		w->found = *r;
		w->hit = 1;
		return 1;
	}
up:;
	struct dentry *parent = BPF_CORE_READ(d, d_parent);
	if (parent == d)
		return 1;
	w->d = parent;
	return 0;
}

/* inode_judged carries out a verdict on an inode reached through the
 * dentry start (a change, a notify mark): kill when the verdict says so,
 * then report the file by the path the task would see. */
static __always_inline void inode_judged(struct sandbox *sb, __u64 root, __u32 verdict, __u32 rule_id,
					 struct inode *inode, struct dentry *start, __u32 dev, __s64 nr, __u32 cat)
{
	if (verdict == VERDICT_ALLOWED)
		return;
	if (verdict == VERDICT_KILLED)
		bpf_send_signal(SIGKILL);
	struct scratch *s = get_scratch();
	if (!s)
		return;
	struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
	struct path fp = { .dentry = start, .mnt = NULL };
	struct path troot = BPF_CORE_READ(task, fs, root);
	pw_resolve(&s->pw, &fp, &troot);
	send_file_event(s, verdict, rule_id, root, sb, nr, cat, (struct file_ident){
		.ino = BPF_CORE_READ(inode, i_ino),
		.dev = dev,
		.i_mode = BPF_CORE_READ(inode, i_mode),
	});
}

static __always_inline void inode_changed(struct inode *inode)
{
	/* A directory changed (an entry added, removed or renamed), on any
	 * filesystem and by any task: names may have changed. One without a
	 * dentry is being set up (read from disk, a new /proc entry): no path
	 * runs through it yet. */
	if ((BPF_CORE_READ(inode, i_mode) & S_IFMT_) == S_IFDIR_ && BPF_CORE_READ(inode, i_dentry.first))
		vc_bump_names();
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb)
		return;
	/* Overridden credentials: a filesystem acting for the task on a layer
	 * below (overlayfs writing its upper directory). The change is judged
	 * on the inode the task sees (overlayfs copies the times up). */
	struct task_struct *cur = (struct task_struct *)bpf_get_current_task_btf();
	if (BPF_CORE_READ(cur, cred) != BPF_CORE_READ(cur, real_cred))
		return;
	__u32 mode = BPF_CORE_READ(inode, i_mode) & S_IFMT_;
	if (mode != S_IFREG_ && mode != S_IFDIR_ && mode != S_IFLNK_)
		return;
	if (!BPF_CORE_READ(inode, __i_nlink))
		return; /* unlinked (memfd, O_TMPFILE, deleted): the directory's change decides */
	struct super_block *isb = BPF_CORE_READ(inode, i_sb);
	switch (BPF_CORE_READ(isb, s_magic)) {
	case PROC_SUPER_MAGIC: case SYSFS_MAGIC: case CGROUP_SUPER_MAGIC: case CGROUP2_SUPER_MAGIC:
	case PIPEFS_MAGIC: case SOCKFS_MAGIC: case ANON_INODE_FS_MAGIC: case PIDFS_MAGIC:
	case DEVPTS_SUPER_MAGIC: case BPF_FS_MAGIC: case TRACEFS_MAGIC: case DEBUGFS_MAGIC:
	case NSFS_MAGIC: case SECURITYFS_MAGIC:
		return;
	case OVERLAYFS_SUPER_MAGIC:
		/* Its dentries are not the paths the rules name (a workspace
		 * overlay mounted in the command's own namespace, a container's
		 * root): overlays are judged at open only. */
		return;
	}
	struct dir_walk w = { .dev = BPF_CORE_READ(isb, s_dev), .sandbox_id = sb->id };
	/* Only filesystems mounted where the agent resolved the rules: a
	 * tmpfs a command mounted in its own namespace holds no rule's path. */
	struct dir_key mk = { .dev = w.dev, .sandbox_id = DIR_MOUNTED_SB };
	if (!bpf_map_lookup_elem(&bs_dirs, &mk))
		return;
	struct hlist_node *first = BPF_CORE_READ(inode, i_dentry.first);
	if (!first)
		return;
	w.d = (struct dentry *)((void *)first - bpf_core_field_offset(struct dentry, d_u.d_alias));
	struct dentry *start = w.d;
	bpf_loop(PW_MAX_STEPS, dir_walk_step, &w, 0);
	if (!w.hit) {
		/* The sandbox's write default. */
		struct dir_key dk = { .sandbox_id = sb->id };
		struct dir_rule *r = bpf_map_lookup_elem(&bs_dirs, &dk);
		if (!r)
			return;
		w.found = *r;
	}
	if (w.found.kind == DIR_WRITABLE || !w.found.action)
		return;
	__u32 verdict = backstop_verdict(sb, w.found.action);
	if (verdict == VERDICT_ALLOWED)
		return;
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs((struct task_struct *)bpf_get_current_task_btf());
	__s64 nr = regs ? BPF_CORE_READ(regs, orig_ax) : -1;
	if (in_compat_syscall(nr))
		nr += COMPAT_NR_BASE;
	inode_judged(sb, root, verdict, w.found.rule_id, inode, start, w.dev, nr, CAT_MODIFY);
}

/* Filesystems without multigrain timestamps set ctime here... */
SEC("tp_btf/inode_set_ctime_to_ts")
int BPF_PROG(backstop_ctime_set, struct inode *inode, struct timespec64 *ctime)
{
	inode_changed(inode);
	return 0;
}

/* ...multigrain ones (ext4, xfs, btrfs, tmpfs on Linux >= 6.13) swap it
 * here, or skip the swap when the coarse clock has not moved. */
SEC("tp_btf/ctime_ns_xchg")
int BPF_PROG(backstop_ctime_xchg, struct inode *inode, __u32 old, __u32 new, __u32 cur)
{
	inode_changed(inode);
	return 0;
}

SEC("tp_btf/ctime_xchg_skip")
int BPF_PROG(backstop_ctime_skip, struct inode *inode, struct timespec64 *ctime)
{
	inode_changed(inode);
	return 0;
}
