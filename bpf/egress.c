//go:build ignore

/* Network egress bound to DNS, for processes in sandbox cgroups.
 *
 * cgroup/connect4/6 and sendmsg4/6 (attached to each sandbox root, inherited
 * by its descendants):
 *   - DNS (TCP or UDP to port 53, any address) is redirected to the sandbox's
 *     DNS proxy; the client's source port is recorded so the proxy can tell
 *     which sandbox asked (egress_dns_clients_ns), and the server it asked is
 *     recorded by socket cookie (egress_dns_orig) so recvmsg4/6 and
 *     getpeername4/6 can show the client the server it asked.
 *   - Every other destination must be an address the proxy answered for this
 *     sandbox, on a port and protocol the policy allows for the name it
 *     answered, and whose admission has not expired (egress_admit), or
 *     match a CIDR/port rule of the policy (egress_cidr). Only connect()
 *     (and each unconnected datagram) is judged: an established
 *     connection outlives its admission. Anything else is refused: returning 0
 *     makes connect()/sendmsg() fail with EPERM. Each refusal is an alert
 *     event; in record-only mode the operation goes on and the event says
 *     "recorded".
 *
 * Addresses are kept as 16 bytes, IPv4 as IPv4-mapped IPv6 (::ffff:a.b.c.d),
 * so one map and one trie serve both families.
 */
#include "common.h"
#include <bpf/bpf_endian.h>
#include "listen.h"
#include "egress_netns.h"
#include "egress_foreign.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define AF_INET 2
#define AF_INET6 10
#define IPPROTO_TCP 6
#define IPPROTO_UDP 17
#define DNS_PORT 53

#define EGRESS_MAX_ALLOW 65536
#define EGRESS_MAX_CIDR 16384
#define EGRESS_MAX_RANGES 8
#define ADMIT_MAX_SPANS 8
#define DNS_BIND_TRIES 8

/* egress_config flags. */
#define EGRESS_F_RECORD_ONLY 1 /* allow, but record what enforce would refuse */
#define EGRESS_F_PROXY4 2      /* proxy4 is set: IPv4 DNS is redirected */
#define EGRESS_F_PROXY6 4      /* proxy6 is set: IPv6 DNS is redirected */
#define EGRESS_F_RESOLVER_PORTS 8 /* other resolvers' ports refused unless a CIDR rule allows */
#define EGRESS_F_UNIX 16          /* AF_UNIX connect/sendmsg only to egress_unix paths */
#define EGRESS_F_FOREIGN 32       /* sockets made outside the sandbox refused (egress_foreign.h) */

#define AF_UNIX 1
#define UNIX_PATH_LEN 108

/* Why an operation was refused (struct net_event.reason). */
enum net_reason {
	NET_R_NOT_RESOLVED = 1, /* no proxy answer and no policy rule covers it */
	NET_R_EXPIRED = 2,      /* the proxy's answer expired (TTL + grace) */
	NET_R_NO_POLICY = 3,    /* the cgroup has no egress configuration */
	NET_R_DNS_NO_PROXY = 4, /* DNS over a family the proxy does not listen on */
	NET_R_DNS_BIND = 5,     /* no free source port to attribute the query */
	NET_R_RESOLVER_PORT = 6, /* DNS over TLS/QUIC, mDNS, LLMNR: another resolver */
	NET_R_UNIX_ABSTRACT = 7, /* abstract unix socket (the host's namespace) */
	NET_R_UNIX_RELATIVE = 8, /* relative unix socket path (cannot be judged) */
	NET_R_UNIX_DOTDOT = 9,   /* ".." in a unix socket path */
	NET_R_UNIX_PATH = 10,    /* unix socket outside the sandbox's paths */
	NET_R_PORT = 11,         /* answered address, port/protocol not allowed for its name */
};

enum net_op {
	NET_OP_CONNECT = 1,
	NET_OP_SENDMSG = 2,
};

/* Per-sandbox configuration, keyed by sandbox id. */
struct net_config {
	__u32 flags;        /* EGRESS_F_* */
	__u32 proxy_ip4;    /* network order */
	__u32 proxy_ip6[4]; /* network order */
	__u16 proxy_port4;  /* network order */
	__u16 proxy_port6;  /* network order */
	__u32 dns_rule_id;  /* rule id reported for DNS refusals */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_SANDBOXES);
	__type(key, __u32);
	__type(value, struct net_config);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} egress_configs SEC(".maps");

struct allow_key {
	__u32 sandbox_id;
	__u32 addr[4]; /* network order; IPv4 as ::ffff:a.b.c.d */
};

