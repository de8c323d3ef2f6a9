//go:build ignore

/* Recording with tracepoints, for sandboxed tasks only:
 * - sys_enter: attempts to load kernel code (init_module, finit_module,
 *   kexec_load, kexec_file_load) as alerts: they fail (ENOSYS on kernels
 *   without module support) but the attempt is what counts; and an optional
 *   sampled stream of all syscalls, counted exactly per sandbox and syscall
 *   in a per-CPU map while only 1 in N travels to user space.
 * - sys_exit: refusals by the launcher's seccomp filter and Landlock
 *   ruleset (`watcher exec`), which act before any LSM or sys_enter program
 *   sees the operation, where fexit programs do not load (elsewhere
 *   recorder_fexit.h records them without a syscall-wide program). A seccomp SECCOMP_RET_ERRNO skips the syscall and
 *   the sys_enter tracepoint, but sys_exit still fires with the syscall
 *   number and -EPERM (seen on 6.18). sys_enter marks the watched syscalls
 *   it does see, so an EPERM at exit with no mark is seccomp's, not the
 *   kernel's or a cgroup program's. Landlock refuses opens and execs inside
 *   the syscall with EACCES; the record carries the path string the caller
 *   passed (read from the argument registers, which hold the arguments
 *   until the return to user space), not the resolved file Landlock judged.
 * - sched_process_exec / sched_process_exit: exec (exe path, argv, parent
 *   chain) and process exit, so every event can be tied to a command line.
 *
 * Outside sandboxes sys_enter costs a config lookup and a compare (plus a
 * lookup in the small watch array when denials are recorded) unless
 * sampling is on (then a membership cache lookup per syscall); sys_exit
 * costs a compare of the return value, then the watch array lookup.
 */
#include "common.h"
#include "pathwalk.h"
#include "compat.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define NR_init_module 175
#define NR_kexec_load 246
#define NR_finit_module 313
#define NR_kexec_file_load 320
/* The open family (x86_64 numbers): where the path and flags are. */
#define NR_open 2
#define NR_execve 59
#define NR_creat 85
#define NR_openat 257
#define NR_execveat 322
#define NR_openat2 437
/* Path syscalls Landlock refuses with EACCES (the path recorded is the one
 * that needs the missing right: the new name for link, rename, symlink). */
#define NR_rename 82
#define NR_link 86
#define NR_symlink 88
#define NR_linkat 265
#define NR_symlinkat 266
#define NR_renameat 264
#define NR_renameat2 316
#define NR_mkdirat 258
#define NR_mknodat 259
#define NR_unlinkat 263

#define EACCES 13
#define O_WRONLY 01
#define O_CREAT 0100
#define O_TRUNC 01000

#define SECCOMP_MODE_FILTER 2
#define PFA_NO_NEW_PRIVS 0     /* bit in task->atomic_flags */
#define CAP_DAC_OVERRIDE 1

/* Size of the denial watch array: x86_64 syscall numbers are below it. */
#define WATCH_NRS 512

/* Values of tr_denial_watch, per x86_64 syscall number (bits). */
enum denial_watch {
	DW_SECCOMP = 1, /* record EPERM returned without sys_enter (seccomp) */
	DW_OPEN = 2,    /* record EACCES/EPERM with the path argument (Landlock) */
};

/* syscall_event.denial */
enum denial {
	DENIAL_NONE = 0,
	DENIAL_SECCOMP = 1,
	DENIAL_OPEN = 2,
};

/* syscall_event.flags of denials (bits) */
enum deny_flag {
	DENY_F_IA32 = 1,            /* i386 syscall (int 0x80): nr is in the i386 table */
	DENY_F_PATH_TRUNCATED = 2,  /* the path string was longer than path[] */
	DENY_F_PATH_UNREADABLE = 4, /* the path pointer could not be read */
	DENY_F_DAC_OVERRIDE = 8,    /* the task had CAP_DAC_OVERRIDE: file modes did not refuse */
	DENY_F_LSM_HOOK = 16,       /* seen leaving a security_* hook: an LSM refused, not file modes */
};

/* Marks in tr_syscall_entered: nr + 1, with this bit for i386 syscalls. */
#define ENTERED_IA32 0x80000000u

#define ANCESTORS 4
#define ARGS_LEN 256

