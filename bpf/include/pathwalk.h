/* Path resolution for tracepoint programs, which may not call bpf_d_path
 * (only sleepable LSM programs may): walk the dentry chain of a struct path
 * up to the task's root, crossing mounts through struct mount like the
 * kernel's prepend_path(), and build the absolute path front to back.
 *
 * The result is what d_path() would print for the task: relative to its
 * root (chroot, container), with symlinks, "..", /proc/self/root and bind
 * mounts already resolved by the kernel, because we start from the file.
 */
#pragma once

#include "common.h"

/* Components collected per path (leaf first); deeper paths are marked
 * truncated. A power of two so the index can be masked for the verifier. */
#define PW_MAX_NAMES 32
/* Loop bound: components plus mount crossings. */
#define PW_MAX_STEPS 48
/* Result buffer: PW_HALF bytes of path plus room for one more component
 * read, so every bounded read stays inside the buffer. */
#define PW_HALF 256
#define PW_BUF (2 * PW_HALF)

#define PW_F_TRUNCATED 1 /* too deep or too long: a suffix is missing */
#define PW_F_DETACHED 2  /* reached a root that is not the task's root */
#define PW_F_DISCONNECTED 4 /* a dentry without parent below its mount's root (open_by_handle_at) */

#define pw_barrier_var(var) asm volatile("" : "+r"(var))

struct pathwalk {
	__u64 names[PW_MAX_NAMES]; /* const unsigned char * (u64: bpf2go has no pointers) */
	char buf[PW_BUF];
	__u32 len;   /* strlen(buf) */
	__u32 flags; /* PW_F_* */
};


/* Field offsets are resolved (CO-RE) in the caller and passed in: the
 * bpf_loop callbacks read plain offsets. */
struct pw_walk_ctx {
	struct pathwalk *pw;
	void *d;
	void *vm;
	void *m;
	void *root_d;
	void *root_vm;
	__u32 n;
	__u32 off;
	__u32 o_d_parent, o_d_name, o_mnt_root, o_mnt_parent, o_mnt_mountpoint, o_mount_mnt;
};

static __always_inline void *pw_ptr_at(void *base, __u32 off)
{
	void *v = NULL;
	bpf_probe_read_kernel(&v, sizeof(v), base + off);
	return v;
}

/* One step up: a component, or a crossing to the parent mount. Returns 1
 * to stop. bpf_loop callbacks are verified once, whatever the bound. */
static long pw_walk_step(__u64 i, void *arg)
{
	struct pw_walk_ctx *c = arg;
	struct pathwalk *pw = c->pw;
	void *d = c->d;

	if (!d)
		return 1;
	if (d == c->root_d && c->vm == c->root_vm)
		return 1;
	void *parent = pw_ptr_at(d, c->o_d_parent);
	void *mnt_root = pw_ptr_at(c->vm, c->o_mnt_root);
	if (d == mnt_root || d == parent) {
		if (d != mnt_root)
			pw->flags |= PW_F_DISCONNECTED;
		void *mp = pw_ptr_at(c->m, c->o_mnt_parent);
		if (mp && c->m != mp) {
			/* Continue from the mount point in the parent mount. */
			c->d = pw_ptr_at(c->m, c->o_mnt_mountpoint);
			c->m = mp;
			c->vm = mp + c->o_mount_mnt;
			return 0;
		}
		/* Global root of a mount tree the task's root is not in (a
		 * detached mount, or a file of another namespace). */
		if (d != c->root_d)
			pw->flags |= PW_F_DETACHED;
		return 1;
	}
	if (c->n >= PW_MAX_NAMES) {
		pw->flags |= PW_F_TRUNCATED;
		return 1;
	}
	pw->names[c->n & (PW_MAX_NAMES - 1)] = (__u64)pw_ptr_at(d, c->o_d_name);
	c->n++;
	c->d = parent;
	if (i == PW_MAX_STEPS - 1)
		pw->flags |= PW_F_TRUNCATED;
	return 0;
}

/* Appends "/" and component n-1-j. */
static long pw_build_step(__u64 j, void *arg)
{
	struct pw_walk_ctx *c = arg;
	struct pathwalk *pw = c->pw;
	__u32 off = c->off;

	if (j >= c->n)
		return 1;
	if (off >= PW_HALF - 2) {
		pw->flags |= PW_F_TRUNCATED;
		return 1;
	}
	pw->buf[off & (PW_HALF - 1)] = '/';
	off++;
	const unsigned char *name = (const unsigned char *)pw->names[(c->n - 1 - j) & (PW_MAX_NAMES - 1)];
	long r = bpf_probe_read_kernel_str(&pw->buf[off & (PW_HALF - 1)], PW_HALF, name);
	if (r <= 1) {
		c->off = off;
		return 1;
	}
	c->off = off + r - 1;
	return 0;
}

/* pw_resolve writes the path of p, relative to the root path, into
 * pw->buf. */
static __always_inline void pw_resolve(struct pathwalk *pw, struct path *p, struct path *root)
{
	struct pw_walk_ctx c = {
		.pw = pw,
		.d = BPF_CORE_READ(p, dentry),
		.vm = BPF_CORE_READ(p, mnt),
		.root_d = BPF_CORE_READ(root, dentry),
		.root_vm = BPF_CORE_READ(root, mnt),
		.o_d_parent = bpf_core_field_offset(struct dentry, d_parent),
		.o_d_name = bpf_core_field_offset(struct dentry, d_name) + bpf_core_field_offset(struct qstr, name),
		.o_mnt_root = bpf_core_field_offset(struct vfsmount, mnt_root),
		.o_mnt_parent = bpf_core_field_offset(struct mount, mnt_parent),
		.o_mnt_mountpoint = bpf_core_field_offset(struct mount, mnt_mountpoint),
		.o_mount_mnt = bpf_core_field_offset(struct mount, mnt),
	};
	c.m = c.vm - c.o_mount_mnt;
	pw->flags = 0;
	bpf_loop(PW_MAX_STEPS, pw_walk_step, &c, 0);
	bpf_loop(PW_MAX_NAMES, pw_build_step, &c, 0);

	__u32 off = c.off;
	if (off >= PW_HALF) {
		pw->flags |= PW_F_TRUNCATED;
		off = PW_HALF - 1;
	}
	if (off == 0) {
		pw->buf[0] = '/';
		off = 1;
	}
	pw->buf[off & (PW_BUF - 1)] = 0;
	pw->len = off;
}

/* pw_resolve_file resolves file's path relative to the current task's root. */
static __always_inline void pw_resolve_file(struct pathwalk *pw, struct file *file)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
	struct path root = BPF_CORE_READ(task, fs, root);
	struct path fp = BPF_CORE_READ(file, f_path);
	pw_resolve(pw, &fp, &root);
}

/* pw_fd_file returns the current task's open file at fd, or NULL. */
static __always_inline struct file *pw_fd_file(long fd)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
	struct fdtable *fdt = BPF_CORE_READ(task, files, fdt);
	if (!fdt || fd < 0)
		return NULL;
	unsigned int max = BPF_CORE_READ(fdt, max_fds);
	if ((unsigned long)fd >= max)
		return NULL;
	struct file **fds = BPF_CORE_READ(fdt, fd);
	struct file *f = NULL;
	bpf_probe_read_kernel(&f, sizeof(f), &fds[fd]);
	return f;
}