/* One port span an answer admitted its address for, until expires_ns. */
struct admit_span {
	__u64 expires_ns; /* CLOCK_BOOTTIME; refused from then on */
	__u16 lo, hi;     /* host order, inclusive */
	__u32 protos;     /* PROTO_BIT_* */
};

/* What answers admitted an address for: the spans of the names answered
 * with it, each with its own expiry (min(TTL, cap) + grace). */
struct admit_val {
	struct admit_span s[ADMIT_MAX_SPANS];
	__u32 n;
	__u32 pad;
};

/* Addresses the proxy answered, per sandbox. The agent alone writes it and
 * bounds each sandbox's share (earliest expiry evicted first, counted), so
 * a plain hash: an LRU could drop entries before it is full, silently.
 * (Named egress_admit since the value carries port spans: the agent
 * unpins an older agent's egress_allow.) */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, EGRESS_MAX_ALLOW);
	__type(key, struct allow_key);
	__type(value, struct admit_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} egress_admit SEC(".maps");

struct cidr_key {
	__u32 prefixlen; /* 32 (sandbox id) + 96/0 + prefix bits */
	__u32 sandbox_id;
	__u32 addr[4];
};

/* Bits of port_range.protos. */
#define PROTO_BIT_TCP 1
#define PROTO_BIT_UDP 2

struct port_range {
	__u16 lo, hi; /* host order, inclusive */
	__u32 protos; /* PROTO_BIT_* */
	__u32 rule_id;
};

/* The agent merges rules so the longest matching prefix carries every
 * range of every rule whose prefix contains it. */
struct cidr_val {
	struct port_range r[EGRESS_MAX_RANGES];
	__u32 n;
};

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, EGRESS_MAX_CIDR);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct cidr_key);
	__type(value, struct cidr_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} egress_cidr SEC(".maps");

/* Unix socket paths a sandbox may connect or send to: LPM on the path's
 * bytes after the sandbox id. A directory entry ends in '/' (everything
 * below it); an exact entry includes the terminating NUL. */
struct unix_key {
	__u32 prefixlen; /* 32 (sandbox id) + 8 * bytes */
	__u32 sandbox_id;
	char path[UNIX_PATH_LEN];
};

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 4096);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct unix_key);
	__type(value, __u32); /* rule id */
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} egress_unix SEC(".maps");

/* The server a socket's DNS query was addressed to, by socket cookie. */
struct dns_orig {
	__u32 addr[4]; /* network order; IPv4 in addr[3] */
	__u16 port;    /* network order */
	__u16 family;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, struct dns_orig);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} egress_dns_orig SEC(".maps");

/* Source port (as the proxy sees it) in a network namespace -> sandbox
 * that sent the query. */
struct dns_client_key {
	__u64 netns; /* netns cookie of the client socket */
	__u16 port;  /* host order */
	__u16 proto; /* IPPROTO_TCP or IPPROTO_UDP */
	__u32 pad;
};

struct dns_client {
	__u64 cookie;
	__u64 sandbox_cg;
	__u64 ts_ns;          /* CLOCK_BOOTTIME of the last query */
	__u32 sandbox_id;
	__u32 local_addr[4];  /* bound source address, zero when unbound */
	__u32 orig_addr[4];   /* server asked, network order */
	__u16 orig_port;      /* network order */
	__u16 family;         /* family of local_addr/orig_addr */
	__u32 pid;            /* tgid */
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct dns_client_key);
	__type(value, struct dns_client);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} egress_dns_clients_ns SEC(".maps");

/* Ephemeral range used to bind a DNS client socket's source port. */
struct port_span {
	__u16 lo, hi;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct port_span);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} egress_ephemeral SEC(".maps");

enum egress_counter {
	CNT_DNS_REDIRECT = 0,
	CNT_DENIED = 1,
	CNT_RECORDED = 2,
	CNT_ALLOWED_ANSWER = 3,
	CNT_ALLOWED_RULE = 4,
	CNT_MAX = 5,
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, CNT_MAX);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} egress_counters SEC(".maps");

/* A refused (or, in record-only mode, recorded) connection or datagram. */
struct net_event {
	struct event_hdr hdr;
	__u32 addr[4]; /* destination, network order; IPv4 as ::ffff:a.b.c.d */
	__u16 port;    /* destination port, host order */
	__u16 family;  /* AF_INET or AF_INET6 (of the destination) */
	__u8 op;       /* enum net_op */
	__u8 reason;   /* enum net_reason */
	__u16 protocol;
	__u32 sock_type;
};