struct trace_config {
	__u32 sample_every;   /* 0: no syscall stream; N: 1 in N per CPU */
	__u32 module_alerts;  /* record kernel-code loading attempts */
	__u32 module_rule_id;
	__u32 record_denials; /* mark watched syscalls at sys_enter (see sys_exit) */
};

struct count_key {
	__u64 sandbox_cg;
	__u32 nr;
	__u32 pad;
};

struct ancestor {
	__u32 pid;
	__u8 comm[TASK_COMM_LEN];
};

struct exec_event {
	struct event_hdr hdr;
	__u32 old_pid;
	__u32 args_len;   /* bytes of args used (NUL-separated) */
	__u32 args_total; /* bytes of the whole argv */
	__u32 path_flags; /* PW_F_* of exe */
	struct ancestor ancestors[ANCESTORS];
	char exe[PW_HALF];
	char args[ARGS_LEN];
};

struct exit_event {
	struct event_hdr hdr;
	__u32 exit_code; /* wait status: code << 8 | signal */
	__u32 pad;
	struct ancestor ancestors[ANCESTORS];
};

struct syscall_event {
	struct event_hdr hdr;
	__s64 nr;
	__u64 count; /* syscalls this sample stands for */
	__u64 args[6];
	__s64 ret;          /* denials: the return value (-EPERM, -EACCES) */
	__u64 open_flags;   /* DENIAL_OPEN: open flags (openat2: how->flags) */
	__u32 denial;       /* enum denial; DENIAL_NONE for samples and module alerts */
	__u32 flags;        /* DENY_F_* */
	/* module/kexec: the resolved file; DENIAL_OPEN: the path string as
	 * the caller passed it (relative, unresolved, possibly rewritten by
	 * another thread since the kernel read it) */
	char path[PW_HALF];
};

/* Samples of the syscall stream carry no path: their records end before it
 * (the reader treats the missing bytes as zero), a third of the full size. */
#define SYSCALL_SAMPLE_SIZE __builtin_offsetof(struct syscall_event, path)

_Static_assert(sizeof(struct exec_event) + 8 <= WAKEUP_WINDOW, "record longer than WAKEUP_WINDOW");
_Static_assert(sizeof(struct syscall_event) + 8 <= WAKEUP_WINDOW, "record longer than WAKEUP_WINDOW");

const struct exec_event *unused_exec_event __attribute__((unused));
const struct exit_event *unused_exit_event __attribute__((unused));
const struct syscall_event *unused_syscall_event __attribute__((unused));
const struct trace_config *unused_trace_config __attribute__((unused));
const struct count_key *unused_count_key __attribute__((unused));
const enum denial *unused_denial __attribute__((unused));
const enum denial_watch *unused_denial_watch __attribute__((unused));
const enum deny_flag *unused_deny_flag __attribute__((unused));

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct trace_config);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tr_config SEC(".maps");

/* Exact syscall totals per sandbox and syscall, per CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct count_key);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tr_syscall_counts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct pathwalk);
} tr_scratch SEC(".maps");

/* Denial watch set, filled from Go: DW_* per x86_64 syscall number; all
 * zero when denials are not recorded. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, WATCH_NRS);
	__type(key, __u32);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tr_denial_watch SEC(".maps");

/* Per task: the watched syscall sys_enter saw last (nr + 1, 0: none),
 * cleared at sys_exit. Pinned, so the programs of an old and a new agent
 * share it while their links overlap. */
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tr_syscall_entered SEC(".maps");

static __always_inline bool is_module_nr(long nr)
{
	return nr == NR_init_module || nr == NR_finit_module || nr == NR_kexec_load ||
	       nr == NR_kexec_file_load;
}

static __always_inline __u32 watch_flags(long nr)
{
	if (nr < 0 || nr >= WATCH_NRS)
		return 0;
	__u32 k = nr;
	__u32 *w = bpf_map_lookup_elem(&tr_denial_watch, &k);
	return w ? *w : 0;
}

static __always_inline bool in_ia32_syscall(struct task_struct *task)
{
	return BPF_CORE_READ(task, thread_info.status) & TS_COMPAT;
}

