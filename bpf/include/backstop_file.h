/* Opened files judged at sys_exit: path, inode, categories, scripts. */
#pragma once

#define O_CREAT_ 0100
#define O_TRUNC_ 01000
#define FMODE_CREATED_ (1 << 20)

/* open_changed reports whether an open created or truncated its file. The
 * flags of open/openat are registers saved at entry (kernel state); those
 * of openat2 live in user memory, so FMODE_CREATED (set by the kernel) is
 * checked too and a truncation raced past the re-read is left to the
 * inode-change hooks (backstop_inode.h). */
static __always_inline bool open_changed(long nr, struct pt_regs *regs, unsigned int fmode)
{
	if (fmode & FMODE_CREATED_)
		return true;
	/* Registers by plain loads (regs is a BTF pointer); each case returns
	 * on its own, so no load is shared with the stack copy of openat2's. */
	switch (nr) {
	case NR_open:
		return regs->si & (O_CREAT_ | O_TRUNC_);
	case NR_openat:
		return regs->dx & (O_CREAT_ | O_TRUNC_);
	case NR_creat:
		return true;
	case NR_openat2: {
		__u64 flags = 0;
		struct open_how *how = (struct open_how *)BPF_CORE_READ(regs, dx);
		bpf_probe_read_user(&flags, sizeof(flags), &how->flags);
		return flags & (O_CREAT_ | O_TRUNC_);
	}
	}
	return false;
}

struct cmp_ctx {
	const char *a, *b;
	__u32 differ;
};

static long cmp_step(__u64 i, void *arg)
{
	struct cmp_ctx *c = arg;
	char x = 0, y = 0;
	bpf_probe_read_kernel(&x, 1, c->a + (i & (PW_HALF - 1)));
	bpf_probe_read_kernel(&y, 1, c->b + (i & (PW_HALF - 1)));
	if (x != y) {
		c->differ = 1;
		return 1;
	}
	return x == 0;
}

/* script_open judges the interpreter's open of its script (the name the
 * exec went through) as an exec of the file opened. */
static __always_inline void script_open(struct file *file, long nr, struct pt_regs *regs, __u64 root,
					struct sandbox *sb)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
	struct script_pending *sp = bpf_task_storage_get(&bs_scripts, task, 0, 0);
	if (!sp || !sp->set)
		return;
	struct scratch *s = get_scratch();
	if (!s)
		return;
	const char *upath = (const char *)(nr == NR_open ? BPF_CORE_READ(regs, di) : BPF_CORE_READ(regs, si));
	if (bpf_probe_read_user_str(s->upath, sizeof(s->upath), upath) <= 0)
		return;
	struct cmp_ctx c = { .a = s->upath, .b = sp->name };
	bpf_loop(PW_HALF, cmp_step, &c, 0);
	if (c.differ)
		return;
	sp->set = 0;
	judge_file(file, OP_EXEC, NR_execve, root, sb);
}

static __always_inline bool is_open_nr(long nr)
{
	return nr == NR_openat || nr == NR_open || nr == NR_openat2 || nr == NR_creat ||
	       nr == NR_open_by_handle_at;
}

/* proc_mem_target returns the pid of a /proc/PID/mem file (0 if the file is
 * not one). */
static __always_inline __u32 proc_mem_target(struct file *file, struct inode *inode)
{
	const unsigned char *name = BPF_CORE_READ(file, f_path.dentry, d_name.name);
	char buf[4] = {};
	bpf_probe_read_kernel(buf, sizeof(buf), name);
	if (buf[0] != 'm' || buf[1] != 'e' || buf[2] != 'm' || buf[3] != 0)
		return 0;
	struct proc_inode *pi = (struct proc_inode *)((void *)inode -
						      bpf_core_field_offset(struct proc_inode, vfs_inode));
	struct pid *p = BPF_CORE_READ(pi, pid);
	if (!p)
		return 0;
	int nr = 0;
	bpf_probe_read_kernel(&nr, sizeof(nr), &p->numbers[0].nr);
	return nr > 0 ? nr : 0;
}

/* proc_ptrace_target returns the pid of a /proc/PID file procfs.h judges,
 * else 0. */
static __always_inline __u32 proc_ptrace_target(struct file *file, struct inode *inode)
{
	if (proc_judged_name(BPF_CORE_READ(file, f_path.dentry)) == PROC_NOT_JUDGED)
		return 0;
	struct pid *p = proc_inode_pid(inode);
	if (!p)
		return 0;
	int nr = 0;
	bpf_probe_read_kernel(&nr, sizeof(nr), &p->numbers[0].nr);
	return nr > 0 ? nr : 0;
}

static __always_inline struct path_rule *match_path(struct scratch *s, __u32 sandbox_id)
{
	__u32 len = s->pw.len + 1; /* with the NUL: exact rules match too */
	if (len > RULE_PATH_LEN)
		len = RULE_PATH_LEN;
	s->key.prefixlen = (4 + len) * 8;
	bpf_probe_read_kernel(s->key.path, sizeof(s->key.path), s->pw.buf);
	s->key.sandbox_id = sandbox_id;
	struct path_rule *pr = bpf_map_lookup_elem(&bs_path_rules, &s->key);
	if (pr)
		return pr;
	s->key.sandbox_id = 0;
	return bpf_map_lookup_elem(&bs_path_rules, &s->key);
}