/* A refused (or recorded) unix socket connect or sendmsg: the net_event
 * (family AF_UNIX, no address) followed by the path as passed. */
struct unix_event {
	struct net_event net;
	char path[UNIX_PATH_LEN]; /* abstract names start with a NUL */
	__u32 path_len;
};

const struct net_event *unused_net_event __attribute__((unused));
const struct unix_event *unused_unix_event __attribute__((unused));
const struct unix_key *unused_unix_key __attribute__((unused));
const struct net_config *unused_egress_config __attribute__((unused));
const struct cidr_key *unused_cidr_key __attribute__((unused));
const struct cidr_val *unused_cidr_val __attribute__((unused));
const struct dns_client *unused_dns_client __attribute__((unused));
const struct dns_client_key *unused_dns_client_key __attribute__((unused));
const struct dns_orig *unused_dns_orig __attribute__((unused));
const struct allow_key *unused_allow_key __attribute__((unused));
const struct admit_val *unused_admit_val __attribute__((unused));
const struct admit_span *unused_admit_span __attribute__((unused));
const struct port_span *unused_port_span __attribute__((unused));

static __always_inline void count(__u32 idx)
{
	__u64 *c = bpf_map_lookup_elem(&egress_counters, &idx);
	if (c)
		(*c)++;
}

/* dest is the destination of one operation, normalised. */
struct dest {
	__u32 addr[4]; /* IPv4 as ::ffff:a.b.c.d */
	__u16 port;    /* host order */
	__u16 family;  /* AF_INET for IPv4 and IPv4-mapped */
	__u16 proto;
	__u32 type;
};

static __always_inline bool is_v4mapped(const __u32 *a)
{
	return a[0] == 0 && a[1] == 0 && a[2] == bpf_htonl(0xffff);
}

/* refuse reports a refusal and returns the hook's verdict: 0 (EPERM) when
 * enforcing, 1 in record-only mode. */
static __always_inline int refuse(struct bpf_sock_addr *ctx, struct sandbox *sb, __u64 root,
				  struct net_config *cfg, struct dest *d, __u8 op, __u8 reason,
				  __u32 rule_id)
{
	__u32 verdict = VERDICT_DENIED;
	if ((sb && (sb->flags & SANDBOX_F_RECORD_ONLY)) ||
	    (cfg && (cfg->flags & EGRESS_F_RECORD_ONLY)))
		verdict = VERDICT_RECORDED;
	count(verdict == VERDICT_DENIED ? CNT_DENIED : CNT_RECORDED);

	struct net_event *e = reserve_event(sizeof(*e), true);
	if (e) {
		fill_hdr(&e->hdr, EV_NET, verdict, rule_id, root, sb);
		e->addr[0] = d->addr[0];
		e->addr[1] = d->addr[1];
		e->addr[2] = d->addr[2];
		e->addr[3] = d->addr[3];
		e->port = d->port;
		e->family = d->family;
		e->op = op;
		e->reason = reason;
		e->protocol = d->proto;
		e->sock_type = d->type;
		submit_event(e, true);
	}
	return verdict == VERDICT_DENIED ? 0 : 1;
}

static __always_inline bool allowed_by_rule(__u32 sandbox_id, struct dest *d, __u32 proto,
					    __u32 *rule_id);
static __always_inline bool resolver_port(__u16 port);

/* allowed reports whether d may be reached: an unexpired admission of an
 * answer for the sandbox covering d's port and protocol, or a CIDR/port
 * rule. *reason says why not. */
static __always_inline bool allowed(__u32 sandbox_id, struct dest *d, __u32 proto, __u8 *reason,
				    __u32 *rule_id)
{
	struct allow_key k = { .sandbox_id = sandbox_id };
	k.addr[0] = d->addr[0];
	k.addr[1] = d->addr[1];
	k.addr[2] = d->addr[2];
	k.addr[3] = d->addr[3];
	*reason = NET_R_NOT_RESOLVED;
	struct admit_val *v = bpf_map_lookup_elem(&egress_admit, &k);
	if (v) {
		__u64 now = bpf_ktime_get_boot_ns();
		__u32 bit = proto == IPPROTO_TCP ? PROTO_BIT_TCP : proto == IPPROTO_UDP ? PROTO_BIT_UDP : 0;
		bool live = false;
		for (int i = 0; i < ADMIT_MAX_SPANS; i++) {
			if (i >= v->n)
				break;
			struct admit_span *s = &v->s[i];
			if (s->expires_ns <= now)
				continue;
			live = true;
			if ((s->protos & bit) && d->port >= s->lo && d->port <= s->hi) {
				count(CNT_ALLOWED_ANSWER);
				return true;
			}
		}
		*reason = live ? NET_R_PORT : NET_R_EXPIRED;
	}

	return allowed_by_rule(sandbox_id, d, proto, rule_id);
}

