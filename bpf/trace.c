//go:build ignore

/* Recording with tracepoints, for sandboxed tasks only:
 * - sys_enter: attempts to load kernel code (init_module, finit_module,
 *   kexec_load, kexec_file_load) as alerts: they fail (ENOSYS on kernels
 *   without module support) but the attempt is what counts; and an optional
 *   sampled stream of all syscalls, counted exactly per sandbox and syscall
 *   in a per-CPU map while only 1 in N travels to user space.
 * - sched_process_exec / sched_process_exit: exec (exe path, argv, parent
 *   chain) and process exit, so every event can be tied to a command line.
 *
 * Outside sandboxes sys_enter costs a config lookup and a compare unless
 * sampling is on (then a membership cache lookup per syscall).
 */
#include "common.h"
#include "pathwalk.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define NR_init_module 175
#define NR_kexec_load 246
#define NR_finit_module 313
#define NR_kexec_file_load 320

#define ANCESTORS 4
#define ARGS_LEN 256

struct trace_config {
	__u32 sample_every;   /* 0: no syscall stream; N: 1 in N per CPU */
	__u32 module_alerts;  /* record kernel-code loading attempts */
	__u32 module_rule_id;
	__u32 pad;
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
	char path[PW_HALF]; /* module/kexec file */
};

const struct exec_event *unused_exec_event __attribute__((unused));
const struct exit_event *unused_exit_event __attribute__((unused));
const struct syscall_event *unused_syscall_event __attribute__((unused));
const struct trace_config *unused_trace_config __attribute__((unused));
const struct count_key *unused_count_key __attribute__((unused));

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

static __always_inline bool is_module_nr(long nr)
{
	return nr == NR_init_module || nr == NR_finit_module || nr == NR_kexec_load ||
	       nr == NR_kexec_file_load;
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
	if (!every && !module)
		return 0;
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb)
		return 0;

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

	struct syscall_event *e = reserve_event(sizeof(*e), module);
	if (!e)
		return 0;
	fill_hdr(&e->hdr, EV_SYSCALL, module ? effective_verdict(sb, ACTION_RECORD) : VERDICT_ALLOWED,
		 module ? cfg->module_rule_id : 0, root, sb);
	e->nr = id;
	e->count = module ? 1 : every;
	e->args[0] = BPF_CORE_READ(regs, di);
	e->args[1] = BPF_CORE_READ(regs, si);
	e->args[2] = BPF_CORE_READ(regs, dx);
	e->args[3] = BPF_CORE_READ(regs, r10);
	e->args[4] = BPF_CORE_READ(regs, r8);
	e->args[5] = BPF_CORE_READ(regs, r9);
	e->path[0] = 0;
	if (module && (id == NR_finit_module || id == NR_kexec_file_load)) {
		struct file *f = pw_fd_file(e->args[0]);
		struct pathwalk *pw = bpf_map_lookup_elem(&tr_scratch, &zero);
		if (f && pw) {
			pw_resolve_file(pw, f);
			bpf_probe_read_kernel_str(e->path, sizeof(e->path), pw->buf);
		}
	}
	submit_event(e, module);
	return 0;
}

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
