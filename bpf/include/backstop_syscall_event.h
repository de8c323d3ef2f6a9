/* Syscall events: the strings a call names, its target, the send. */
#pragma once

/* fill_strings records the paths and names a syscall's arguments point to,
 * as the caller passed them, plus the cwd when a path is relative. */
static __always_inline void fill_strings(struct scratch *s, struct syscall_event *e, long nr, __u64 *a)
{
	const char *target = NULL, *aux = NULL, *fstype = NULL;
	long fd = -1;

	switch (nr) {
	case 165: /* mount(source, target, fstype, flags, data) */
		target = (const char *)a[1];
		aux = (const char *)a[0];
		fstype = (const char *)a[2];
		break;
	case 166: /* umount2(target, flags) */
	case 161: /* chroot(path) */
	case 155: /* pivot_root(new_root, put_old) */
		target = (const char *)a[0];
		break;
	case 429: /* move_mount(from_dfd, from_path, to_dfd, to_path, flags) */
		target = (const char *)a[3];
		aux = (const char *)a[1];
		break;
	case 428: /* open_tree(dfd, path, flags) */
	case 442: /* mount_setattr(dfd, path, flags, attr, size) */
		target = (const char *)a[1];
		break;
	case 430: /* fsopen(fs_name, flags) */
		fstype = (const char *)a[0];
		break;
	case 175: /* init_module(image, len, params) */
		aux = (const char *)a[2];
		break;
	case NR_finit_module: /* finit_module(fd, params, flags) */
		fd = a[0];
		aux = (const char *)a[1];
		break;
	case NR_kexec_file_load: /* kexec_file_load(kernel_fd, initrd_fd, cmdline_len, cmdline, flags) */
		fd = a[0];
		break;
	}
	if (target)
		bpf_probe_read_user_str(e->str, sizeof(e->str), target);
	if (fd >= 0) {
		struct file *f = pw_fd_file(fd);
		if (f) {
			pw_resolve_file(&s->pw, f);
			bpf_probe_read_kernel_str(e->str, sizeof(e->str), s->pw.buf);
		}
	}
	if (fstype)
		bpf_probe_read_user_str(e->fstype, sizeof(e->fstype), fstype);
	if (target && e->str[0] != '/' && e->str[0] != 0) {
		/* Relative target: record the cwd so the agent can undo. */
		struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
		struct path root = BPF_CORE_READ(task, fs, root);
		struct path pwd = BPF_CORE_READ(task, fs, pwd);
		pw_resolve(&s->pw, &pwd, &root);
		bpf_probe_read_kernel_str(e->aux, sizeof(e->aux), s->pw.buf);
	} else if (aux) {
		bpf_probe_read_user_str(e->aux, sizeof(e->aux), aux);
	}
}

static __always_inline __u32 target_of(long nr, __u64 *a)
{
	switch (nr) {
	case 101: /* ptrace(request, pid, ...) */
		return (__u32)a[1];
	case 310: case 311: /* process_vm_*(pid, ...) */
		return (__u32)a[0];
	case NR_pidfd_getfd:
		return pidfd_pid(a[0]);
	}
	return 0;
}

/* emit_syscall sends a syscall event, without its strings when all are
 * empty (SYSCALL_EVENT_COMPACT). */
static __always_inline void emit_syscall(struct syscall_event *e)
{
	if (e->str[0] || e->aux[0] || e->fstype[0]) {
		struct syscall_event *out = reserve_event(sizeof(*out), true);
		if (out) {
			__builtin_memcpy(out, e, sizeof(*out));
			submit_event(out, true);
		}
		return;
	}
	struct syscall_event *out = reserve_event(SYSCALL_EVENT_COMPACT, true);
	if (out) {
		__builtin_memcpy(out, e, SYSCALL_EVENT_COMPACT);
		submit_event(out, true);
	}
}