/* mark_entered records that sys_enter saw syscall nr (see trace_sys_exit). */
static __always_inline void mark_entered(struct task_struct *task, long nr, bool ia32)
{
	__u32 *m = bpf_task_storage_get(&tr_syscall_entered, task, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (m)
		*m = ((__u32)nr + 1) | (ia32 ? ENTERED_IA32 : 0);
}

static __always_inline void fill_args(struct syscall_event *e, struct pt_regs *regs)
{
	e->args[0] = BPF_CORE_READ(regs, di);
	e->args[1] = BPF_CORE_READ(regs, si);
	e->args[2] = BPF_CORE_READ(regs, dx);
	e->args[3] = BPF_CORE_READ(regs, r10);
	e->args[4] = BPF_CORE_READ(regs, r8);
	e->args[5] = BPF_CORE_READ(regs, r9);
}

SEC("tp_btf/sys_enter")
int BPF_PROG(trace_sys_enter, struct pt_regs *regs, long id)
{
	__u32 zero = 0;
	struct trace_config *cfg = bpf_map_lookup_elem(&tr_config, &zero);
	if (!cfg)
		return 0;
	bool module = cfg->module_alerts && is_module_nr(id);
	__u32 every = cfg->sample_every;
	/* Every i386 syscall is watched: the launcher's arch guard refuses
	 * them all, and their numbers mean other syscalls in the watch set. */
	struct task_struct *task = NULL;
	bool ia32 = false, mark = false;
	if (cfg->record_denials) {
		task = bpf_get_current_task_btf();
		ia32 = in_ia32_syscall(task);
		mark = ia32 || (watch_flags(id) & DW_SECCOMP);
	}
	if (!every && !module && !mark)
		return 0;
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb)
		return 0;
	if (mark)
		mark_entered(task, id, ia32);

	__u64 count = 0;
	bool sample = false;
	if (every) {
		struct count_key k = { .sandbox_cg = root, .nr = (__u32)id };
		__u64 *c = bpf_map_lookup_elem(&tr_syscall_counts, &k);
		if (c) {
			count = ++*c;
		} else {
			__u64 one = 1;
			bpf_map_update_elem(&tr_syscall_counts, &k, &one, BPF_NOEXIST);
			count = 1;
		}
		sample = every == 1 || count % every == 0;
	}
	if (!module && !sample)
		return 0;

	if (!module) {
		/* A sample: the record ends before path (SYSCALL_SAMPLE_SIZE). */
		struct syscall_event *e = reserve_event(SYSCALL_SAMPLE_SIZE, false);
		if (!e)
			return 0;
		fill_hdr(&e->hdr, EV_SYSCALL, VERDICT_ALLOWED, 0, root, sb);
		e->nr = id;
		e->count = every;
		fill_args(e, regs);
		e->ret = 0;
		e->open_flags = 0;
		e->denial = DENIAL_NONE;
		e->flags = 0;
		submit_event(e, false);
		return 0;
	}

	struct syscall_event *e = reserve_event(sizeof(*e), true);
	if (!e)
		return 0;
	fill_hdr(&e->hdr, EV_SYSCALL, effective_verdict(sb, ACTION_RECORD), cfg->module_rule_id, root, sb);
	e->nr = id;
	e->count = 1;
	fill_args(e, regs);
	e->ret = 0;
	e->open_flags = 0;
	e->denial = DENIAL_NONE;
	e->flags = 0;
	e->path[0] = 0;
	if (id == NR_finit_module || id == NR_kexec_file_load) {
		struct file *f = pw_fd_file(e->args[0]);
		struct pathwalk *pw = bpf_map_lookup_elem(&tr_scratch, &zero);
		if (f && pw) {
			pw_resolve_file(pw, f);
			bpf_probe_read_kernel_str(e->path, sizeof(e->path), pw->buf);
		}
	}
	submit_event(e, true);
	return 0;
}

/* Where the open family keeps its path argument, and its open flags. */
static __always_inline int open_path_arg(long nr)
{
	switch (nr) {
	case NR_openat:
	case NR_openat2:
	case NR_execveat:
	case NR_rename:
	case NR_link:
	case NR_symlink:
	case NR_mkdirat:
	case NR_mknodat:
	case NR_unlinkat:
		return 1;
	case NR_symlinkat:
		return 2;
	case NR_linkat:
	case NR_renameat:
	case NR_renameat2:
		return 3;
	}
	return 0;
}

