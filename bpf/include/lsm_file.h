/* file_open: file rules by path, inode, filesystem and device. */
#pragma once

struct file_verdict {
	__u32 action;
	__u32 rule_id;
	__u32 match;
};

static __always_inline void consider(struct file_verdict *v, struct access_rule *r, bool write, __u32 match)
{
	if (!r)
		return;
	__u32 action = write ? r->write_action : r->read_action;
	__u32 rule = write ? r->write_rule : r->read_rule;
	/* Strictest wins; a match that allows still counts as a match so the
	 * defaults of sandbox 0 are not consulted. */
	if (v->match == MATCH_NONE || action > v->action) {
		v->action = action;
		v->rule_id = rule;
		v->match = match;
	}
}

/* stricter makes d the verdict when it is stricter than v's; match says
 * what decided. */
static __always_inline void stricter(struct file_verdict *v, struct decision d, __u32 match)
{
	if (d.action > v->action) {
		v->action = d.action;
		v->rule_id = d.rule_id;
		v->match = match;
	}
}

/* What a file decision is about: the inode (absent for a name about to be
 * created) and its filesystem. */
struct file_facts {
	__u64 ino;
	__u64 magic; /* super_block.s_magic */
	__u32 dev;   /* kernel dev_t of the filesystem */
	__u32 rdev;  /* device nodes: the device's dev_t */
	__u32 mode;  /* i_mode: type and permission bits */
	__u32 generation; /* i_generation */
};

static __always_inline void facts_of(struct file_facts *f, struct inode *inode, struct super_block *s)
{
	f->ino = 0;
	f->mode = 0;
	f->rdev = 0;
	f->generation = 0;
	if (inode) {
		f->ino = BPF_CORE_READ(inode, i_ino);
		f->mode = BPF_CORE_READ(inode, i_mode);
		f->rdev = BPF_CORE_READ(inode, i_rdev);
		f->generation = BPF_CORE_READ(inode, i_generation);
	}
	f->dev = BPF_CORE_READ(s, s_dev);
	f->magic = BPF_CORE_READ(s, s_magic);
}

/* judge_file_tables checks every file table of one sandbox id. */
static __always_inline void judge_file_tables(struct file_verdict *v, __u32 sid, struct path_key *key,
					      const struct file_facts *f, bool write)
{
	struct ino_key ik = { .sandbox_id = sid, .dev = f->dev, .ino = f->ino };
	struct ino_rule *ir = bpf_map_lookup_elem(&lsm_inode_rules, &ik);
	/* An entry of another file with this number is no match. */
	if (ir && (ir->generation == GEN_ANY || ir->generation == f->generation) &&
	    (ir->ftype == 0 || ir->ftype == (f->mode & S_IFMT)))
		consider(v, &ir->rule, write, MATCH_INODE);

	struct fs_key fk = { .sandbox_id = sid, .magic = f->magic };
	consider(v, bpf_map_lookup_elem(&lsm_fs_rules, &fk), write, MATCH_FS);

	__u32 ftype = f->mode & S_IFMT;
	if (ftype == S_IFBLK || ftype == S_IFCHR) {
		struct dev_key dk = {
			.sandbox_id = sid,
			.type = ftype == S_IFBLK ? DEV_BLOCK : DEV_CHAR,
			.major = f->rdev >> MINORBITS,
			.minor = f->rdev & MINORMASK,
		};
		struct access_rule *r = bpf_map_lookup_elem(&lsm_dev_rules, &dk);
		if (!r) {
			dk.minor = ANY;
			r = bpf_map_lookup_elem(&lsm_dev_rules, &dk);
		}
		if (!r) {
			dk.major = ANY;
			r = bpf_map_lookup_elem(&lsm_dev_rules, &dk);
		}
		consider(v, r, write, MATCH_DEVICE);
	}

	key->sandbox_id = sid;
	consider(v, bpf_map_lookup_elem(&lsm_path_rules, key), write, MATCH_PATH);
}

/* judge_file_rules judges by the sandbox's file tables, else by the
 * defaults (sandbox 0): the write or read rules, or with read_too both
 * (strictest wins). */
static __always_inline void judge_file_rules(struct file_verdict *v, __u32 sid, struct path_key *key,
					     const struct file_facts *f, bool write, bool read_too)
{
	judge_file_tables(v, sid, key, f, write);
	if (read_too)
		judge_file_tables(v, sid, key, f, false);
	if (v->match != MATCH_NONE)
		return;
	judge_file_tables(v, 0, key, f, write);
	if (read_too)
		judge_file_tables(v, 0, key, f, false);
}

/* set_key_len sets key's prefix length from n, the bytes copied with their
 * NUL: the NUL counts (exact rules match) unless the path was cut, when
 * only prefix rules may match. */
static __always_inline void set_key_len(struct path_key *key, long n, bool truncated)
{
	if (n <= 0) {
		key->path[0] = 0;
		n = 1;
	}
	if (n > LSM_PATH_LEN)
		n = LSM_PATH_LEN;
	if (truncated)
		n--;
	key->prefixlen = 32 + 8 * (__u32)n;
}

/* key_from_walk resolves p (relative to the task's root) with the path
 * walk into pw and key; it returns whether the path was cut. */
static __always_inline bool key_from_walk(struct path_key *key, struct pathwalk *pw, struct path *p)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
	struct path rootp = BPF_CORE_READ(task, fs, root);
	pw_resolve(pw, p, &rootp);
	long n = bpf_probe_read_kernel_str(key->path, sizeof(key->path), pw->buf);
	bool truncated = n <= 0 || (pw->flags & PW_F_TRUNCATED) || pw->len + 1 > LSM_PATH_LEN;
	set_key_len(key, n, truncated);
	return truncated;
}