/* allowed_by_rule reports whether a CIDR/port rule of the policy covers d. */
static __always_inline bool allowed_by_rule(__u32 sandbox_id, struct dest *d, __u32 proto,
					    __u32 *rule_id)
{
	struct cidr_key ck = { .prefixlen = 32 + 128, .sandbox_id = sandbox_id };
	ck.addr[0] = d->addr[0];
	ck.addr[1] = d->addr[1];
	ck.addr[2] = d->addr[2];
	ck.addr[3] = d->addr[3];
	struct cidr_val *cv = bpf_map_lookup_elem(&egress_cidr, &ck);
	if (!cv)
		return false;
	__u32 bit = proto == IPPROTO_TCP ? PROTO_BIT_TCP : proto == IPPROTO_UDP ? PROTO_BIT_UDP : 0;
	for (int i = 0; i < EGRESS_MAX_RANGES; i++) {
		if (i >= cv->n)
			break;
		struct port_range *r = &cv->r[i];
		if ((r->protos & bit) && d->port >= r->lo && d->port <= r->hi) {
			*rule_id = r->rule_id;
			count(CNT_ALLOWED_RULE);
			return true;
		}
	}
	return false;
}

/* bind_source_port binds an unbound socket to a random ephemeral port, so
 * the proxy can attribute the query by source port: connect runs before the
 * kernel would pick one. Returns the port (host order) or 0. */
static __always_inline __u16 bind_source_port(struct bpf_sock_addr *ctx, bool v6)
{
	__u32 zero = 0;
	struct port_span *pr = bpf_map_lookup_elem(&egress_ephemeral, &zero);
	__u16 lo = 32768, hi = 60999;
	if (pr && pr->lo && pr->hi >= pr->lo) {
		lo = pr->lo;
		hi = pr->hi;
	}
	__u32 span = (__u32)hi - lo + 1;
	for (int i = 0; i < DNS_BIND_TRIES; i++) {
		__u16 port = lo + bpf_get_prandom_u32() % span;
		int err;
		if (v6) {
			struct sockaddr_in6 sa = { .sin6_family = AF_INET6, .sin6_port = bpf_htons(port) };
			err = bpf_bind(ctx, (struct sockaddr *)&sa, sizeof(sa));
		} else {
			struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = bpf_htons(port) };
			err = bpf_bind(ctx, (struct sockaddr *)&sa, sizeof(sa));
		}
		if (!err)
			return port;
	}
	return 0;
}

/* sock_info is what the hooks read of ctx->sk, read once and field by field
 * (the verifier refuses computed offsets into a socket). */
struct sock_info {
	__u32 family;
	__u32 src_port; /* host order, 0 when unbound */
	__u32 src_ip4;
	__u32 src_ip6[4];
	bool ok;
};

static __always_inline void read_sock(struct bpf_sock_addr *ctx, struct sock_info *si)
{
	struct bpf_sock *sk = ctx->sk;
	if (!sk)
		return;
	si->ok = true;
	si->family = sk->family;
	si->src_port = sk->src_port;
	si->src_ip4 = sk->src_ip4;
	si->src_ip6[0] = sk->src_ip6[0];
	si->src_ip6[1] = sk->src_ip6[1];
	si->src_ip6[2] = sk->src_ip6[2];
	si->src_ip6[3] = sk->src_ip6[3];
}

/* note_client records which sandbox owns the socket's source port and which
 * server it asked. */