static __always_inline __u64 open_flags_of(long nr, struct pt_regs *regs)
{
	switch (nr) {
	case NR_open:
		return BPF_CORE_READ(regs, si);
	case NR_openat:
		return BPF_CORE_READ(regs, dx);
	case NR_creat:
		return O_CREAT | O_WRONLY | O_TRUNC;
	case NR_openat2: {
		__u64 f = 0;
		bpf_probe_read_user(&f, sizeof(f), (void *)BPF_CORE_READ(regs, dx));
		return f;
	}
	}
	return 0;
}

/* launcher_task says the task runs under what `watcher exec` applies (a
 * seccomp filter and no_new_privs): other tasks' refusals are not
 * attributed. */
static __always_inline bool launcher_task(struct task_struct *task)
{
	return BPF_CORE_READ(task, seccomp.mode) == SECCOMP_MODE_FILTER &&
	       (BPF_CORE_READ(task, atomic_flags) & (1UL << PFA_NO_NEW_PRIVS));
}

/* record_denial sends the refusal of syscall nr (its saved registers regs,
 * its result ret) as a denial record; flags are DENY_F_* known already. */
static __always_inline void record_denial(struct task_struct *task, struct pt_regs *regs, long nr, long ret,
					  __u32 denial, __u32 flags, bool ia32, __u64 root, struct sandbox *sb)
{
	struct syscall_event *e = reserve_event(sizeof(*e), true);
	if (!e)
		return;
	/* The kernel refused: DENIED even in record-only sandboxes. */
	fill_hdr(&e->hdr, EV_SYSCALL, VERDICT_DENIED, 0, root, sb);
	e->nr = nr;
	e->count = 1;
	e->args[0] = BPF_CORE_READ(regs, di);
	e->args[1] = BPF_CORE_READ(regs, si);
	e->args[2] = BPF_CORE_READ(regs, dx);
	e->args[3] = BPF_CORE_READ(regs, r10);
	e->args[4] = BPF_CORE_READ(regs, r8);
	e->args[5] = BPF_CORE_READ(regs, r9);
	if (ia32) {
		/* i386 argument registers: ebx, ecx, edx, esi, edi, ebp. */
		e->args[0] = BPF_CORE_READ(regs, bx);
		e->args[1] = BPF_CORE_READ(regs, cx);
		e->args[2] = BPF_CORE_READ(regs, dx);
		e->args[3] = BPF_CORE_READ(regs, si);
		e->args[4] = BPF_CORE_READ(regs, di);
		e->args[5] = BPF_CORE_READ(regs, bp);
		flags |= DENY_F_IA32;
	}
	e->ret = ret;
	e->denial = denial;
	e->flags = flags;
	e->open_flags = 0;
	e->path[0] = 0;
	/* kernel_cap_t is a u64 since 6.3 and was two u32 before: the low
	 * 32 bits are at the start either way (little endian). */
	const struct cred *cred = BPF_CORE_READ(task, cred);
	__u32 caps = 0;
	bpf_probe_read_kernel(&caps, sizeof(caps), __builtin_preserve_access_index(&cred->cap_effective));
	if (caps & (1U << CAP_DAC_OVERRIDE))
		e->flags |= DENY_F_DAC_OVERRIDE;
	if (denial == DENIAL_OPEN) {
		e->open_flags = open_flags_of(nr, regs);
		void *p = (void *)e->args[open_path_arg(nr) & 3];
		long n = bpf_probe_read_user_str(e->path, sizeof(e->path), p);
		if (n < 0) {
			e->path[0] = 0;
			e->flags |= DENY_F_PATH_UNREADABLE;
		} else if (n == sizeof(e->path)) {
			e->flags |= DENY_F_PATH_TRUNCATED;
		}
	}
	submit_event(e, true);
}

/* Refusals the launcher's seccomp filter and Landlock ruleset made, seen
 * at sys_exit: the fallback where fexit programs do not load (see
 * recorder_fexit.h for the rest). */
