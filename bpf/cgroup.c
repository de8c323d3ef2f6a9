//go:build ignore

/* cgroup BPF hooks: device access, sysctl access, socket creation and
 * inbound listeners from sandbox cgroups, refused with a real EPERM before
 * the operation (listeners: see "listeners" below for the one case judged
 * after listen(2) returns).
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
#include <bpf/bpf_endian.h>
#include "listen.h"

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

/* mark_own marks sk (a socket, or the cgroup/sock_create context) as the
 * current task's, of sandbox sb. Only where the task helpers run
 * (sock_create, bind). */
static __always_inline void mark_own(void *sk, __u64 root, struct sandbox *sb)
{
	struct listen_mark *m = bpf_sk_storage_get(&cg_listen_socks, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!m)
		return;
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	m->sandbox_cg = root;
	m->sandbox_id = sb->id;
	m->cgroup_id = bpf_get_current_cgroup_id();
	m->pid = (__u32)pid_tgid;
	m->tgid = pid_tgid >> 32;
	m->uid = (__u32)bpf_get_current_uid_gid();
	bpf_get_current_comm(&m->comm, sizeof(m->comm));
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
	/* The sandbox's own socket (listeners below, egress.c). */
	mark_own(ctx, root, sb);

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

/* ---- listeners ----
 *
 * A sandbox may bind a loopback address (127.0.0.0/8, ::1, v4-mapped
 * 127/8) on any port; any other address, the wildcards 0.0.0.0 and ::
 * included, only on a listed port. cgroup/bind4 and bind6 refuse the rest
 * with EPERM. Port 0 (the kernel picks one) is a client's bind and passes,
 * as does UDP autobind on sendto: those are not servers.
 *
 * listen(2) on an unbound TCP socket (or one bound to port 0) gets an
 * ephemeral port on the wildcard address and runs no bind hook
 * (inet_autobind). No cgroup hook can refuse listen(2) itself: sockops'
 * TCP_LISTEN_CB runs right after the socket enters LISTEN and records it,
 * and the cgroup_skb ingress program drops every packet from another host
 * to a sandbox listener the policy does not allow, so such a listener
 * never sees a connection from outside (its SYNs go unanswered). Packets
 * addressed to a loopback destination still reach it: the kernel drops
 * 127/8 and ::1 destinations arriving from other interfaces (martians;
 * route_localnet is a sysctl the sandbox cannot write).
 *
 * A sandbox socket bound to an address and port where a socket the
 * sandbox does not own already listens (TCP) or is bound (UDP) is refused
 * too: with SO_REUSEPORT under the same uid the kernel would share the
 * host service's connections or datagrams with it (systemd-resolved on
 * 127.0.0.53:53, a local database). Without SO_REUSEPORT the bind would
 * fail with EADDRINUSE anyway. The owner is the socket storage mark set
 * below on every socket the sandbox binds or listens on.
 */

#define ETH_P_IP 0x0800
#define ETH_P_IPV6 0x86DD
#define MAX_LISTEN_RANGES 16

enum listen_op {
	LISTEN_OP_BIND = 1,     /* bind to a non-loopback address, port not listed */
	LISTEN_OP_LISTEN = 2,   /* listen(2) on such an address and port (autobind) */
	LISTEN_OP_TAKEOVER = 3, /* bind onto a port another's socket holds */
};

struct listen_range {
	__u16 lo, hi; /* inclusive, host order */
};

/* Per sandbox id; a sandbox without an entry may listen anywhere. */
struct listen_cfg {
	__u32 action;  /* enum action for a refused bind or listener */
	__u32 rule_id;
	__u32 n;       /* ranges used */
	__u32 pad;
	struct listen_range ranges[MAX_LISTEN_RANGES];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_SANDBOXES);
	__type(key, __u32);
	__type(value, struct listen_cfg);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cg_listen_rules SEC(".maps");

struct listen_event {
	struct event_hdr hdr;
	__u32 family;
	__u32 type;
	__u32 protocol;
	__u16 port; /* host order */
	__u8 op;    /* enum listen_op */
	__u8 pad;
	__u32 addr[4]; /* network order; IPv4 in addr[0] */
};

const struct listen_cfg *unused_listen_cfg __attribute__((unused));
const struct listen_event *unused_listen_event __attribute__((unused));

static __always_inline bool port_listed(const struct listen_cfg *c, __u16 port)
{
	for (int i = 0; i < MAX_LISTEN_RANGES; i++) {
		if (i >= c->n)
			break;
		if (port >= c->ranges[i].lo && port <= c->ranges[i].hi)
			return true;
	}
	return false;
}

/* mark_fill_hdr is cg_fill_hdr for sockops, which has no task helpers on
 * older kernels (6.1): the process is the one the mark names. */
static __always_inline void mark_fill_hdr(struct event_hdr *h, __u32 kind, __u32 verdict,
					  __u32 rule_id, const struct listen_mark *m)
{
	h->ts_ns = bpf_ktime_get_boot_ns();
	h->cgroup_id = m->cgroup_id;
	h->sandbox_cg = m->sandbox_cg;
	h->pid = m->pid;
	h->tgid = m->tgid;
	h->ppid = 0;
	h->uid = m->uid;
	h->kind = kind;
	h->verdict = verdict;
	h->rule_id = rule_id;
	h->sandbox_id = m->sandbox_id;
	__builtin_memcpy(h->comm, m->comm, sizeof(h->comm));
}

/* listen_report sends a listen_event; the process is the current task,
 * or with mark set (sockops) the one the mark names. */
static __always_inline void listen_report(__u8 op, __u32 verdict, const struct listen_cfg *c,
					  __u64 root, struct sandbox *sb, const struct listen_mark *mark,
					  __u32 family, __u32 type, __u32 protocol, __u16 port,
					  const __u32 addr[4])
{
	struct listen_event *e = reserve_event(sizeof(*e), true);
	if (!e)
		return;
	if (mark)
		mark_fill_hdr(&e->hdr, EV_LISTEN, verdict, c->rule_id, mark);
	else
		cg_fill_hdr(&e->hdr, EV_LISTEN, verdict, c->rule_id, root, sb);
	e->family = family;
	e->type = type;
	e->protocol = protocol;
	e->port = port;
	e->op = op;
	e->pad = 0;
	e->addr[0] = addr[0];
	e->addr[1] = addr[1];
	e->addr[2] = addr[2];
	e->addr[3] = addr[3];
	submit_event(e, true);
}

/* held_by_another reports whether a socket the sandbox does not own
 * already receives what a socket bound to addr:port would: a TCP listener
 * or a bound UDP socket. A wildcard bind is checked at the loopback
 * address, where a host service listening on the wildcard is found too. */
static __always_inline bool held_by_another(struct bpf_sock_addr *ctx, __u32 family,
					    const __u32 addr[4], __u16 port, __u32 sandbox_id)
{
	__u32 a[4] = { addr[0], addr[1], addr[2], addr[3] };
	if (family == AF_INET) {
		if (!a[0])
			a[0] = bpf_htonl(0x7f000001);
	} else if (!(a[0] | a[1] | a[2] | a[3])) {
		a[3] = bpf_htonl(1);
	} else if (v4_mapped(a) && !a[3]) {
		a[3] = bpf_htonl(0x7f000001);
	}
	__u32 owner = 0;
	if (!listen_holder(ctx, family, a, port, &owner))
		return false;
	return owner != sandbox_id;
}

static __always_inline int judge_bind(struct bpf_sock_addr *ctx, __u32 family, const __u32 addr[4],
				      bool loopback)
{
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb)
		return 1;
	struct listen_cfg *c = bpf_map_lookup_elem(&cg_listen_rules, &sb->id);
	if (!c)
		return 1;
	__u16 port = bpf_ntohs((__u16)ctx->user_port);
	if (port == 0) {
		/* The kernel picks one: a client, or a server judged at
		 * listen (sockops). A loopback one is marked the sandbox's
		 * own, so its own clients reach it (egress.c). */
		if (loopback)
			mark_own(ctx->sk, root, sb);
		return 1;
	}

	__u8 op = 0;
	if (!loopback && !port_listed(c, port))
		op = LISTEN_OP_BIND;
	else if (held_by_another(ctx, family, addr, port, sb->id))
		op = LISTEN_OP_TAKEOVER;
	if (!op) {
		mark_own(ctx->sk, root, sb);
		return 1;
	}
	__u32 action = c->action == ACTION_KILL ? ACTION_BLOCK : c->action;
	__u32 verdict = effective_verdict(sb, action);
	if (verdict == VERDICT_ALLOWED) {
		mark_own(ctx->sk, root, sb);
		return 1;
	}
	listen_report(op, verdict, c, root, sb, NULL, family, ctx->type, ctx->protocol, port, addr);
	if (verdict == VERDICT_DENIED)
		return 0;
	mark_own(ctx->sk, root, sb);
	return 1;
}