static __always_inline struct path_rule *match_inode(struct inode *inode, __u32 sandbox_id)
{
	struct inode_key k = {
		.ino = BPF_CORE_READ(inode, i_ino),
		.dev = BPF_CORE_READ(inode, i_sb, s_dev),
		.sandbox_id = sandbox_id,
	};
	/* An entry of another file with this number is no entry: the
	 * sandbox's own first, then the every-sandbox one. */
	struct path_rule *pr = bpf_map_lookup_elem(&bs_inode_rules, &k);
	if (pr && same_generation(pr->generation, inode))
		return pr;
	k.sandbox_id = 0;
	pr = bpf_map_lookup_elem(&bs_inode_rules, &k);
	if (pr && same_generation(pr->generation, inode))
		return pr;
	return NULL;
}

/* file_ident is what a file event says of the file beside its path. */
struct file_ident {
	__u64 ino;
	__u32 dev;
	__u32 i_mode;
	__u32 f_flags;
	__u32 f_mode;
	__u32 target_pid;
};

/* send_file_event reports a judged file: its identity, and the path the
 * walk resolved into s->pw. */
static __always_inline void send_file_event(struct scratch *s, __u32 verdict, __u32 rule_id, __u64 root,
					    struct sandbox *sb, __s64 nr, __u32 cat, struct file_ident id)
{
	struct file_event *e = reserve_event(sizeof(*e), true);
	if (!e)
		return;
	fill_hdr(&e->hdr, EV_KILL_FILE, verdict, rule_id, root, sb);
	e->nr = nr;
	e->ino = id.ino;
	e->dev = id.dev;
	e->i_mode = id.i_mode;
	e->f_flags = id.f_flags;
	e->f_mode = id.f_mode;
	e->category = cat;
	e->path_flags = s->pw.flags;
	e->target_pid = id.target_pid;
	e->pad = 0;
	bpf_probe_read_kernel_str(e->path, sizeof(e->path), s->pw.buf);
	submit_event(e, true);
}

/* judge_file applies categories, path and inode rules to file for the
 * operations ops (OP_*), and emits and kills on a match. True: the path
 * was walked (flags in the scratch) and nothing applies. */
static __always_inline bool judge_file(struct file *file, __u32 ops, long nr, __u64 root,
				       struct sandbox *sb)
{
	struct inode *inode = BPF_CORE_READ(file, f_inode);
	unsigned long magic = BPF_CORE_READ(inode, i_sb, s_magic);
	__u32 cat = CAT_NONE, action = 0, rule_id = 0, target = 0;

	if ((ops & OP_EXEC) && !BPF_CORE_READ(inode, __i_nlink)) {
		/* No path a rule could name: memfd_create + execveat, or a file
		 * deleted after being opened. */
		cat = CAT_EXEC_FILELESS;
	} else if ((magic == CGROUP2_SUPER_MAGIC || magic == CGROUP_SUPER_MAGIC) && (ops & OP_WRITE)) {
		cat = CAT_CGROUP_WRITE;
	} else if (magic == PROC_SUPER_MAGIC && (ops & (OP_READ | OP_WRITE))) {
		target = proc_mem_target(file, inode);
		if (target && target != (bpf_get_current_pid_tgid() >> 32))
			cat = CAT_PROC_MEM;
	}
	/* Whether a terminal or a process is the sandbox's own changes with
	 * their state (a session, a cgroup move): never cached. */
	bool by_state = false;
	if (!cat && magic == PROC_SUPER_MAGIC && (ops & (OP_READ | OP_WRITE))) {
		__u32 pid = proc_ptrace_target(file, inode);
		if (pid) {
			by_state = true;
			target = st_pid_outside(pid, root);
			if (target)
				cat = CAT_OTHER_TASK; /* the other-processes rule */
		}
	}
	if (!cat && (ops & (OP_READ | OP_WRITE)) &&
	    tty_pts_slave(BPF_CORE_READ(inode, i_mode), BPF_CORE_READ(inode, i_rdev))) {
		by_state = true;
		struct tty_file_private *priv = BPF_CORE_READ(file, private_data);
		struct task_struct *leader = tty_foreign_leader(priv ? BPF_CORE_READ(priv, tty) : NULL);
		if (leader && !st_task_in(leader, root)) {
			cat = CAT_TTY_INJECT; /* the terminals rule */
			target = BPF_CORE_READ(leader, tgid);
		}
	}
	if (cat) {
		action = sandbox_category(sb->id, cat, &rule_id);
		if (!action)
			cat = CAT_NONE;
	}

	struct scratch *s = get_scratch();
	if (!s)
		return false;
	pw_resolve_file(&s->pw, file);
	if (!action) {
		struct path_rule *pr = match_path(s, sb->id);
		if (!pr || !(pr->ops & ops) || !pr->action) {
			/* Another name of a protected file (a hard link into
			 * an allowed place): its inode decides. */
			struct path_rule *ir = match_inode(inode, sb->id);
			if (ir && (ir->ops & ops) && ir->action)
				pr = ir;
		}
		if (!pr || !(pr->ops & ops) || !pr->action)
			return !by_state;
		action = pr->action;
		rule_id = pr->rule_id;
		cat = CAT_PATH;
	}
	__u32 verdict = backstop_verdict(sb, action);
	if (verdict == VERDICT_ALLOWED)
		return cat == CAT_PATH && !by_state;
	if (verdict == VERDICT_KILLED)
		bpf_send_signal(SIGKILL);

	send_file_event(s, verdict, rule_id, root, sb, nr, cat, (struct file_ident){
		.ino = BPF_CORE_READ(inode, i_ino),
		.dev = BPF_CORE_READ(inode, i_sb, s_dev),
		.i_mode = BPF_CORE_READ(inode, i_mode),
		.f_flags = BPF_CORE_READ(file, f_flags),
		.f_mode = BPF_CORE_READ(file, f_mode),
		.target_pid = target,
	});
	return false;
}
