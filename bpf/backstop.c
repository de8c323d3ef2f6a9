//go:build ignore

/* Kill backstop: where no blocking hook can load (BPF LSM refused or absent),
 * tracepoints decide and bpf_send_signal(SIGKILL) stops the sandboxed
 * process. The operation may already have happened (a mount stays mounted),
 * so events say VERDICT_KILLED, carry the syscall's return value, and the
 * agent undoes what it can.
 *
 * - sys_enter: syscall rules (ptrace, process_vm_*, pidfd_getfd, mount
 *   family, bpf, modules, kexec, ...) and argument-checked categories
 *   (clone sharing the file table, io_uring_setup, signals to the agent).
 *   The kill is sent before the syscall runs: pending SIGKILL makes
 *   fork/clone fail and remote page access (process_vm_*) stop with EINTR;
 *   the event is completed at sys_exit with the return value.
 * - sys_exit of the open family: the returned descriptor's file is judged
 *   on its resolved, mount-aware path (dentry walk, see pathwalk.h), its
 *   inode (hard links), its filesystem (cgroupfs writes) and /proc/PID/mem.
 * - sched_prepare_exec (optional): exec of a path under an exec rule.
 * - io_uring_submit_req (optional): opens through io_uring when a policy
 *   allows io_uring at all (fixed-file opens never return a descriptor).
 * - cgroup_attach_task: a task of a sandbox moved outside it.
 */
#include "common.h"
#include "pathwalk.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define SIGKILL 9
#define MAX_SYSCALLS 512

#define FMODE_READ 0x1
#define FMODE_WRITE 0x2
#define FMODE_PATH 0x4000

#define CGROUP_SUPER_MAGIC 0x27e0eb
#define CGROUP2_SUPER_MAGIC 0x63677270
#define PROC_SUPER_MAGIC 0x9fa0

#define CLONE_FILES 0x00000400
#define CLONE_THREAD 0x00010000

/* x86_64 syscall numbers used here. */
#define NR_open 2
#define NR_clone 56
#define NR_execve 59
#define NR_kill 62
#define NR_creat 85
#define NR_rt_sigqueueinfo 129
#define NR_tkill 200
#define NR_tgkill 234
#define NR_openat 257
#define NR_rt_tgsigqueueinfo 297
#define NR_open_by_handle_at 304
#define NR_finit_module 313
#define NR_kexec_file_load 320
#define NR_pidfd_send_signal 424
#define NR_io_uring_enter 426
#define NR_clone3 435
#define NR_openat2 437
#define NR_pidfd_getfd 438

/* Argument-checked categories (index of bs_categories). */
enum bs_category {
	CAT_NONE = 0,
	CAT_CGROUP_WRITE = 1,  /* write-open of a cgroupfs file */
	CAT_PROC_MEM = 2,      /* open of another process's /proc/PID/mem */
	CAT_CLONE_FILES = 3,   /* clone/clone3 with CLONE_FILES, no CLONE_THREAD */
	CAT_IO_URING = 4,      /* io_uring_setup */
	CAT_IO_URING_OPEN = 5, /* IORING_OP_OPENAT/OPENAT2 submitted */
	CAT_SIGNAL_AGENT = 6,  /* kill-family syscall aimed at the agent */
	CAT_CGROUP_ESCAPE = 7, /* a sandbox task moved to a cgroup outside it */
	CAT_PATH = 8,          /* path or inode rule (events only) */
	CAT_MAX = 9,
};

/* Operations a path rule applies to. */
#define OP_READ 1
#define OP_WRITE 2
#define OP_EXEC 4

/* Per syscall number: a plain rule (action, rule_id) or, when category is
 * set, an argument check whose action lives in bs_categories. */
struct syscall_rule {
	__u32 action;
	__u32 rule_id;
	__u32 category;
};

struct category_rule {
	__u32 action;
	__u32 rule_id;
};

/* LPM key: sandbox id (0 = every sandbox) then the path. Exact rules
 * include the terminating NUL in their prefix, prefix rules do not. */
