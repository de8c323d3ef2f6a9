/* BTF pointers from plain addresses: plain loads instead of a helper call per field. */
#pragma once

/* bpf_rdonly_cast (Linux >= 6.2) turns an address read from kernel memory
 * (a file in a descriptor table, a mount around its vfsmount) into a
 * pointer the verifier lets the program load through, each load a single
 * instruction that reads 0 on a fault, where bpf_probe_read_kernel costs a
 * helper call. Weak: on older kernels the callers keep their probe reads. */
extern void *bpf_rdonly_cast(const void *obj__ign, __u32 btf_id__k) __ksym __weak;

#define bs_cast(ptr, type) ((type *)bpf_rdonly_cast((ptr), bpf_core_type_id_kernel(type)))

/* bs_fd_file is pw_fd_file with plain loads down to the descriptor table
 * (the current task and its tables are BTF pointers already): one probe
 * read, of the slot. */
static __always_inline struct file *bs_fd_file(long fd)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
	struct fdtable *fdt = task->files->fdt;
	if (!fdt || fd < 0)
		return NULL;
	if ((unsigned long)fd >= fdt->max_fds)
		return NULL;
	struct file **fds = fdt->fd;
	struct file *f = NULL;
	bpf_probe_read_kernel(&f, sizeof(f), &fds[fd]);
	return f;
}

/* bs_outside_now reports that the current task's cgroup is known to be in
 * no sandbox under the sandbox set's current generation: the entry
 * lookup_sandbox_cg (common.h) keeps, read without the helper call for the
 * cgroup id (the same cgroup: task->cgroups->dfl_cgrp, by plain loads).
 * false when not known: the caller looks the sandbox up. */
static __always_inline bool bs_outside_now(void)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
	__u64 cg = task->cgroups->dfl_cgrp->kn->id;
	__u32 zero = 0;
	__u64 *genp = bpf_map_lookup_elem(&sandbox_gen, &zero);
	struct membership *m = bpf_map_lookup_elem(&membership_cache, &cg);
	return genp && m && m->gen == *genp && !m->sandbox_cg;
}
