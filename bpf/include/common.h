/* Shared definitions for every watcher BPF object: the sandbox set, the
 * event header, the two ring buffers and their drop counters.
 *
 * Every map here is pinned by name, so all objects loaded with the same
 * pin path share one instance (the first load creates it, later loads and
 * later agents adopt it).
 */
#pragma once

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>

#define EPERM 1

#ifndef LIBBPF_PIN_BY_NAME
#define LIBBPF_PIN_BY_NAME 1
#endif

/* Deepest cgroup level checked for sandbox membership. */
#define MAX_CGROUP_DEPTH 32
#define MAX_SANDBOXES 4096
#define PATH_MAX_LEN 256
#define TASK_COMM_LEN 16

/* Ring buffer wakeups are batched: a submit wakes the reader only when the
 * data pending in the ring has just passed a multiple of WAKEUP_BYTES; the Go
 * reader also polls on a short deadline. Waking per event caps near 150k
 * events/s on a 2-core host, batching reaches ~600k. */
#define WAKEUP_BYTES (64 * 1024)
/* A submit wakes when pending lands in the first WAKEUP_WINDOW bytes past a
 * multiple of WAKEUP_BYTES. Every record (event plus its 8-byte ring header)
 * is shorter than this, so a producer cannot step over a window. */
#define WAKEUP_WINDOW 1024

enum action {
	ACTION_ALLOW = 0,
	ACTION_RECORD = 1,
	ACTION_BLOCK = 2,
	ACTION_KILL = 3,
};

enum verdict {
	VERDICT_ALLOWED = 0,
	VERDICT_RECORDED = 1,
	VERDICT_DENIED = 2,
	VERDICT_KILLED = 3,
};

/* Kinds of kernel events; Go maps them to audit.Kind. */
enum event_kind {
	EV_FILE_OPEN = 1,
	EV_PTRACE = 2,
	EV_MOUNT = 3,
	EV_MODULE = 4,
	EV_BPF = 5,
	EV_CAPABILITY = 6,
	EV_SIGNAL = 7,
	EV_EXEC = 8,
	EV_EXIT = 9,
	EV_SYSCALL = 10,
	EV_DEVICE = 11,
	EV_SYSCTL = 12,
	EV_SOCKET = 13,
	EV_NET = 14,
	EV_CGROUP_MOVE = 15,
	EV_FILE_OP = 16,   /* LSM path operations (unlink, rename, chmod...): struct file_event, lsm_events.h */
	EV_OPERATION = 17, /* LSM operations judged as a whole (perf_event_open...): struct task_event */
	EV_LSM_SOCKET = 18, /* LSM socket_create: struct sock_event, lsm_socket.h */
	EV_LSM_UNIX = 19,   /* LSM unix_stream_connect, unix_may_send: struct sock_event, lsm_socket.h */
	EV_LISTEN = 23,     /* cgroup bind4/bind6 and sockops listen: struct listen_event of cgroup.c */
	/* 64 and up: EV_FMOD_RET + an LSM kind (bpf/include/lsm_hook.h) */
};

/* Value of the sandboxes map, keyed by the sandbox root's cgroup v2 id. */
struct sandbox {
	__u32 id;      /* policy index of the sandbox, > 0 */
	__u32 flags;   /* SANDBOX_F_* */
};

#define SANDBOX_F_RECORD_ONLY 1 /* downgrade block/kill to record */

/* Common header at the start of every event. */
struct event_hdr {
	__u64 ts_ns;       /* bpf_ktime_get_boot_ns */
	__u64 cgroup_id;   /* the task's own cgroup */
	__u64 sandbox_cg;  /* the sandbox root cgroup that matched */
	__u32 pid;         /* thread id */
	__u32 tgid;        /* process id */
	__u32 ppid;        /* parent's tgid */
	__u32 uid;
	__u32 kind;        /* enum event_kind */
	__u32 verdict;     /* enum verdict */
	__u32 rule_id;     /* policy rule that matched, 0 for none */
	__u32 sandbox_id;
	__u8 comm[TASK_COMM_LEN];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_SANDBOXES);
	__type(key, __u64);
	__type(value, struct sandbox);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sandboxes SEC(".maps");

/* Generation of the sandbox set; the agent bumps it after every change so
 * the per-cgroup membership cache below is recomputed. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sandbox_gen SEC(".maps");

struct membership {
	__u64 gen;
	__u64 sandbox_cg; /* 0: not in any sandbox */
	struct sandbox sb;
};

/* Cache of cgroup id -> sandbox membership, so processes outside every
 * sandbox pay one lookup, not a walk over their ancestors. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, struct membership);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} membership_cache SEC(".maps");

/* Alerts (denials, dangerous operations): never sampled. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 8 * 1024 * 1024);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} alert_events SEC(".maps");

/* Routine events (exec, exit, sampled syscalls). */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 16 * 1024 * 1024);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} routine_events SEC(".maps");

enum drop_index {
	DROP_ALERT = 0,
	DROP_ROUTINE = 1,
	DROP_MAX = 2,
};

/* Failed ring buffer reservations per CPU, indexed by enum drop_index. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, DROP_MAX);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ringbuf_drops SEC(".maps");

/* Pid of the agent (tgid), protected from signals and ptrace from sandboxes. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} agent_tgid SEC(".maps");

const struct event_hdr *unused_event_hdr __attribute__((unused));
const struct sandbox *unused_sandbox __attribute__((unused));

/* lookup_sandbox returns the sandbox the current task is in (its own cgroup
 * or any ancestor is a sandbox root), or NULL. *root receives the root's id. */