#define RULE_PATH_LEN 252
struct path_key {
	__u32 prefixlen;
	__u32 sandbox_id;
	char path[RULE_PATH_LEN];
};

struct path_rule {
	__u32 action;
	__u32 rule_id;
	__u32 ops; /* OP_* */
	__u32 pad;
};

/* Exact file rules are also keyed by inode, so hard links (another name
 * for the same inode) match too. */
struct inode_key {
	__u64 ino;
	__u32 dev; /* MAJOR<<20 | MINOR */
	__u32 sandbox_id;
};

struct file_event {
	struct event_hdr hdr;
	__s64 nr;         /* syscall (or NR_execve for exec, NR_io_uring_enter) */
	__u64 ino;
	__u32 f_flags;
	__u32 f_mode;
	__u32 i_mode;
	__u32 dev;
	__u32 category;   /* enum bs_category */
	__u32 path_flags; /* PW_F_* */
	__u32 target_pid; /* /proc/PID/mem: PID */
	__u32 pad;
	char path[PW_HALF];
};

struct syscall_event {
	struct event_hdr hdr;
	__s64 nr;
	__s64 ret;        /* return value; RET_UNKNOWN when not seen */
	__u64 args[6];
	__u64 mnt_ns;     /* mount namespace inode of the caller */
	__u32 category;
	__u32 target_pid; /* ptrace, process_vm_*, pidfd_*, signals */
	__u8 target_comm[TASK_COMM_LEN];
	char str[PW_HALF];  /* mount target, chroot/pivot_root path, module path */
	char aux[PW_HALF];  /* cwd when str is relative, or mount source */
	char fstype[32];
};

#define RET_UNKNOWN (-(1LL << 62))

/* Syscall events whose strings are all empty (most: ptrace, signals, bpf,
 * recorded syscalls) travel without them: the record ends before str. The
 * reader treats the missing bytes as zero. */
#define SYSCALL_EVENT_COMPACT __builtin_offsetof(struct syscall_event, str)

_Static_assert(sizeof(struct syscall_event) + 8 <= WAKEUP_WINDOW, "record longer than WAKEUP_WINDOW");
_Static_assert(sizeof(struct file_event) + 8 <= WAKEUP_WINDOW, "record longer than WAKEUP_WINDOW");

struct cgroup_event {
	struct event_hdr hdr;
	__u64 dst_cgroup;  /* cgroup id the task was moved to */
	__u64 from_sandbox; /* sandbox root it left */
	__u32 moved_pid;
	__u32 mover_pid;
	__u8 moved_comm[TASK_COMM_LEN];
	char dst_path[PW_HALF];
};

_Static_assert(sizeof(struct cgroup_event) + 8 <= WAKEUP_WINDOW, "record longer than WAKEUP_WINDOW");

const struct file_event *unused_file_event __attribute__((unused));
const struct syscall_event *unused_syscall_event __attribute__((unused));
const struct cgroup_event *unused_cgroup_event __attribute__((unused));
const struct path_key *unused_path_key __attribute__((unused));
const struct path_rule *unused_path_rule __attribute__((unused));
const struct inode_key *unused_inode_key __attribute__((unused));
const struct syscall_rule *unused_syscall_rule __attribute__((unused));
const struct category_rule *unused_category_rule __attribute__((unused));

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_SYSCALLS);
	__type(key, __u32);
	__type(value, struct syscall_rule);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} bs_syscall_rules SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, CAT_MAX);
	__type(key, __u32);
	__type(value, struct category_rule);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} bs_categories SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 4096);
	__type(key, struct path_key);
	__type(value, struct path_rule);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} bs_path_rules SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct inode_key);
	__type(value, struct path_rule);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} bs_inode_rules SEC(".maps");

/* Events decided at sys_enter, completed with the return value at sys_exit,
 * kept per task (thread): filled in place, no hash update and delete per
 * syscall. hdr.kind is EV_KILL_SYSCALL while an event waits, 0 once sent. */
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct syscall_event);
} bs_pending SEC(".maps");