static __always_inline void note_client(struct bpf_sock_addr *ctx, struct sock_info *si,
					struct sandbox *sb, __u64 root, __u64 netns, __u16 src_port,
					__u32 proto, struct dest *orig, __u16 orig_port_be)
{
	__u64 cookie = bpf_get_socket_cookie(ctx);
	struct dns_client_key k = { .netns = netns, .port = src_port, .proto = proto };
	struct dns_client c = {
		.cookie = cookie,
		.sandbox_cg = root,
		.ts_ns = bpf_ktime_get_boot_ns(),
		.sandbox_id = sb->id,
		.orig_port = orig_port_be,
		.family = orig->family,
		.pid = bpf_get_current_pid_tgid() >> 32,
	};
	c.orig_addr[0] = orig->addr[0];
	c.orig_addr[1] = orig->addr[1];
	c.orig_addr[2] = orig->addr[2];
	c.orig_addr[3] = orig->addr[3];
	if (si->family == AF_INET) {
		c.local_addr[2] = si->src_ip4 ? bpf_htonl(0xffff) : 0;
		c.local_addr[3] = si->src_ip4;
	} else {
		c.local_addr[0] = si->src_ip6[0];
		c.local_addr[1] = si->src_ip6[1];
		c.local_addr[2] = si->src_ip6[2];
		c.local_addr[3] = si->src_ip6[3];
	}
	bpf_map_update_elem(&egress_dns_clients_ns, &k, &c, BPF_ANY);

	struct dns_orig o = { .port = orig_port_be, .family = orig->family };
	o.addr[0] = orig->addr[0];
	o.addr[1] = orig->addr[1];
	o.addr[2] = orig->addr[2];
	o.addr[3] = orig->addr[3];
	bpf_map_update_elem(&egress_dns_orig, &cookie, &o, BPF_ANY);
}

/* own_loopback_server: the destination is a loopback address where a
 * socket of the same sandbox listens (TCP) or is bound (UDP), judged on
 * the socket the kernel would deliver to (listen.h): the sandbox's own
 * local server is not egress. */
static __always_inline bool own_loopback_server(struct bpf_sock_addr *ctx, const struct dest *d,
						__u32 sandbox_id)
{
	__u32 a[4] = { d->addr[0], d->addr[1], d->addr[2], d->addr[3] };
	__u32 family = AF_INET6;
	if (d->family == AF_INET) {
		if (!v4_loopback(a[3]))
			return false;
		if (ctx->user_family == AF_INET) {
			family = AF_INET;
			a[0] = a[3];
		}
	} else if (!v6_loopback(a)) {
		return false;
	}
	__u32 owner = 0;
	return listen_holder(ctx, family, a, d->port, &owner) && owner == sandbox_id;
}

/* Name binding: needs struct dest, sock_info, allowed_by_rule and
 * bind_source_port above. */
#include "relay.h"

/* handle is the common body of connect4/6 and sendmsg4/6. v6 says the
 * context's address is user_ip6 (it may still be IPv4-mapped). */
/* read_dest reads the destination the caller passed. */
static __always_inline void read_dest(struct bpf_sock_addr *ctx, bool v6, struct dest *d)
{
	d->port = bpf_ntohs(ctx->user_port);
	d->proto = ctx->protocol;
	d->type = ctx->type;
	if (v6) {
		d->addr[0] = ctx->user_ip6[0];
		d->addr[1] = ctx->user_ip6[1];
		d->addr[2] = ctx->user_ip6[2];
		d->addr[3] = ctx->user_ip6[3];
		d->family = is_v4mapped(d->addr) ? AF_INET : AF_INET6;
	} else {
		d->addr[2] = bpf_htonl(0xffff);
		d->addr[3] = ctx->user_ip4;
		d->family = AF_INET;
	}
}

