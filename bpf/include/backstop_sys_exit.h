/* sys_exit, sched_prepare_exec and io_uring_submit_req: judging after the fact. */
#pragma once

/* complete_pending sends the event sys_enter left for this syscall, with
 * its return value. */
static __always_inline void complete_pending(long nr, long ret)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
	struct syscall_event *pending = bpf_task_storage_get(&bs_pending, task, 0, 0);
	if (!pending || pending->hdr.kind != EV_KILL_SYSCALL || pending->nr != nr)
		return;
	pending->ret = ret;
	emit_syscall(pending);
	pending->hdr.kind = 0; /* sent (or its loss counted): never twice */
}

#define NR_inotify_add_watch 254
static __always_inline void notify_mark_added(struct pt_regs *regs);

/* sys_exit_judged: everything but the fast path below (see sys_enter_judged). */
static __noinline int sys_exit_judged(struct pt_regs *regs, long ret, long nr, bool compat)
{
	if (vc_mount_syscall(nr, compat))
		vc_mount_exit();
	if (compat) {
		lowmap_compat_exit(regs, nr, ret);
		/* Judged (refused outright or by number) at sys_enter; only an
		 * i386 mount waits for its return value (see compat_enter). */
		if (nr == NR32_mount)
			complete_pending(165, ret); /* stashed as the x86_64 mount */
		return 0;
	}
	if (is_open_nr(nr)) {
		if (nr == NR_open_by_handle_at)
			complete_pending(nr, ret); /* also a syscall rule of its own */
		if (ret < 0)
			return 0;
		__u64 root = 0;
		struct sandbox *sb = current_sandbox(&root);
		if (!sb)
			return 0;
		struct file *file = bs_fd_file(ret);
		if (!file)
			return 0;
		unsigned int fmode = bpf_ksym_exists(bpf_rdonly_cast) ? bs_cast(file, struct file)->f_mode
								      : BPF_CORE_READ(file, f_mode);
		if (fmode & FMODE_PATH)
			return 0; /* O_PATH: no access; a reopen is judged itself */
		__u32 ops = ((fmode & FMODE_READ) ? OP_READ : 0) | ((fmode & FMODE_WRITE) ? OP_WRITE : 0);
		/* O_TRUNC and O_CREAT change the file whatever the access mode
		 * (the kernel clears them from f_flags): a write. */
		if (open_changed(nr, regs, fmode))
			ops |= OP_WRITE;
		struct vc_pending *vp = vc_pending();
		if (!vp)
			return 0;
		vp->ok = vc_prepare(file, ops, sb, &vp->k, &vp->gens);
		if (!vp->ok || !vc_hit(&vp->k, &vp->gens)) {
			if (judge_file(file, ops, nr, root, sb))
				vc_store_pending();
		}
		script_open(file, nr, regs, root, sb);
		return 0;
	}
	if (nr == NR_connect && ret == 0)
		unix_peer_connected(regs);
	if (nr == NR_inotify_add_watch && ret >= 0)
		notify_mark_added(regs);
	if (nr == NR_mmap || nr == NR_mremap || nr == NR_shmat)
		lowmap_exit(nr, ret);
	if ((unsigned long)nr >= MAX_SYSCALLS)
		return 0;
	__u32 n = nr;
	struct syscall_rule *r = bpf_map_lookup_elem(&bs_syscall_rules, &n);
	if (!r || (!r->action && !r->category))
		return 0;
	struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
	struct syscall_event *pending = bpf_task_storage_get(&bs_pending, task, 0, 0);
	if (!pending || pending->hdr.kind != EV_KILL_SYSCALL || pending->nr != nr)
		return 0;
	pending->ret = ret;
	emit_syscall(pending);
	pending->hdr.kind = 0; /* sent (or its loss counted): never twice */
	return 0;
}

/* Native syscalls sys_exit_judged looks at whatever the rules: the open
 * family, connect, inotify_add_watch, mmap, mremap, shmat and the mount
 * family (the verdict cache's busy count). A bitmap by number, in .rodata:
 * one load and a shift instead of a compare per number. */
#define EXIT_ALWAYS(X, w) (X(NR_open, w) | X(NR_openat, w) | X(NR_openat2, w) | X(NR_creat, w) | \
	X(NR_open_by_handle_at, w) | X(NR_connect, w) | X(NR_inotify_add_watch, w) | X(NR_mmap, w) | \
	X(NR_mremap, w) | X(NR_shmat, w) | X(155, w) | X(161, w) | X(165, w) | X(166, w) | X(428, w) | \
	X(429, w) | X(432, w) | X(442, w) | X(467, w))