/* Sandbox a task belongs to, kept from fork and cgroup moves, so a move out
 * of the sandbox is seen after the fact (cgroup_attach_task fires after the
 * task has already changed cgroup). */
struct task_sandbox {
	__u64 sandbox_cg;
	__u32 sandbox_id;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct task_sandbox);
} bs_tasks SEC(".maps");

struct scratch {
	struct pathwalk pw;
	struct path_key key;
	struct syscall_event ev;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct scratch);
} bs_scratch SEC(".maps");

#ifndef bpf_ksym_exists
#define bpf_ksym_exists(sym) (!!(sym))
#endif

extern int bpf_send_signal_task(struct task_struct *task, int sig, enum pid_type type, __u64 value) __ksym __weak;

static __always_inline struct scratch *get_scratch(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&bs_scratch, &zero);
}

static __always_inline struct category_rule *category(__u32 cat)
{
	return bpf_map_lookup_elem(&bs_categories, &cat);
}

/* The backstop cannot block: a block action is carried out as a kill. */
static __always_inline __u32 backstop_verdict(struct sandbox *sb, __u32 action)
{
	if (action == ACTION_BLOCK)
		action = ACTION_KILL;
	return effective_verdict(sb, action);
}

#define PIDFS_MAGIC 0x50494446
#define ANON_INODE_FS_MAGIC 0x09041934

/* pidfd_pid returns the pid a pidfd refers to: pidfs (Linux >= 6.9) keeps
 * the struct pid in the inode, older kernels' anon-inode pidfds in the
 * file. Other files give 0. */
static __always_inline __u32 pidfd_pid(long fd)
{
	struct file *f = pw_fd_file(fd);
	if (!f)
		return 0;
	struct inode *inode = BPF_CORE_READ(f, f_inode);
	unsigned long magic = BPF_CORE_READ(inode, i_sb, s_magic);
	struct pid *p;
	if (magic == PIDFS_MAGIC)
		p = BPF_CORE_READ(inode, i_private);
	else if (magic == ANON_INODE_FS_MAGIC)
		p = BPF_CORE_READ(f, private_data);
	else
		return 0;
	if (!p)
		return 0;
	int nr = 0;
	bpf_probe_read_kernel(&nr, sizeof(nr), &p->numbers[0].nr);
	return nr > 0 ? nr : 0;
}

/* target_is_agent checks a kill-family syscall's target. kill(-1) signals
 * every process the caller may signal, the agent included. */
static __always_inline bool target_is_agent(long nr, struct pt_regs *regs, __u32 *target)
{
	long a0 = BPF_CORE_READ(regs, di);
	__u32 agent = 0, zero = 0;
	__u32 *ap = bpf_map_lookup_elem(&agent_tgid, &zero);
	if (ap)
		agent = *ap;
	if (!agent)
		return false;
	switch (nr) {
	case NR_kill:
		if (a0 == -1) {
			*target = agent;
			return true;
		}
		/* fallthrough */
	case NR_tkill:
	case NR_tgkill:
	case NR_rt_sigqueueinfo:
	case NR_rt_tgsigqueueinfo:
		*target = (__u32)a0;
		return a0 == agent;
	case NR_pidfd_send_signal:
		*target = pidfd_pid(a0);
		return *target == agent;
	}
	return false;
}

static __always_inline bool category_matches(__u32 cat, long nr, struct pt_regs *regs, __u32 *target)
{
	switch (cat) {
	case CAT_CLONE_FILES: {
		__u64 flags = 0;
		if (nr == NR_clone) {
			flags = BPF_CORE_READ(regs, di);
		} else if (nr == NR_clone3) {
			struct clone_args *ua = (struct clone_args *)BPF_CORE_READ(regs, di);
			if (bpf_probe_read_user(&flags, sizeof(flags), &ua->flags))
				return true; /* unreadable: clone3 will fail or race; refuse */
		} else {
			return false;
		}
		return (flags & CLONE_FILES) && !(flags & CLONE_THREAD);
	}
	case CAT_SIGNAL_AGENT:
		return target_is_agent(nr, regs, target);
	case CAT_IO_URING:
		return true;
	}
	return false;
}