SEC("cgroup/bind4")
int watcher_cg_bind4(struct bpf_sock_addr *ctx)
{
	__u32 a[4] = { ctx->user_ip4, 0, 0, 0 };
	return judge_bind(ctx, AF_INET, a, v4_loopback(a[0]));
}

SEC("cgroup/bind6")
int watcher_cg_bind6(struct bpf_sock_addr *ctx)
{
	__u32 a[4] = { ctx->user_ip6[0], ctx->user_ip6[1], ctx->user_ip6[2], ctx->user_ip6[3] };
	return judge_bind(ctx, AF_INET6, a, v6_loopback(a));
}

/* sock_mark returns a socket's mark; an MPTCP subflow (a kernel socket,
 * no sock_create hook) has its connection's, the socket the sandbox made. */
static __always_inline struct listen_mark *sock_mark(struct bpf_sock *sk)
{
	struct listen_mark *m = bpf_sk_storage_get(&cg_listen_socks, sk, 0, 0);
	if (m)
		return m;
	struct mptcp_sock *msk = bpf_skc_to_mptcp_sock(sk);
	if (!msk)
		return NULL;
	return bpf_sk_storage_get(&cg_listen_socks, msk, 0, 0);
}

/* sock_local reads a socket's local address and port (host order) and
 * returns its family. */
