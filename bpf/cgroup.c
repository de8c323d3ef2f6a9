//go:build ignore

/* cgroup BPF hooks: device access, sysctl access and socket creation from
 * sandbox cgroups, refused with a real EPERM before the operation.
 *
 * Unlike the global hooks these programs attach to each sandbox root cgroup
 * (BPF_F_ALLOW_MULTI, so descendants inherit them and other programs on the
 * same cgroup keep running); the kernel only runs them for tasks in that
 * subtree. The sandbox id and record-only flag still come from the shared
 * sandboxes map, so an attached but unregistered cgroup is left alone.
 *
 * Rule tables are keyed by sandbox id; sandbox id 0 holds the defaults that
 * apply to every sandbox without a matching rule of its own. The first
 * matching rule, most specific first, decides; no match allows.
 */
#include "common.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Wildcard for any field of a rule key. */
#define ANY 0xffffffffu

/* Access bits of cgroup/dev (BPF_DEVCG_ACC_*) and device types. */
#define DEV_ACC_MKNOD 1
#define DEV_ACC_READ 2
#define DEV_ACC_WRITE 4
#define DEV_BLOCK 1
#define DEV_CHAR 2

#define E2BIG 7

#define SYSCTL_NAME_LEN 96
#define SYSCTL_VALUE_LEN 32

struct rule {
	__u32 action;  /* enum action */
	__u32 rule_id; /* policy rule, reported in events */
	__u32 access;  /* devices only: DEV_ACC_* bits the action applies to */
};

struct dev_key {
	__u32 sandbox_id;
	__u32 type;  /* DEV_BLOCK or DEV_CHAR */
	__u32 major; /* or ANY */
	__u32 minor; /* or ANY */
};

struct sysctl_key {
	__u32 sandbox_id;
	__u32 write;                 /* 0 read, 1 write */
	char name[SYSCTL_NAME_LEN];  /* "kernel/sysrq"; all zero for any name */
};

struct sock_key {
	__u32 sandbox_id;
	__u32 family;   /* AF_*, or ANY */
	__u32 type;     /* SOCK_*, or ANY */
	__u32 protocol; /* or ANY */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct dev_key);
	__type(value, struct rule);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cg_dev_rules SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct sysctl_key);
	__type(value, struct rule);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cg_sysctl_rules SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct sock_key);
	__type(value, struct rule);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cg_sock_rules SEC(".maps");

/* The sysctl key is too large for the stack next to the event. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sysctl_key);
} cg_sysctl_scratch SEC(".maps");

struct dev_event {
	struct event_hdr hdr;
	__u32 dev_type; /* DEV_BLOCK or DEV_CHAR */
	__u32 access;   /* DEV_ACC_* requested */
	__u32 major;
	__u32 minor;
};

struct sysctl_event {
	struct event_hdr hdr;
	__u32 write;
	__u32 value_len; /* bytes of value, 0 for reads or unknown */
	char name[SYSCTL_NAME_LEN];
	char value[SYSCTL_VALUE_LEN]; /* start of the new value of a write */
};

struct sock_event {
	struct event_hdr hdr;
	__u32 family;
	__u32 type;
	__u32 protocol;
	__u32 pad;
};

const struct dev_event *unused_dev_event __attribute__((unused));
const struct sysctl_event *unused_sysctl_event __attribute__((unused));
const struct sock_event *unused_sock_event __attribute__((unused));
const struct dev_key *unused_dev_key __attribute__((unused));
const struct sysctl_key *unused_sysctl_key __attribute__((unused));
const struct sock_key *unused_sock_key __attribute__((unused));
const struct rule *unused_rule __attribute__((unused));

/* cg_fill_hdr is fill_hdr without the parent's tgid, so these programs do
 * not need bpf_get_current_task_btf. On 6.18 fill_hdr verifies in all three
 * program types (the helper comes from bpf_base_func_proto for CAP_PERFMON
 * loaders), but cgroup programs on older kernels may lack it, and losing
 * device/sysctl/socket enforcement for a ppid is a bad trade. The Go
 * decoder fills ppid from /proc while the process lives. */
static __always_inline void cg_fill_hdr(struct event_hdr *h, __u32 kind, __u32 verdict,
					__u32 rule_id, __u64 sandbox_cg, struct sandbox *sb)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();

	h->ts_ns = bpf_ktime_get_boot_ns();
	h->cgroup_id = bpf_get_current_cgroup_id();
	h->sandbox_cg = sandbox_cg;
	h->pid = (__u32)pid_tgid;
	h->tgid = pid_tgid >> 32;
	h->ppid = 0;
	h->uid = (__u32)bpf_get_current_uid_gid();
	h->kind = kind;
	h->verdict = verdict;
	h->rule_id = rule_id;
	h->sandbox_id = sb ? sb->id : 0;
	bpf_get_current_comm(&h->comm, sizeof(h->comm));
}

/* verdict_of maps a rule to a verdict: cgroup hooks cannot kill, so a kill
 * rule is enforced as a denial (the operation never happens either way). */
static __always_inline __u32 verdict_of(struct sandbox *sb, struct rule *r)
{
	__u32 action = r->action == ACTION_KILL ? ACTION_BLOCK : r->action;
	return effective_verdict(sb, action);
}

/* ---- devices ---- */