static __always_inline __u64 current_mnt_ns(void)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
	return BPF_CORE_READ(task, nsproxy, mnt_ns, ns.inum);
}

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

SEC("tp_btf/sys_enter")
int BPF_PROG(backstop_sys_enter, struct pt_regs *regs, long id)
{
	if ((unsigned long)id >= MAX_SYSCALLS)
		return 0;
	__u32 nr = id;
	struct syscall_rule *r = bpf_map_lookup_elem(&bs_syscall_rules, &nr);
	if (!r || (!r->action && !r->category))
		return 0;

	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb)
		return 0;

	__u32 action = r->action, rule_id = r->rule_id, cat = r->category, target = 0;
	if (cat) {
		struct category_rule *c = category(cat);
		if (!c || !c->action)
			return 0;
		if (!category_matches(cat, id, regs, &target))
			return 0;
		action = c->action;
		rule_id = c->rule_id;
	}
	if (action == ACTION_ALLOW)
		return 0;
	__u32 verdict = backstop_verdict(sb, action);

	struct scratch *s = get_scratch();
	if (!s)
		return 0;
	/* Filled in place in the task's pending slot; when there is none
	 * (allocation failed), in the scratch, sent at once below. */
	struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
	struct syscall_event *e = bpf_task_storage_get(&bs_pending, task, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	bool stashed = e != NULL;
	if (!e)
		e = &s->ev;
	__builtin_memset(e, 0, sizeof(*e));
	fill_hdr(&e->hdr, EV_KILL_SYSCALL, verdict, rule_id, root, sb);
	e->nr = id;
	e->ret = RET_UNKNOWN;
	e->args[0] = BPF_CORE_READ(regs, di);
	e->args[1] = BPF_CORE_READ(regs, si);
	e->args[2] = BPF_CORE_READ(regs, dx);
	e->args[3] = BPF_CORE_READ(regs, r10);
	e->args[4] = BPF_CORE_READ(regs, r8);
	e->args[5] = BPF_CORE_READ(regs, r9);
	e->category = cat;
	e->mnt_ns = current_mnt_ns();
	e->target_pid = target ? target : target_of(id, e->args);
	fill_strings(s, e, id, e->args);

	if (verdict == VERDICT_KILLED)
		bpf_send_signal(SIGKILL);

	if (!stashed)
		emit_syscall(e); /* cannot stash: send now, without the return value */
	return 0;
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
	struct path_rule *pr = bpf_map_lookup_elem(&bs_inode_rules, &k);
	if (pr)
		return pr;
	k.sandbox_id = 0;
	return bpf_map_lookup_elem(&bs_inode_rules, &k);
}

/* judge_file applies categories, path and inode rules to file for the
 * operations ops (OP_*), and emits and kills on a match. */
static __always_inline void judge_file(struct file *file, __u32 ops, long nr, __u64 root,
				       struct sandbox *sb)
{
	struct inode *inode = BPF_CORE_READ(file, f_inode);
	unsigned long magic = BPF_CORE_READ(inode, i_sb, s_magic);
	__u32 cat = CAT_NONE, action = 0, rule_id = 0, target = 0;

	if ((magic == CGROUP2_SUPER_MAGIC || magic == CGROUP_SUPER_MAGIC) && (ops & OP_WRITE)) {
		cat = CAT_CGROUP_WRITE;
	} else if (magic == PROC_SUPER_MAGIC && (ops & (OP_READ | OP_WRITE))) {
		target = proc_mem_target(file, inode);
		if (target && target != (bpf_get_current_pid_tgid() >> 32))
			cat = CAT_PROC_MEM;
	}
	if (cat) {
		struct category_rule *c = category(cat);
		if (c && c->action) {
			action = c->action;
			rule_id = c->rule_id;
		} else {
			cat = CAT_NONE;
		}
	}