/* A file decision in progress: the caller's sandbox and the per-CPU
 * scratch for its path. */
struct file_ctx {
	__u64 root;
	struct sandbox *sb;
	struct path_key *key;
	struct pathwalk *pw;
};

/* file_begin fills c; false when the task is in no sandbox (allowed). */
static __always_inline bool file_begin(struct file_ctx *c)
{
	__u32 zero = 0;
	c->root = 0;
	c->sb = current_sandbox(&c->root);
	c->key = bpf_map_lookup_elem(&lsm_key_scratch, &zero);
	c->pw = bpf_map_lookup_elem(&lsm_pw_scratch, &zero);
	return c->sb && c->key && c->pw;
}

/* emit_file reports a file decision on the path in c->key and returns the
 * hook's result. */
static __always_inline int emit_file(__u32 kind, struct file_ctx *c, __u32 action, __u32 rule_id,
				     const struct file_facts *f, __u32 flags, __u32 fmode, __u32 match, __u32 fflags,
				     __u32 op)
{
	__u32 verdict = effective_verdict(c->sb, action);
	struct file_event *e = reserve_event(sizeof(*e), true);
	if (e) {
		fill_hdr(&e->hdr, kind, verdict, rule_id, c->root, c->sb);
		e->ino = f->ino;
		e->flags = flags;
		e->fmode = fmode;
		e->i_mode = f->mode;
		e->dev = f->dev;
		e->rdev = f->rdev;
		e->match = match;
		e->fflags = fflags;
		e->op = op;
		e->magic = f->magic;
		bpf_probe_read_kernel_str(e->path, sizeof(e->path), c->key->path);
		submit_event(e, true);
	}
	return conclude(verdict);
}

static __always_inline int decide_file_open(__u32 mech, struct file *file, int ret)
{
	if (ret)
		return ret;
	struct file_ctx c;
	if (!file_begin(&c))
		return 0;

	__u32 fmode = BPF_CORE_READ(file, f_mode);
	__u32 fflags = BPF_CORE_READ(file, f_flags);
	bool write = (fmode & FMODE_WRITE) || (fflags & (O_TRUNC | O_APPEND));
	struct inode *inode = BPF_CORE_READ(file, f_inode);
	struct file_facts f;
	facts_of(&f, inode, BPF_CORE_READ(inode, i_sb));

	/* The path as the kernel opened it, relative to the task's root. */
	bool truncated = false;
	long n = bpf_d_path((struct path *)&file->f_path, c.key->path, sizeof(c.key->path));
	if (n <= 0) {
		/* Longer than the key: the walk keeps the first bytes, which
		 * is all a prefix rule needs. */
		pw_resolve_file(c.pw, file);
		n = bpf_probe_read_kernel_str(c.key->path, sizeof(c.key->path), c.pw->buf);
		truncated = true;
	}
	set_key_len(c.key, n, truncated);

	struct file_verdict v = {};
	/* A message queue's "path" is its name in the mqueue filesystem
	 * (mq_open), not a file the file rules could mean: it is judged by
	 * its creator below. */
	if (f.magic != MQUEUE_MAGIC)
		judge_file_rules(&v, c.sb->id, c.key, &f, write, false);

	/* /proc/PID/mem (and /proc/PID/task/TID/mem), any PID. */
	if (f.magic == PROC_SUPER_MAGIC) {
		char name[4] = {};
		bpf_probe_read_kernel(name, sizeof(name), BPF_CORE_READ(file, f_path.dentry, d_name.name));
		if (name[0] == 'm' && name[1] == 'e' && name[2] == 'm' && name[3] == 0)
			stricter(&v, op_decision(c.sb->id, LSM_OP_PROC_MEM, ACTION_ALLOW), MATCH_PROC_MEM);
	}

	/* The fd and fdinfo listings of a process outside the subtree: the
	 * kernel asks no ptrace check for them (procfs.h). */
	if (f.magic == PROC_SUPER_MAGIC && proc_judged_name(BPF_CORE_READ(file, f_path.dentry)) == PROC_UNCHECKED) {
		struct task_struct *t = pid_leader_task(proc_inode_pid(inode));
		if (t && !st_task_below(t, c.root))
			stricter(&v, op_decision(c.sb->id, LSM_OP_OTHER_TASK, ACTION_ALLOW), MATCH_OTHER_TASK);
	}

	/* A POSIX message queue another sandbox or the host created. */
	if (f.magic == MQUEUE_MAGIC)
		stricter(&v, mq_decision(file, c.sb->id, c.root, f.dev, f.ino), MATCH_OTHER_IPC);

	/* A terminal controlled from outside the sandbox: /dev/pts/N on
	 * devpts, whose dentry holds the slave tty (the kernel opens a pty
	 * slave only through its devpts dentry). */
	if (f.magic == DEVPTS_SUPER_MAGIC_ && tty_pts_slave(f.mode, f.rdev)) {
		struct task_struct *leader = tty_foreign_leader(BPF_CORE_READ(file, f_path.dentry, d_fsdata));
		if (leader && !st_task_below(leader, c.root))
			stricter(&v, op_decision(c.sb->id, LSM_OP_TTY_INJECT, ACTION_ALLOW), MATCH_OTHER_TTY);
	}

	if (v.action == ACTION_ALLOW)
		return 0;
	return emit_file(EV_FILE_OPEN + mech, &c, v.action, v.rule_id, &f, fflags, fmode, v.match,
			 (write ? FILE_F_WRITE : 0) | (truncated ? FILE_F_TRUNCATED : 0), 0);
}
/* bpf_d_path is allowed on security_file_open for fmod_ret too. */
WATCHER_HOOK(file_open, security_file_open, decide_file_open(mech, file, ret), struct file *file, int ret)