static __always_inline struct rule *dev_lookup(__u32 sandbox_id, __u32 type, __u32 major,
					       __u32 minor)
{
	struct dev_key k = { .sandbox_id = sandbox_id, .type = type, .major = major, .minor = minor };
	struct rule *r = bpf_map_lookup_elem(&cg_dev_rules, &k);
	if (r)
		return r;
	k.minor = ANY;
	r = bpf_map_lookup_elem(&cg_dev_rules, &k);
	if (r)
		return r;
	k.major = ANY;
	return bpf_map_lookup_elem(&cg_dev_rules, &k);
}

SEC("cgroup/dev")
int watcher_cg_dev(struct bpf_cgroup_dev_ctx *ctx)
{
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb)
		return 1;

	__u32 type = ctx->access_type & 0xffff;
	__u32 access = ctx->access_type >> 16;
	struct rule *r = dev_lookup(sb->id, type, ctx->major, ctx->minor);
	if (!r)
		r = dev_lookup(0, type, ctx->major, ctx->minor);
	if (!r || !(r->access & access))
		return 1;

	__u32 verdict = verdict_of(sb, r);
	if (verdict == VERDICT_ALLOWED)
		return 1;

	struct dev_event *e = reserve_event(sizeof(*e), true);
	if (e) {
		cg_fill_hdr(&e->hdr, EV_DEVICE, verdict, r->rule_id, root, sb);
		e->dev_type = type;
		e->access = access;
		e->major = ctx->major;
		e->minor = ctx->minor;
		submit_event(e, true);
	}
	return verdict == VERDICT_DENIED ? 0 : 1;
}

/* ---- sysctl ---- */

SEC("cgroup/sysctl")
int watcher_cg_sysctl(struct bpf_sysctl *ctx)
{
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb)
		return 1;

	__u32 zero = 0;
	struct sysctl_key *k = bpf_map_lookup_elem(&cg_sysctl_scratch, &zero);
	if (!k)
		return 1;
	__builtin_memset(k, 0, sizeof(*k));
	/* Full name, e.g. "kernel/randomize_va_space"; a name longer than the
	 * buffer is truncated (-E2BIG) and only matches "any name" rules. */
	long n = bpf_sysctl_get_name(ctx, k->name, sizeof(k->name), 0);
	bool truncated = n < 0;

	__u32 write = ctx->write ? 1 : 0;
	__u32 sbid = sb->id;
	struct rule *r = NULL;
	/* sandbox: exact name, any name; then defaults: exact name, any name */
	for (int pass = 0; pass < 2 && !r; pass++) {
		k->sandbox_id = pass == 0 ? sbid : 0;
		k->write = write;
		if (!truncated) {
			r = bpf_map_lookup_elem(&cg_sysctl_rules, k);
			if (r)
				break;
		}
		struct sysctl_key any = { .sandbox_id = k->sandbox_id, .write = write };
		r = bpf_map_lookup_elem(&cg_sysctl_rules, &any);
	}
	if (!r)
		return 1;

	__u32 verdict = verdict_of(sb, r);
	if (verdict == VERDICT_ALLOWED)
		return 1;

	struct sysctl_event *e = reserve_event(sizeof(*e), true);
	if (e) {
		cg_fill_hdr(&e->hdr, EV_SYSCTL, verdict, r->rule_id, root, sb);
		e->write = write;
		e->value_len = 0;
		__builtin_memcpy(e->name, k->name, sizeof(e->name));
		__builtin_memset(e->value, 0, sizeof(e->value));
		if (write) {
			long vn = bpf_sysctl_get_new_value(ctx, e->value, sizeof(e->value));
			if (vn == -E2BIG)
				vn = sizeof(e->value) - 1;
			if (vn > 0)
				e->value_len = vn;
		}
		submit_event(e, true);
	}
	return verdict == VERDICT_DENIED ? 0 : 1;
}

/* ---- socket creation ---- */

static __always_inline struct rule *sock_lookup(__u32 sandbox_id, __u32 family, __u32 type,
						__u32 protocol)
{
	/* Most specific first; family-specific patterns before the
	 * any-family one, so "netlink route allowed" beats "raw denied". */
	struct sock_key k = { .sandbox_id = sandbox_id };
	struct rule *r;

	k.family = family, k.type = type, k.protocol = protocol;
	if ((r = bpf_map_lookup_elem(&cg_sock_rules, &k)))
		return r;
	k.type = ANY;
	if ((r = bpf_map_lookup_elem(&cg_sock_rules, &k)))
		return r;
	k.type = type, k.protocol = ANY;
	if ((r = bpf_map_lookup_elem(&cg_sock_rules, &k)))
		return r;
	k.type = ANY;
	if ((r = bpf_map_lookup_elem(&cg_sock_rules, &k)))
		return r;
	k.family = ANY, k.type = type;
	return bpf_map_lookup_elem(&cg_sock_rules, &k);
}

SEC("cgroup/sock_create")
int watcher_cg_sock_create(struct bpf_sock *ctx)
{
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb)
		return 1;

	__u32 family = ctx->family, type = ctx->type, protocol = ctx->protocol;
	struct rule *r = sock_lookup(sb->id, family, type, protocol);
	if (!r)
		r = sock_lookup(0, family, type, protocol);
	if (!r)
		return 1;

	__u32 verdict = verdict_of(sb, r);
	if (verdict == VERDICT_ALLOWED)
		return 1;

	struct sock_event *e = reserve_event(sizeof(*e), true);
	if (e) {
		cg_fill_hdr(&e->hdr, EV_SOCKET, verdict, r->rule_id, root, sb);
		e->family = family;
		e->type = type;
		e->protocol = protocol;
		e->pad = 0;
		submit_event(e, true);
	}
	return verdict == VERDICT_DENIED ? 0 : 1;
}