	struct scratch *s = get_scratch();
	if (!s)
		return;
	pw_resolve_file(&s->pw, file);
	if (!action) {
		struct path_rule *pr = match_path(s, sb->id);
		if (!pr || !(pr->ops & ops))
			pr = match_inode(inode, sb->id);
		if (!pr || !(pr->ops & ops) || !pr->action)
			return;
		action = pr->action;
		rule_id = pr->rule_id;
		cat = CAT_PATH;
	}
	__u32 verdict = backstop_verdict(sb, action);
	if (verdict == VERDICT_ALLOWED)
		return;
	if (verdict == VERDICT_KILLED)
		bpf_send_signal(SIGKILL);

	struct file_event *e = reserve_event(sizeof(*e), true);
	if (!e)
		return;
	fill_hdr(&e->hdr, EV_KILL_FILE, verdict, rule_id, root, sb);
	e->nr = nr;
	e->ino = BPF_CORE_READ(inode, i_ino);
	e->dev = BPF_CORE_READ(inode, i_sb, s_dev);
	e->i_mode = BPF_CORE_READ(inode, i_mode);
	e->f_flags = BPF_CORE_READ(file, f_flags);
	e->f_mode = BPF_CORE_READ(file, f_mode);
	e->category = cat;
	e->path_flags = s->pw.flags;
	e->target_pid = target;
	e->pad = 0;
	bpf_probe_read_kernel_str(e->path, sizeof(e->path), s->pw.buf);
	submit_event(e, true);
}

SEC("tp_btf/sys_exit")
int BPF_PROG(backstop_sys_exit, struct pt_regs *regs, long ret)
{
	long nr = BPF_CORE_READ(regs, orig_ax);
	if (is_open_nr(nr)) {
		if (ret < 0)
			return 0;
		__u64 root = 0;
		struct sandbox *sb = current_sandbox(&root);
		if (!sb)
			return 0;
		struct file *file = pw_fd_file(ret);
		if (!file)
			return 0;
		unsigned int fmode = BPF_CORE_READ(file, f_mode);
		if (fmode & FMODE_PATH)
			return 0; /* O_PATH: no access; a reopen is judged itself */
		__u32 ops = ((fmode & FMODE_READ) ? OP_READ : 0) | ((fmode & FMODE_WRITE) ? OP_WRITE : 0);
		judge_file(file, ops, nr, root, sb);
		return 0;
	}
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
	struct category_rule *c = category(CAT_IO_URING_OPEN);
	if (!c || !c->action)
		return 0;
	__u32 verdict = backstop_verdict(sb, c->action);
	if (verdict == VERDICT_ALLOWED)
		return 0;
	if (verdict == VERDICT_KILLED)
		bpf_send_signal(SIGKILL);
	/* No strings: only the compact part is reserved and written. */
	struct syscall_event *e = reserve_event(SYSCALL_EVENT_COMPACT, true);
	if (!e)
		return 0;
	__builtin_memset(e, 0, SYSCALL_EVENT_COMPACT);
	fill_hdr(&e->hdr, EV_KILL_SYSCALL, verdict, c->rule_id, root, sb);
	e->nr = NR_io_uring_enter;
	e->ret = RET_UNKNOWN;
	e->args[0] = op;
	e->category = CAT_IO_URING_OPEN;
	e->mnt_ns = current_mnt_ns();
	submit_event(e, true);
	return 0;
}

/* cgroup_sandbox returns the sandbox root id cg is in (0 for none), outermost
 * first like lookup_sandbox_cg. */
static __always_inline __u64 cgroup_sandbox(struct cgroup *cg, struct sandbox **out)
{
	int level = BPF_CORE_READ(cg, level);
	for (int i = 1; i <= MAX_CGROUP_DEPTH; i++) {
		if (i > level)
			break;
		struct cgroup *anc = NULL;
		bpf_probe_read_kernel(&anc, sizeof(anc), &cg->ancestors[i]);
		if (!anc)
			break;
		__u64 id = BPF_CORE_READ(anc, kn, id);
		struct sandbox *s = bpf_map_lookup_elem(&sandboxes, &id);
		if (s) {
			*out = s;
			return id;
		}
	}
	return 0;
}

