/* Kernel code: modules, kexec, firmware. */
#pragma once

/* walk_path writes p's path relative to the current task's root into dst
 * (size bytes, NUL-terminated) using the per-CPU path walk. Works in every
 * hook, unlike bpf_d_path (see lsm_hook.h). */
static __always_inline void walk_path(struct path *p, char *dst, __u32 size)
{
	__u32 zero = 0;
	struct pathwalk *pw = bpf_map_lookup_elem(&lsm_pw_scratch, &zero);
	dst[0] = 0;
	if (!pw || !p)
		return;
	struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
	struct path root = BPF_CORE_READ(task, fs, root);
	pw_resolve(pw, p, &root);
	bpf_probe_read_kernel_str(dst, size, pw->buf);
}

/* judge_module reports a kernel-code load judged in c (file: what is
 * read, NULL for a buffer) and returns the hook's result. */
static __always_inline int judge_module(__u32 mech, __u32 op, struct op_ctx *c, struct file *file, __u32 id)
{
	__u32 verdict = effective_verdict(c->sb, c->d.action);
	struct module_event *e = reserve_event(sizeof(*e), true);
	if (e) {
		fill_hdr(&e->hdr, EV_MODULE + mech, verdict, c->d.rule_id, c->root, c->sb);
		e->op = op;
		e->id = id;
		e->path[0] = 0;
		if (file) {
			struct path fp = BPF_CORE_READ(file, f_path);
			walk_path(&fp, e->path, sizeof(e->path));
		}
		submit_event(e, true);
	}
	return conclude(verdict);
}

static __always_inline int decide_kernel_read_file(__u32 mech, struct file *file, enum kernel_read_file_id id, int ret)
{
	struct op_ctx c;
	if (ret || !op_begin(&c, LSM_OP_KERNEL_READ_FILE))
		return ret;
	return judge_module(mech, LSM_OP_KERNEL_READ_FILE, &c, file, (__u32)id);
}
WATCHER_HOOK(kernel_read_file, security_kernel_read_file, decide_kernel_read_file(mech, file, id, ret),
	     struct file *file, enum kernel_read_file_id id, bool contents, int ret)

static __always_inline int decide_kernel_load_data(__u32 mech, enum kernel_load_data_id id, int ret)
{
	struct op_ctx c;
	if (ret || !op_begin(&c, LSM_OP_KERNEL_LOAD_DATA))
		return ret;
	return judge_module(mech, LSM_OP_KERNEL_LOAD_DATA, &c, NULL, (__u32)id);
}
WATCHER_HOOK(kernel_load_data, security_kernel_load_data, decide_kernel_load_data(mech, id, ret),
	     enum kernel_load_data_id id, bool contents, int ret)