static __always_inline __u32 sock_local(struct bpf_sock *sk, __u32 a[4], __u16 *port)
{
	__u32 family = sk->family;
	if (family == AF_INET) {
		a[0] = sk->src_ip4;
	} else {
		a[0] = sk->src_ip6[0];
		a[1] = sk->src_ip6[1];
		a[2] = sk->src_ip6[2];
		a[3] = sk->src_ip6[3];
	}
	*port = (__u16)sk->src_port;
	return family;
}

/* listener_allowed judges a listening socket's local address and port. */
static __always_inline bool listener_allowed(const struct listen_cfg *c, __u32 family,
					     const __u32 addr[4], __u16 port)
{
	bool loopback = family == AF_INET ? v4_loopback(addr[0]) : v6_loopback(addr);
	return loopback || port_listed(c, port);
}

/* TCP_LISTEN_CB runs in listen(2), after the socket entered LISTEN; its
 * return value is ignored, so this records the listener, and the ingress
 * program below keeps other hosts' connections from it. The sandbox is
 * the socket's (its mark from sock_create or bind): sockops on older
 * kernels (6.1) has no current-task or cgroup helpers. */
SEC("sockops")
int watcher_cg_sockops(struct bpf_sock_ops *ops)
{
	if (ops->op != BPF_SOCK_OPS_TCP_LISTEN_CB)
		return 1;
	struct bpf_sock *sk = ops->sk;
	if (!sk)
		return 1;
	struct listen_mark *m = sock_mark(sk);
	if (!m)
		return 1;
	struct sandbox *sb = bpf_map_lookup_elem(&sandboxes, &m->sandbox_cg);
	if (!sb || sb->id != m->sandbox_id)
		return 1;
	struct listen_cfg *c = bpf_map_lookup_elem(&cg_listen_rules, &m->sandbox_id);
	if (!c)
		return 1;

	__u32 a[4] = {};
	__u16 port;
	__u32 family = sock_local(sk, a, &port);
	if (listener_allowed(c, family, a, port))
		return 1;
	__u32 action = c->action == ACTION_KILL ? ACTION_BLOCK : c->action;
	__u32 verdict = effective_verdict(sb, action);
	if (verdict != VERDICT_ALLOWED)
		listen_report(LISTEN_OP_LISTEN, verdict, c, m->sandbox_cg, sb, m, family,
			      SOCK_STREAM, IPPROTO_TCP, port, a);
	return 1;
}

/* Drops packets from other hosts to a sandbox listener the policy does not
 * allow (judged now, so a reload that lists the port lets them in). Runs
 * for every packet delivered to a sandbox socket; everything but a
 * listener returns at the state check. */
SEC("cgroup_skb/ingress")
int watcher_cg_listen_ingress(struct __sk_buff *skb)
{
	struct bpf_sock *sk = skb->sk;
	if (!sk)
		return 1;
	sk = bpf_sk_fullsock(sk);
	if (!sk || sk->state != BPF_TCP_LISTEN)
		return 1;
	struct listen_mark *m = sock_mark(sk);
	if (!m)
		return 1;
	struct listen_cfg *c = bpf_map_lookup_elem(&cg_listen_rules, &m->sandbox_id);
	if (!c)
		return 1;
	struct sandbox *sb = bpf_map_lookup_elem(&sandboxes, &m->sandbox_cg);
	if (!sb || sb->id != m->sandbox_id)
		return 1; /* the sandbox is gone or its id was reused */

	__u32 a[4] = {};
	__u16 port;
	__u32 family = sock_local(sk, a, &port);
	if (listener_allowed(c, family, a, port))
		return 1;
	__u32 action = c->action == ACTION_KILL ? ACTION_BLOCK : c->action;
	if (effective_verdict(sb, action) != VERDICT_DENIED)
		return 1;

	/* A loopback destination comes from this host (see above). */
	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		__u32 daddr;
		if (bpf_skb_load_bytes(skb, 16, &daddr, sizeof(daddr)) == 0 && v4_loopback(daddr))
			return 1;
	} else if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		__u32 d[4];
		if (bpf_skb_load_bytes(skb, 24, d, sizeof(d)) == 0 && v6_loopback(d))
			return 1;
	}
	return 0;
}