SEC("tp_btf/sys_exit")
int BPF_PROG(trace_sys_exit, struct pt_regs *regs, long ret)
{
	long nr = BPF_CORE_READ(regs, orig_ax);
	struct task_struct *task = bpf_get_current_task_btf();
	bool ia32 = in_ia32_syscall(task);
	__u32 w = 0;
	if (ia32) {
		/* Rare: worth the config lookup the common path avoids. */
		__u32 zero = 0;
		struct trace_config *cfg = bpf_map_lookup_elem(&tr_config, &zero);
		if (cfg && cfg->record_denials)
			w = DW_SECCOMP;
	} else {
		w = watch_flags(nr);
	}
	if (!w)
		return 0;
	bool refused = ret == -EPERM || ret == -EACCES;
	/* A seccomp-watched syscall's mark must be cleared whatever the
	 * result; other watched syscalls only matter when refused. */
	if (!refused && !(w & DW_SECCOMP))
		return 0;
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb)
		return 0;

	__u32 denial = DENIAL_NONE;
	if (w & DW_SECCOMP) {
		__u32 *m = bpf_task_storage_get(&tr_syscall_entered, task, 0, 0);
		__u32 want = ((__u32)nr + 1) | (ia32 ? ENTERED_IA32 : 0);
		bool entered = m && *m == want;
		if (m)
			*m = 0;
		if (ret == -EPERM && !entered)
			denial = DENIAL_SECCOMP;
	}
	if (denial == DENIAL_NONE && (w & DW_OPEN) && refused && !ia32)
		denial = DENIAL_OPEN;
	if (denial == DENIAL_NONE)
		return 0;
	if (!launcher_task(task))
		return 0;
	record_denial(task, regs, nr, ret, denial, 0, ia32, root, sb);
	return 0;
}

#include "recorder_fexit.h"

static __always_inline void fill_ancestors(struct ancestor *a, struct task_struct *task)
{
	struct task_struct *p = BPF_CORE_READ(task, real_parent);
	for (int i = 0; i < ANCESTORS; i++) {
		if (!p) {
			a[i].pid = 0;
			a[i].comm[0] = 0;
			continue;
		}
		a[i].pid = BPF_CORE_READ(p, tgid);
		BPF_CORE_READ_STR_INTO(&a[i].comm, p, comm);
		struct task_struct *next = BPF_CORE_READ(p, real_parent);
		p = (next == p || a[i].pid <= 1) ? NULL : next;
	}
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(trace_exec, struct task_struct *task, pid_t old_pid, struct linux_binprm *bprm)
{
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb)
		return 0;
	__u32 zero = 0;
	struct pathwalk *pw = bpf_map_lookup_elem(&tr_scratch, &zero);
	if (!pw)
		return 0;
	struct exec_event *e = reserve_event(sizeof(*e), false);
	if (!e)
		return 0;
	fill_hdr(&e->hdr, EV_EXEC, VERDICT_ALLOWED, 0, root, sb);
	e->old_pid = old_pid;
	fill_ancestors(e->ancestors, task);

	struct file *f = BPF_CORE_READ(bprm, file);
	pw_resolve_file(pw, f);
	e->path_flags = pw->flags;
	bpf_probe_read_kernel_str(e->exe, sizeof(e->exe), pw->buf);

	unsigned long start = BPF_CORE_READ(task, mm, arg_start);
	unsigned long end = BPF_CORE_READ(task, mm, arg_end);
	__u64 total = end > start ? end - start : 0;
	__u64 n = total < ARGS_LEN ? total : ARGS_LEN;
	e->args_total = total;
	e->args_len = 0;
	if (n && !bpf_probe_read_user(e->args, n & (ARGS_LEN - 1) ? n & (ARGS_LEN - 1) : ARGS_LEN, (void *)start))
		e->args_len = n;
	submit_event(e, false);
	return 0;
}

/* Process exit: the last thread of the group (signal->live reached 0). */
SEC("tp_btf/sched_process_exit")
int BPF_PROG(trace_exit, struct task_struct *task)
{
	if (BPF_CORE_READ(task, signal, live.counter) != 0)
		return 0;
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb)
		return 0;
	struct exit_event *e = reserve_event(sizeof(*e), false);
	if (!e)
		return 0;
	fill_hdr(&e->hdr, EV_EXIT, VERDICT_ALLOWED, 0, root, sb);
	/* SIGNAL_GROUP_EXIT: the group's status, not this thread's. */
	if (BPF_CORE_READ(task, signal, flags) & 0x00000004)
		e->exit_code = BPF_CORE_READ(task, signal, group_exit_code);
	else
		e->exit_code = BPF_CORE_READ(task, exit_code);
	e->pad = 0;
	fill_ancestors(e->ancestors, task);
	submit_event(e, false);
	return 0;
}