static __always_inline struct sandbox *lookup_sandbox_cg(__u64 cg, __u64 *root)
{
	__u32 zero = 0;
	__u64 *genp = bpf_map_lookup_elem(&sandbox_gen, &zero);
	__u64 gen = genp ? *genp : 0;

	struct membership *m = bpf_map_lookup_elem(&membership_cache, &cg);
	if (m && m->gen == gen) {
		if (!m->sandbox_cg)
			return NULL;
		*root = m->sandbox_cg;
		return &m->sb;
	}

	struct membership fresh = { .gen = gen };
	/* Walk from the root down so the outermost sandbox wins: a sandbox
	 * cannot escape its parent's policy by being registered itself. */
	for (int level = 1; level <= MAX_CGROUP_DEPTH; level++) {
		__u64 anc = bpf_get_current_ancestor_cgroup_id(level);
		if (!anc)
			break;
		struct sandbox *s = bpf_map_lookup_elem(&sandboxes, &anc);
		if (s) {
			fresh.sandbox_cg = anc;
			fresh.sb = *s;
			break;
		}
		if (anc == cg)
			break;
	}
	bpf_map_update_elem(&membership_cache, &cg, &fresh, BPF_ANY);
	m = bpf_map_lookup_elem(&membership_cache, &cg);
	if (!m || !m->sandbox_cg)
		return NULL;
	*root = m->sandbox_cg;
	return &m->sb;
}

static __always_inline struct sandbox *current_sandbox(__u64 *root)
{
	return lookup_sandbox_cg(bpf_get_current_cgroup_id(), root);
}

/* effective_verdict applies the sandbox's record-only mode to an action. */
static __always_inline __u32 effective_verdict(struct sandbox *sb, __u32 action)
{
	if (action == ACTION_ALLOW)
		return VERDICT_ALLOWED;
	if (action == ACTION_RECORD || (sb->flags & SANDBOX_F_RECORD_ONLY))
		return VERDICT_RECORDED;
	if (action == ACTION_KILL)
		return VERDICT_KILLED;
	return VERDICT_DENIED;
}

static __always_inline void fill_hdr(struct event_hdr *h, __u32 kind, __u32 verdict,
				     __u32 rule_id, __u64 sandbox_cg, struct sandbox *sb)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
	__u64 pid_tgid = bpf_get_current_pid_tgid();

	h->ts_ns = bpf_ktime_get_boot_ns();
	h->cgroup_id = bpf_get_current_cgroup_id();
	h->sandbox_cg = sandbox_cg;
	h->pid = (__u32)pid_tgid;
	h->tgid = pid_tgid >> 32;
	h->ppid = BPF_CORE_READ(task, real_parent, tgid);
	h->uid = (__u32)bpf_get_current_uid_gid();
	h->kind = kind;
	h->verdict = verdict;
	h->rule_id = rule_id;
	h->sandbox_id = sb ? sb->id : 0;
	bpf_get_current_comm(&h->comm, sizeof(h->comm));
}

/* reserve_event reserves size bytes on the alert or routine ring, counting
 * a failed reservation. */
static __always_inline void *reserve_event(__u64 size, bool alert)
{
	void *e = alert ? bpf_ringbuf_reserve(&alert_events, size, 0)
			: bpf_ringbuf_reserve(&routine_events, size, 0);
	if (!e) {
		__u32 idx = alert ? DROP_ALERT : DROP_ROUTINE;
		__u64 *cnt = bpf_map_lookup_elem(&ringbuf_drops, &idx);
		if (cnt)
			(*cnt)++;
	}
	return e;
}

/* submit_event submits with batched wakeups (see WAKEUP_BYTES): the reader
 * is woken once per WAKEUP_BYTES produced, not on every submit once that much
 * is pending (each wakeup costs the producer an irq_work and a self-IPI, and a
 * reader that lags would otherwise be woken per event). pending includes this
 * event (reserved, not yet committed). */
static __always_inline void submit_event(void *e, bool alert)
{
	__u64 pending = alert ? bpf_ringbuf_query(&alert_events, BPF_RB_AVAIL_DATA)
			      : bpf_ringbuf_query(&routine_events, BPF_RB_AVAIL_DATA);
	bool wake = pending >= WAKEUP_BYTES && (pending & (WAKEUP_BYTES - 1)) < WAKEUP_WINDOW;
	bpf_ringbuf_submit(e, wake ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP);
}

/* is_agent reports whether tgid is the agent's process. */
static __always_inline bool is_agent(__u32 tgid)
{
	__u32 zero = 0;
	__u32 *a = bpf_map_lookup_elem(&agent_tgid, &zero);
	return a && *a && *a == tgid;
}

/* Kinds of the kill backstop's events (bpf/backstop.c): they have their own
 * structs, so their own decoders, apart from the LSM groups' kinds above. */
enum event_kind_backstop {
	EV_KILL_FILE = 32,    /* struct file_event, backstop_maps.h */
	EV_KILL_SYSCALL = 33, /* struct syscall_event, backstop_maps.h */
	EV_KILL_CGROUP = 34,  /* struct cgroup_event, backstop_maps.h */
};