/* A child inherits its parent's sandbox; with CLONE_INTO_CGROUP it may start
 * elsewhere, so the child's own cgroup decides. */
SEC("tp_btf/sched_process_fork")
int BPF_PROG(backstop_fork, struct task_struct *parent, struct task_struct *child)
{
	struct cgroup *cg = BPF_CORE_READ(child, cgroups, dfl_cgrp);
	struct sandbox *sb = NULL;
	__u64 sbcg = cgroup_sandbox(cg, &sb);
	if (!sbcg || !sb)
		return 0;
	struct task_sandbox *ts = bpf_task_storage_get(&bs_tasks, child, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (ts) {
		ts->sandbox_cg = sbcg;
		ts->sandbox_id = sb->id;
	}
	return 0;
}

SEC("tp_btf/cgroup_attach_task")
int BPF_PROG(backstop_cgroup_attach, struct cgroup *dst, const char *path, struct task_struct *task,
	     bool threadgroup)
{
	/* Only the default (v2) hierarchy defines sandboxes. */
	if (BPF_CORE_READ(dst, root, hierarchy_id) != 0)
		return 0;
	struct sandbox *dsb = NULL;
	__u64 dst_sb = cgroup_sandbox(dst, &dsb);
	struct task_sandbox *ts = bpf_task_storage_get(&bs_tasks, task, 0,
						       dst_sb ? BPF_LOCAL_STORAGE_GET_F_CREATE : 0);
	if (!ts)
		return 0;
	__u64 from = ts->sandbox_cg;
	__u32 from_id = ts->sandbox_id;
	ts->sandbox_cg = dst_sb;
	ts->sandbox_id = dsb ? dsb->id : 0;
	if (!from || from == dst_sb)
		return 0;
	/* The agent itself moves tasks when it tears a sandbox down. */
	if (is_agent(bpf_get_current_pid_tgid() >> 32))
		return 0;

	struct category_rule *c = category(CAT_CGROUP_ESCAPE);
	__u32 action = c ? c->action : ACTION_RECORD;
	if (!action)
		action = ACTION_RECORD; /* a move out is always an alert */
	struct sandbox from_sb = { .id = from_id };
	struct sandbox *fsb = bpf_map_lookup_elem(&sandboxes, &from);
	if (fsb)
		from_sb = *fsb;
	__u32 verdict = backstop_verdict(&from_sb, action);
	if (verdict == VERDICT_KILLED) {
		__u32 task_tgid = BPF_CORE_READ(task, tgid);
		if (task_tgid == (bpf_get_current_pid_tgid() >> 32))
			bpf_send_signal(SIGKILL);
		else if (bpf_ksym_exists(bpf_send_signal_task))
			bpf_send_signal_task(task, SIGKILL, PIDTYPE_TGID, 0);
		else
			verdict = VERDICT_RECORDED; /* cannot signal another task here */
	}
	struct cgroup_event *e = reserve_event(sizeof(*e), true);
	if (!e)
		return 0;
	fill_hdr(&e->hdr, EV_KILL_CGROUP, verdict, c ? c->rule_id : 0, from, &from_sb);
	e->dst_cgroup = BPF_CORE_READ(dst, kn, id);
	e->from_sandbox = from;
	e->moved_pid = BPF_CORE_READ(task, tgid);
	e->mover_pid = bpf_get_current_pid_tgid() >> 32;
	BPF_CORE_READ_STR_INTO(&e->moved_comm, task, comm);
	if (path)
		bpf_probe_read_kernel_str(e->dst_path, sizeof(e->dst_path), path);
	else
		e->dst_path[0] = 0;
	submit_event(e, true);
	return 0;
}
