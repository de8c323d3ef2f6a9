/* inotify marks outside the sandbox's writable places. */
#pragma once

/* A mark tells when a file is opened, read or written and which names are
 * made in a directory. Without the LSM's path_notify hook, the mark
 * inotify_add_watch just added (the head of its group's list) is judged
 * when the call returns, on its inode, by inode_changed's walk: a mark outside
 * the writable places kills the caller, and the mark dies with its inotify
 * descriptor (unless the descriptor was passed on first). */
#define FSNOTIFY_OBJ_TYPE_INODE_ 0

/* mark_inode is the inode a mark's connector is attached to, checked
 * against the inode's own pointer to that connector (the connector's
 * object is the inode since Linux 6.10, the inode's i_fsnotify_marks
 * before): NULL when neither holds. */
static __always_inline struct inode *mark_inode(struct fsnotify_mark_connector *conn)
{
	void *obj = BPF_CORE_READ(conn, obj);
	if (!obj)
		return NULL;
	struct inode *inode = obj;
	if (BPF_CORE_READ(inode, i_fsnotify_marks) == conn)
		return inode;
	void *held = NULL;
	bpf_probe_read_kernel(&held, sizeof(held), obj);
	if (held == conn)
		return (struct inode *)(obj - bpf_core_field_offset(struct inode, i_fsnotify_marks));
	return NULL;
}

static __always_inline void notify_mark_added(struct pt_regs *regs)
{
	if (!any_category(CAT_NOTIFY_MARK))
		return;
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb)
		return;
	__u32 rule_id = 0;
	__u32 action = sandbox_category(sb->id, CAT_NOTIFY_MARK, &rule_id);
	if (!action)
		return;
	struct file *f = pw_fd_file((long)BPF_CORE_READ(regs, di));
	if (!f)
		return;
	struct fsnotify_group *group = BPF_CORE_READ(f, private_data);
	if (!group)
		return;
	struct list_head *first = BPF_CORE_READ(group, marks_list.next);
	if (!first || first == &group->marks_list)
		return;
	struct fsnotify_mark *mark = (struct fsnotify_mark *)((void *)first - bpf_core_field_offset(struct fsnotify_mark, g_list));
	struct fsnotify_mark_connector *conn = BPF_CORE_READ(mark, connector);
	if (!conn || BPF_CORE_READ_BITFIELD_PROBED(conn, type) != FSNOTIFY_OBJ_TYPE_INODE_)
		return;
	struct inode *inode = mark_inode(conn);
	if (!inode)
		return;
	struct super_block *isb = BPF_CORE_READ(inode, i_sb);
	struct dir_walk w = { .dev = BPF_CORE_READ(isb, s_dev), .sandbox_id = sb->id,
			      .overlay = BPF_CORE_READ(isb, s_magic) == OVERLAYFS_SUPER_MAGIC };
	struct hlist_node *alias = BPF_CORE_READ(inode, i_dentry.first);
	if (!alias)
		return;
	w.d = (struct dentry *)((void *)alias - bpf_core_field_offset(struct dentry, d_u.d_alias));
	struct dentry *start = w.d;
	/* Only filesystems mounted where the agent resolved the rules (as
	 * for changes: a tmpfs of the command's own holds no rule's path). */
	struct dir_key mk = { .dev = w.dev, .sandbox_id = DIR_MOUNTED_SB };
	if (!bpf_map_lookup_elem(&bs_dirs, &mk))
		return;
	bpf_loop(PW_MAX_STEPS, dir_walk_step, &w, 0);
	if (w.hit && w.found.kind == DIR_WRITABLE)
		return;
	inode_judged(sb, root, backstop_verdict(sb, action), rule_id, inode, start, w.dev, NR_inotify_add_watch, CAT_NOTIFY_MARK);
}