static __always_inline int handle(struct bpf_sock_addr *ctx, bool v6, __u8 op)
{
	mark_seen(ctx);
	struct sock_info si = {};
	read_sock(ctx, &si);
	__u32 proto = ctx->protocol;
	__u32 port_be = ctx->user_port;
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	struct dest d = {};
	read_dest(ctx, v6, &d);

	struct net_config *cfg = NULL;
	if (sb) {
		__u32 id = sb->id;
		cfg = bpf_map_lookup_elem(&egress_configs, &id);
	}
	if (!sb || !cfg)
		return refuse(ctx, sb, root, cfg, &d, op, NET_R_NO_POLICY, 0);

	bool dns_proto = proto == IPPROTO_TCP || proto == IPPROTO_UDP;
	struct sock_ns ns = {};
	read_ns(ctx, &ns);
	/* The proxy address as seen in this context's family; in another
	 * namespace, the port of the agent's listener there (0: none yet). */
	bool have_proxy;
	__u32 px[4] = {};
	__u16 pport;
	if (d.family == AF_INET) {
		have_proxy = cfg->flags & EGRESS_F_PROXY4;
		px[2] = bpf_htonl(0xffff);
		px[3] = cfg->proxy_ip4;
		pport = cfg->proxy_port4;
		if (ns.foreign)
			pport = ns.np ? ns.np->dns4 : 0;
	} else {
		have_proxy = cfg->flags & EGRESS_F_PROXY6;
		px[0] = cfg->proxy_ip6[0];
		px[1] = cfg->proxy_ip6[1];
		px[2] = cfg->proxy_ip6[2];
		px[3] = cfg->proxy_ip6[3];
		pport = cfg->proxy_port6;
		if (ns.foreign)
			pport = ns.np ? ns.np->dns6 : 0;
	}
	bool to_proxy = have_proxy && pport && (__u16)port_be == pport && d.addr[0] == px[0] &&
			d.addr[1] == px[1] && d.addr[2] == px[2] && d.addr[3] == px[3];

	if (dns_proto && (d.port == DNS_PORT || to_proxy)) {
		if (!have_proxy)
			return refuse(ctx, sb, root, cfg, &d, op, NET_R_DNS_NO_PROXY,
				      cfg->dns_rule_id);
		if (!pport)
			return refuse(ctx, sb, root, cfg, &d, op, NET_R_NETNS, cfg->dns_rule_id);
		if (!si.ok)
			return refuse(ctx, sb, root, cfg, &d, op, NET_R_DNS_BIND, cfg->dns_rule_id);
		__u16 src_port = si.src_port;
		if (!src_port && op == NET_OP_CONNECT)
			src_port = bind_source_port(ctx, si.family == AF_INET6);
		if (!src_port)
			return refuse(ctx, sb, root, cfg, &d, op, NET_R_DNS_BIND, cfg->dns_rule_id);
		note_client(ctx, &si, sb, root, ns.cookie, src_port, proto, &d, (__u16)port_be);
		if (to_proxy)
			return 1;
		count(CNT_DNS_REDIRECT);
		if (v6) {
			ctx->user_ip6[0] = px[0];
			ctx->user_ip6[1] = px[1];
			ctx->user_ip6[2] = px[2];
			ctx->user_ip6[3] = px[3];
		} else {
			ctx->user_ip4 = px[3];
		}
		ctx->user_port = pport;
		return 1;
	}

	__u8 reason = 0;
	__u32 rule_id = 0;
	if ((cfg->flags & EGRESS_F_RESOLVER_PORTS) && dns_proto && resolver_port(d.port)) {
		/* DNS over TLS or QUIC to an answered address (dns.google is
		 * an ordinary name) would bypass the proxy: only an explicit
		 * rule opens these ports. */
		if (allowed_by_rule(sb->id, &d, proto, &rule_id))
			return 1;
		return refuse(ctx, sb, root, cfg, &d, op, NET_R_RESOLVER_PORT, cfg->dns_rule_id);
	}
	if (relay_quic_refused(sb->id, &d, proto))
		return refuse(ctx, sb, root, cfg, &d, op, NET_R_QUIC, 0);
	if (allowed(sb->id, &d, proto, &reason, &rule_id)) {
		int rv = relay_tcp(ctx, sb, &si, &ns, &d, v6, op);
		if (rv == RELAY_REFUSE)
			return refuse(ctx, sb, root, cfg, &d, op, NET_R_RELAY_NONE, 0);
		if (rv == RELAY_NO_NETNS)
			return refuse(ctx, sb, root, cfg, &d, op, NET_R_NETNS, 0);
		return 1;
	}
	if (dns_proto && own_loopback_server(ctx, &d, sb->id))
		return 1;
	return refuse(ctx, sb, root, cfg, &d, op, reason, 0);
}

/* resolver_port: ports of name resolution other than the proxy's 53:
 * DNS over TLS and over QUIC (853, 784 and 8853 of the drafts), mDNS
 * (5353), LLMNR (5355), NetBIOS names (137). */
static __always_inline bool resolver_port(__u16 port)
{
	return port == 853 || port == 784 || port == 8853 || port == 5353 || port == 5355 ||
	       port == 137;
}

extern void *bpf_cast_to_kern_ctx(void *obj) __ksym;

/* has_dotdot reports a ".." path component. */
static __always_inline bool has_dotdot(const char *p)
{
	for (int i = 0; i < UNIX_PATH_LEN - 3; i++) {
		if (p[i] == '/' && p[i + 1] == '.' && p[i + 2] == '.' && (p[i + 3] == '/' || p[i + 3] == 0))
			return true;
	}
	return p[UNIX_PATH_LEN - 3] == '/' && p[UNIX_PATH_LEN - 2] == '.' && p[UNIX_PATH_LEN - 1] == '.';
}

/* handle_unix judges a unix socket connect or sendmsg of a sandbox whose
 * egress restricts unix sockets: the path as passed (the hook runs before
 * the kernel resolves it) must be absolute, without "..", and inside one of
 * the sandbox's paths; abstract names live in the host's (network
 * namespace's) namespace and are refused. */
