/* The mount family: mount, umount, move_mount, pivot_root, chroot, fsconfig. */
#pragma once

/* mount_begin reserves the event of a mount operation judged in c. */
static __always_inline struct mount_event *mount_begin(__u32 mech, __u32 op, struct op_ctx *c, __u32 *verdict)
{
	*verdict = effective_verdict(c->sb, c->d.action);
	struct mount_event *e = reserve_event(sizeof(*e), true);
	if (!e)
		return NULL;
	fill_hdr(&e->hdr, EV_MOUNT + mech, *verdict, c->d.rule_id, c->root, c->sb);
	e->op = op;
	e->flags = 0;
	e->source[0] = 0;
	e->fstype[0] = 0;
	e->target[0] = 0;
	return e;
}

/* mount_end submits e (when reserved) and returns the hook's result. */
static __always_inline int mount_end(struct mount_event *e, __u32 verdict)
{
	if (e)
		submit_event(e, true);
	return conclude(verdict);
}

static __always_inline int decide_sb_mount(__u32 mech, const char *dev_name, const struct path *path,
					   const char *type, unsigned long flags, int ret)
{
	struct op_ctx c;
	if (ret || !op_begin(&c, LSM_OP_MOUNT))
		return ret;
	__u32 verdict;
	struct mount_event *e = mount_begin(mech, LSM_OP_MOUNT, &c, &verdict);
	if (e) {
		e->flags = flags;
		if (dev_name)
			bpf_probe_read_kernel_str(e->source, sizeof(e->source), dev_name);
		if (type)
			bpf_probe_read_kernel_str(e->fstype, sizeof(e->fstype), type);
		struct path p = { .mnt = BPF_CORE_READ(path, mnt), .dentry = BPF_CORE_READ(path, dentry) };
		walk_path(&p, e->target, sizeof(e->target));
	}
	return mount_end(e, verdict);
}
WATCHER_HOOK(sb_mount, security_sb_mount, decide_sb_mount(mech, dev_name, path, type, flags, ret),
	     const char *dev_name, const struct path *path, const char *type, unsigned long flags, void *data, int ret)

static __always_inline int decide_sb_umount(__u32 mech, struct vfsmount *mnt, int flags, int ret)
{
	struct op_ctx c;
	if (ret || !op_begin(&c, LSM_OP_UMOUNT))
		return ret;
	__u32 verdict;
	struct mount_event *e = mount_begin(mech, LSM_OP_UMOUNT, &c, &verdict);
	if (e) {
		struct path p = { .mnt = mnt, .dentry = BPF_CORE_READ(mnt, mnt_root) };
		e->flags = (__u32)flags;
		walk_path(&p, e->target, sizeof(e->target));
		bpf_probe_read_kernel_str(e->fstype, sizeof(e->fstype),
					  BPF_CORE_READ(mnt, mnt_sb, s_type, name));
	}
	return mount_end(e, verdict);
}
WATCHER_HOOK(sb_umount, security_sb_umount, decide_sb_umount(mech, mnt, flags, ret),
	     struct vfsmount *mnt, int flags, int ret)

/* two_path_mount judges the mount operations that name a source and a
 * target path (move_mount, pivot_root); chroot names only a target. */
static __always_inline int two_path_mount(__u32 mech, __u32 op, const struct path *src_path,
					  const struct path *dst_path, int ret)
{
	struct op_ctx c;
	if (ret || !op_begin(&c, op))
		return ret;
	__u32 verdict;
	struct mount_event *e = mount_begin(mech, op, &c, &verdict);
	if (e) {
		if (src_path) {
			struct path src = { .mnt = BPF_CORE_READ(src_path, mnt), .dentry = BPF_CORE_READ(src_path, dentry) };
			walk_path(&src, e->source, sizeof(e->source));
		}
		struct path dst = { .mnt = BPF_CORE_READ(dst_path, mnt), .dentry = BPF_CORE_READ(dst_path, dentry) };
		walk_path(&dst, e->target, sizeof(e->target));
	}
	return mount_end(e, verdict);
}
WATCHER_HOOK(move_mount, security_move_mount, two_path_mount(mech, LSM_OP_MOVE_MOUNT, from_path, to_path, ret),
	     const struct path *from_path, const struct path *to_path, int ret)
WATCHER_HOOK(sb_pivotroot, security_sb_pivotroot, two_path_mount(mech, LSM_OP_PIVOT_ROOT, old_path, new_path, ret),
	     const struct path *old_path, const struct path *new_path, int ret)
WATCHER_HOOK(path_chroot, security_path_chroot, two_path_mount(mech, LSM_OP_CHROOT, NULL, path, ret),
	     const struct path *path, int ret)

/* The new mount API: fsopen(2) has no hook, but every fsconfig(2)
 * parameter passes here, and move_mount(2) (above) is the only way to
 * attach what fsmount(2) returns. */
static __always_inline int decide_fs_context_parse_param(__u32 mech, struct fs_context *fc,
							 struct fs_parameter *param, int ret)
{
	/* -ENOPARAM from an earlier LSM means "not mine": keep judging. */
	struct op_ctx c;
	if ((ret && ret != -519) || !op_begin(&c, LSM_OP_FSCONFIG))
		return ret;
	__u32 verdict;
	struct mount_event *e = mount_begin(mech, LSM_OP_FSCONFIG, &c, &verdict);
	if (e) {
		bpf_probe_read_kernel_str(e->fstype, sizeof(e->fstype), BPF_CORE_READ(fc, fs_type, name));
		bpf_probe_read_kernel_str(e->source, sizeof(e->source), BPF_CORE_READ(param, key));
		if (BPF_CORE_READ_BITFIELD_PROBED(param, type) == fs_value_is_string)
			bpf_probe_read_kernel_str(e->target, sizeof(e->target), BPF_CORE_READ(param, string));
	}
	int r = mount_end(e, verdict);
	return r ? r : ret;
}
WATCHER_HOOK(fs_context_parse_param, security_fs_context_parse_param,
	     decide_fs_context_parse_param(mech, fc, param, ret),
	     struct fs_context *fc, struct fs_parameter *param, int ret)