static const volatile __u64 bs_exit_always[MAX_SYSCALLS / 64] = {
	EXIT_ALWAYS(NR_BIT, 0), EXIT_ALWAYS(NR_BIT, 1), EXIT_ALWAYS(NR_BIT, 2), EXIT_ALWAYS(NR_BIT, 3),
	EXIT_ALWAYS(NR_BIT, 4), EXIT_ALWAYS(NR_BIT, 5), EXIT_ALWAYS(NR_BIT, 6), EXIT_ALWAYS(NR_BIT, 7),
};

/* The fast path: a native syscall that returns nothing judged here and
 * that no sandbox has a rule or category for leaves after one array
 * lookup, whoever makes it. The opens go on: the sandbox is looked up
 * (one lookup, the per-cgroup membership, for a task outside). */
SEC("tp_btf/sys_exit")
int BPF_PROG(backstop_sys_exit, struct pt_regs *regs, long ret)
{
	long nr = regs->orig_ax; /* a direct load: regs is a BTF pointer */
	bool compat = in_compat_syscall(nr);
	if (!compat && (unsigned long)nr < MAX_SYSCALLS && !((bs_exit_always[nr >> 6] >> (nr & 63)) & 1)) {
		__u32 n = nr;
		struct syscall_rule *r = bpf_map_lookup_elem(&bs_syscall_rules, &n);
		if (r && !r->action && !r->category)
			return 0;
	}
	/* An open's return, outside every sandbox: the membership of the
	 * cgroup the task is in now, as current_sandbox reads it (a miss or a
	 * stale generation goes on to compute it). open_by_handle_at may
	 * complete an event of sys_enter's. */
	if (!compat && (nr == NR_openat || nr == NR_open || nr == NR_openat2 || nr == NR_creat) &&
	    (ret < 0 || bs_outside_now()))
		return 0;
	return sys_exit_judged(regs, ret, nr, compat);
}

/* sched_prepare_exec runs before the new image replaces the old one: a kill
 * here means the exec'd program never runs. Optional: Linux >= 6.10. */
SEC("tp_btf/sched_prepare_exec")
int BPF_PROG(backstop_prepare_exec, struct task_struct *task, struct linux_binprm *bprm)
{
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb)
		return 0;
	struct file *file = BPF_CORE_READ(bprm, file);
	if (!file)
		return 0;
	judge_file(file, OP_EXEC, NR_execve, root, sb);
	/* A script: the kernel runs its interpreter (bprm->interp changed),
	 * which opens the script by the name the exec went through. */
	const char *fname = BPF_CORE_READ(bprm, filename);
	const char *interp = BPF_CORE_READ(bprm, interp);
	struct script_pending *sp = bpf_task_storage_get(&bs_scripts, task, 0,
							 fname != interp ? BPF_LOCAL_STORAGE_GET_F_CREATE : 0);
	if (!sp)
		return 0;
	sp->set = 0;
	if (fname != interp && bpf_probe_read_kernel_str(sp->name, sizeof(sp->name), fname) > 0)
		sp->set = 1;
	return 0;
}

/* io_uring_submit_req runs before the request is issued, in the submitter
 * or its SQPOLL thread (same process and cgroup). Only reached when the
 * policy allows io_uring_setup. Optional: Linux >= 6.4 signature. */
SEC("tp_btf/io_uring_submit_req")
int BPF_PROG(backstop_io_uring_submit, struct io_kiocb *req)
{
	__u8 op = BPF_CORE_READ(req, opcode);
	if (op != IORING_OP_OPENAT && op != IORING_OP_OPENAT2)
		return 0;
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb)
		return 0;
	__u32 rule_id = 0;
	__u32 action = sandbox_category(sb->id, CAT_IO_URING_OPEN, &rule_id);
	if (!action)
		return 0;
	__u32 verdict = backstop_verdict(sb, action);
	if (verdict == VERDICT_ALLOWED)
		return 0;
	if (verdict == VERDICT_KILLED)
		bpf_send_signal(SIGKILL);
	/* No strings: only the compact part is reserved and written. */
	struct syscall_event *e = reserve_event(SYSCALL_EVENT_COMPACT, true);
	if (!e)
		return 0;
	__builtin_memset(e, 0, SYSCALL_EVENT_COMPACT);
	fill_hdr(&e->hdr, EV_KILL_SYSCALL, verdict, rule_id, root, sb);
	e->nr = NR_io_uring_enter;
	e->ret = RET_UNKNOWN;
	e->args[0] = op;
	e->category = CAT_IO_URING_OPEN;
	e->mnt_ns = current_mnt_ns();
	submit_event(e, true);
	return 0;
}