static __always_inline int handle_unix(struct bpf_sock_addr *ctx, __u8 op, bool foreign)
{
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb)
		return 1;
	if (foreign && !foreign_sock(ctx))
		return 1;
	if (!foreign)
		mark_seen(ctx);
	__u32 id = sb->id;
	struct net_config *cfg = bpf_map_lookup_elem(&egress_configs, &id);
	if (!cfg || !(cfg->flags & (foreign ? EGRESS_F_FOREIGN : EGRESS_F_UNIX)))
		return 1;

	struct bpf_sock_addr_kern *sa = bpf_cast_to_kern_ctx(ctx);
	__u32 alen = sa->uaddrlen;
	if (alen <= 2)
		return 1; /* no name: the kernel refuses (EINVAL) */
	__u32 n = alen - 2;
	if (n > UNIX_PATH_LEN)
		n = UNIX_PATH_LEN;

	/* Bytes past the name stay zero; the kernel ends the path at its
	 * first NUL, and no allowed entry holds one before its end. */
	struct unix_key k = { .sandbox_id = id };
	__u64 sz = n;
	barrier_var(sz); /* keep the bound check for the verifier */
	if (sz > UNIX_PATH_LEN)
		return 1;
	if (bpf_probe_read_kernel(k.path, sz, (void *)sa->uaddr + 2))
		return 1;
	__u8 reason = 0;
	__u32 len = n;
	if (foreign)
		reason = NET_R_FOREIGN_SOCK;
	else if (k.path[0] == 0)
		reason = NET_R_UNIX_ABSTRACT;
	else if (k.path[0] != '/')
		reason = NET_R_UNIX_RELATIVE;
	else if (has_dotdot(k.path))
		reason = NET_R_UNIX_DOTDOT;
	else {
		k.prefixlen = 32 + 8 * UNIX_PATH_LEN;
		if (bpf_map_lookup_elem(&egress_unix, &k))
			return 1;
		reason = NET_R_UNIX_PATH;
	}

	__u32 verdict = VERDICT_DENIED;
	if ((sb->flags & SANDBOX_F_RECORD_ONLY) || (cfg->flags & EGRESS_F_RECORD_ONLY))
		verdict = VERDICT_RECORDED;
	count(verdict == VERDICT_DENIED ? CNT_DENIED : CNT_RECORDED);
	struct unix_event *e = reserve_event(sizeof(*e), true);
	if (e) {
		fill_hdr(&e->net.hdr, EV_NET, verdict, cfg->dns_rule_id, root, sb);
		__builtin_memset(e->net.addr, 0, sizeof(e->net.addr));
		e->net.port = 0;
		e->net.family = AF_UNIX;
		e->net.op = op;
		e->net.reason = reason;
		e->net.protocol = 0;
		e->net.sock_type = ctx->type;
		__builtin_memcpy(e->path, k.path, sizeof(e->path));
		e->path_len = len;
		submit_event(e, true);
	}
	return verdict == VERDICT_DENIED ? 0 : 1;
}

/* restore shows the client the server it asked instead of the proxy. */
static __always_inline int restore(struct bpf_sock_addr *ctx, bool v6)
{
	__u64 cookie = bpf_get_socket_cookie(ctx);
	struct dns_orig *o = bpf_map_lookup_elem(&egress_dns_orig, &cookie);
	if (!o)
		return 1;
	/* Only a reply from the proxy is rewritten; the recorded server's
	 * family decides the form. */
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb)
		return 1;
	__u32 id = sb->id;
	struct net_config *cfg = bpf_map_lookup_elem(&egress_configs, &id);
	if (!cfg)
		return 1;
	struct sock_ns ns = {};
	read_ns(ctx, &ns);
	__u16 p4 = cfg->proxy_port4, p6 = cfg->proxy_port6;
	if (ns.foreign) {
		p4 = ns.np ? ns.np->dns4 : 0;
		p6 = ns.np ? ns.np->dns6 : 0;
	}
	if (v6) {
		__u32 a0 = ctx->user_ip6[0], a1 = ctx->user_ip6[1], a2 = ctx->user_ip6[2],
		      a3 = ctx->user_ip6[3];
		bool from_proxy;
		if (a0 == 0 && a1 == 0 && a2 == bpf_htonl(0xffff))
			from_proxy = (cfg->flags & EGRESS_F_PROXY4) && p4 && a3 == cfg->proxy_ip4 &&
				     (__u16)ctx->user_port == p4;
		else
			from_proxy = (cfg->flags & EGRESS_F_PROXY6) && a0 == cfg->proxy_ip6[0] &&
				     a1 == cfg->proxy_ip6[1] && a2 == cfg->proxy_ip6[2] &&
				     a3 == cfg->proxy_ip6[3] && p6 &&
				     (__u16)ctx->user_port == p6;
		if (!from_proxy)
			return 1;
		ctx->user_ip6[0] = o->addr[0];
		ctx->user_ip6[1] = o->addr[1];
		ctx->user_ip6[2] = o->addr[2];
		ctx->user_ip6[3] = o->addr[3];
	} else {
		if (!(cfg->flags & EGRESS_F_PROXY4) || !p4 || ctx->user_ip4 != cfg->proxy_ip4 ||
		    (__u16)ctx->user_port != p4)
			return 1;
		ctx->user_ip4 = o->addr[3];
	}
	ctx->user_port = o->port;
	return 1;
}

SEC("cgroup/connect4")
int egress_connect4(struct bpf_sock_addr *ctx)
{
	return handle(ctx, false, NET_OP_CONNECT);
}

SEC("cgroup/connect6")
int egress_connect6(struct bpf_sock_addr *ctx)
{
	return handle(ctx, true, NET_OP_CONNECT);
}

SEC("cgroup/sendmsg4")
int egress_sendmsg4(struct bpf_sock_addr *ctx)
{
	return handle(ctx, false, NET_OP_SENDMSG);
}

SEC("cgroup/sendmsg6")
int egress_sendmsg6(struct bpf_sock_addr *ctx)
{
	return handle(ctx, true, NET_OP_SENDMSG);
}

SEC("cgroup/recvmsg4")
int egress_recvmsg4(struct bpf_sock_addr *ctx)
{
	return restore(ctx, false);
}

SEC("cgroup/recvmsg6")
int egress_recvmsg6(struct bpf_sock_addr *ctx)
{
	return restore(ctx, true);
}

SEC("cgroup/getpeername4")
int egress_getpeername4(struct bpf_sock_addr *ctx)
{
	if (relay_restore(ctx, false))
		return 1;
	return restore(ctx, false);
}

SEC("cgroup/getpeername6")
int egress_getpeername6(struct bpf_sock_addr *ctx)
{
	if (relay_restore(ctx, true))
		return 1;
	return restore(ctx, true);
}

SEC("cgroup/connect_unix")
int egress_connect_unix(struct bpf_sock_addr *ctx)
{
	return handle_unix(ctx, NET_OP_CONNECT, false);
}

SEC("cgroup/sendmsg_unix")
int egress_sendmsg_unix(struct bpf_sock_addr *ctx)
{
	return handle_unix(ctx, NET_OP_SENDMSG, false);
}

/* handle_foreign refuses a sandboxed task's connect or send on a socket
 * made outside its sandbox (egress_foreign.h); attached to the cgroup v2
 * root, it lets everything else through to the programs that judge it. */
static __always_inline int handle_foreign(struct bpf_sock_addr *ctx, bool v6, __u8 op)
{
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb || !foreign_sock(ctx))
		return 1;
	__u32 id = sb->id;
	struct net_config *cfg = bpf_map_lookup_elem(&egress_configs, &id);
	if (!cfg || !(cfg->flags & EGRESS_F_FOREIGN))
		return 1; /* egress does not cage this sandbox */
	struct dest d = {};
	read_dest(ctx, v6, &d);
	return refuse(ctx, sb, root, cfg, &d, op, NET_R_FOREIGN_SOCK, 0);
}

SEC("cgroup/connect4")
int egress_foreign_connect4(struct bpf_sock_addr *ctx)
{
	return handle_foreign(ctx, false, NET_OP_CONNECT);
}

SEC("cgroup/connect6")
int egress_foreign_connect6(struct bpf_sock_addr *ctx)
{
	return handle_foreign(ctx, true, NET_OP_CONNECT);
}

SEC("cgroup/sendmsg4")
int egress_foreign_sendmsg4(struct bpf_sock_addr *ctx)
{
	return handle_foreign(ctx, false, NET_OP_SENDMSG);
}

SEC("cgroup/sendmsg6")
int egress_foreign_sendmsg6(struct bpf_sock_addr *ctx)
{
	return handle_foreign(ctx, true, NET_OP_SENDMSG);
}

SEC("cgroup/connect_unix")
int egress_foreign_connect_unix(struct bpf_sock_addr *ctx)
{
	return handle_unix(ctx, NET_OP_CONNECT, true);
}

SEC("cgroup/sendmsg_unix")
int egress_foreign_sendmsg_unix(struct bpf_sock_addr *ctx)
{
	return handle_unix(ctx, NET_OP_SENDMSG, true);
}
