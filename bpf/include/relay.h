/* Name binding (included by egress.c after its own helpers).
 *
 * A sandbox TCP connect to an address the DNS proxy answered is sent to the
 * agent's transparent relay on loopback instead, which reads the name on
 * the wire (TLS SNI, HTTP Host) and dials the original destination only
 * when that name is one the proxy answered for the address (or the policy
 * allows). The relay learns the original destination from the client's
 * source port, bound here before the connect as for DNS clients;
 * getpeername shows the client the server it asked.
 *
 * A socket in the relay's network namespace is sent to the relay's
 * listener; one in another namespace to the listener the agent opened in
 * that namespace (egress_netns.h), and refused while there is none (a
 * container's loopback is not the agent's). Destinations a CIDR rule of the
 * policy allows go direct: the policy named the address itself.
 *
 * QUIC (UDP 443) to answered addresses is refused unless a rule allows it,
 * so clients fall back to TCP, where the name is judged.
 */
#ifndef WATCHER_RELAY_H
#define WATCHER_RELAY_H

#define RELAY_F_TCP 1  /* redirect TCP connects to answered addresses */
#define RELAY_F_QUIC 2 /* refuse UDP 443 to answered addresses unless a rule allows */

#define NET_R_RELAY_NONE 20 /* name binding on, but no relay for the family or namespace */
#define NET_R_QUIC 21       /* QUIC (UDP 443): the name inside cannot be judged */

#define QUIC_PORT 443

/* Per-sandbox relay configuration, keyed by sandbox id. */
struct relay_config {
	__u64 netns_cookie; /* the relay's network namespace */
	__u32 flags;        /* RELAY_F_* */
	__u32 ip4;          /* network order */
	__u32 ip6[4];       /* network order */
	__u16 port4;        /* network order, 0: no IPv4 relay */
	__u16 port6;        /* network order, 0: no IPv6 relay */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_SANDBOXES);
	__type(key, __u32);
	__type(value, struct relay_config);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} egress_relay_cfg SEC(".maps");

/* A redirected connection, keyed by the client's network namespace and
 * source port: what the relay sees as the peer of the connection it
 * accepts (in the namespace of the listener that accepted it). */
struct relay_conn_key {
	__u64 netns; /* netns cookie of the client socket */
	__u32 port;  /* source port, host order */
	__u32 pad;
};

struct relay_conn {
	__u64 cookie; /* client socket */
	__u64 ts_ns;  /* CLOCK_BOOTTIME of the connect */
	__u64 cgroup; /* the connecting task's cgroup (the leaf) */
	__u32 sandbox_id;
	__u32 pid;     /* tgid */
	__u32 addr[4]; /* original destination, network order, IPv4 as ::ffff:a.b.c.d */
	__u16 port;    /* original port, network order */
	__u16 family;  /* AF_INET or AF_INET6 of the original destination */
	__u16 relay_port; /* the listener it was sent to, network order */
	__u16 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct relay_conn_key);
	__type(value, struct relay_conn);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} egress_relay_conns_ns SEC(".maps");

const struct relay_config *unused_relay_config __attribute__((unused));
const struct relay_conn *unused_relay_conn __attribute__((unused));
const struct relay_conn_key *unused_relay_conn_key __attribute__((unused));

/* What relay_tcp decided. */
enum relay_verdict {
	RELAY_PASS = 0,     /* not relayed: connect as asked */
	RELAY_REDIRECT = 1, /* sent to the relay */
	RELAY_REFUSE = 2,   /* name binding on, but the relay cannot take it */
	RELAY_NO_NETNS = 3, /* name binding on, no relay listener in the socket's netns yet */
};

/* relay_quic_refused: UDP to port 443 of an answered address, with QUIC
 * refusal on, and no rule for it. */
static __always_inline bool relay_quic_refused(__u32 sandbox_id, struct dest *d, __u32 proto)
{
	if (proto != IPPROTO_UDP || d->port != QUIC_PORT)
		return false;
	struct relay_config *rc = bpf_map_lookup_elem(&egress_relay_cfg, &sandbox_id);
	if (!rc || !(rc->flags & RELAY_F_QUIC))
		return false;
	__u32 rid = 0;
	return !allowed_by_rule(sandbox_id, d, proto, &rid);
}

/* relay_tcp sends an allowed TCP connect to an answered address to the
 * relay, recording the original destination under the source port. */
static __always_inline int relay_tcp(struct bpf_sock_addr *ctx, struct sandbox *sb,
				     struct sock_info *si, struct sock_ns *ns, struct dest *d, bool v6,
				     __u8 op)
{
	if (op != NET_OP_CONNECT || d->proto != IPPROTO_TCP)
		return RELAY_PASS;
	__u32 id = sb->id;
	struct relay_config *rc = bpf_map_lookup_elem(&egress_relay_cfg, &id);
	if (!rc || !(rc->flags & RELAY_F_TCP))
		return RELAY_PASS;
	__u32 rid = 0;
	if (allowed_by_rule(id, d, IPPROTO_TCP, &rid))
		return RELAY_PASS;
	__u16 rport = d->family == AF_INET ? rc->port4 : rc->port6;
	if (ns->foreign) {
		if (!ns->np)
			return RELAY_NO_NETNS;
		rport = d->family == AF_INET ? ns->np->relay4 : ns->np->relay6;
	} else if (ns->cookie != rc->netns_cookie) {
		/* No agent namespace recorded: admissions are the sandbox's, not
		 * a namespace's, so passing would carry an unjudged name. */
		return RELAY_REFUSE;
	}
	if (!rport || !si->ok)
		return RELAY_REFUSE;
	__u16 src_port = si->src_port;
	if (!src_port)
		src_port = bind_source_port(ctx, si->family == AF_INET6);
	if (!src_port)
		return RELAY_REFUSE;

	struct relay_conn_key key = { .netns = ns->cookie, .port = src_port };
	struct relay_conn c = {
		.cookie = bpf_get_socket_cookie(ctx),
		.ts_ns = bpf_ktime_get_boot_ns(),
		.cgroup = bpf_get_current_cgroup_id(),
		.sandbox_id = id,
		.pid = bpf_get_current_pid_tgid() >> 32,
		.port = (__u16)ctx->user_port,
		.family = d->family,
		.relay_port = rport,
	};
	c.addr[0] = d->addr[0];
	c.addr[1] = d->addr[1];
	c.addr[2] = d->addr[2];
	c.addr[3] = d->addr[3];
	if (bpf_map_update_elem(&egress_relay_conns_ns, &key, &c, BPF_ANY))
		return RELAY_REFUSE;

	if (d->family == AF_INET) {
		if (v6) {
			ctx->user_ip6[0] = 0;
			ctx->user_ip6[1] = 0;
			ctx->user_ip6[2] = bpf_htonl(0xffff);
			ctx->user_ip6[3] = rc->ip4;
		} else {
			ctx->user_ip4 = rc->ip4;
		}
	} else {
		ctx->user_ip6[0] = rc->ip6[0];
		ctx->user_ip6[1] = rc->ip6[1];
		ctx->user_ip6[2] = rc->ip6[2];
		ctx->user_ip6[3] = rc->ip6[3];
	}
	ctx->user_port = rport;
	return RELAY_REDIRECT;
}

/* relay_restore shows a relayed client the server it asked instead of the
 * relay (getpeername). Returns true when it rewrote the address. */
static __always_inline bool relay_restore(struct bpf_sock_addr *ctx, bool v6)
{
	struct bpf_sock *sk = ctx->sk;
	if (!sk)
		return false;
	struct relay_conn_key key = { .netns = bpf_get_netns_cookie(ctx), .port = sk->src_port };
	struct relay_conn *c = bpf_map_lookup_elem(&egress_relay_conns_ns, &key);
	if (!c || c->cookie != bpf_get_socket_cookie(ctx))
		return false;
	__u32 id = c->sandbox_id;
	struct relay_config *rc = bpf_map_lookup_elem(&egress_relay_cfg, &id);
	if (!rc)
		return false;
	if (v6) {
		__u32 a0 = ctx->user_ip6[0], a1 = ctx->user_ip6[1], a2 = ctx->user_ip6[2],
		      a3 = ctx->user_ip6[3];
		bool to_relay;
		if (a0 == 0 && a1 == 0 && a2 == bpf_htonl(0xffff))
			to_relay = a3 == rc->ip4 && (__u16)ctx->user_port == c->relay_port;
		else
			to_relay = a0 == rc->ip6[0] && a1 == rc->ip6[1] && a2 == rc->ip6[2] &&
				   a3 == rc->ip6[3] && (__u16)ctx->user_port == c->relay_port;
		if (!to_relay)
			return false;
		ctx->user_ip6[0] = c->addr[0];
		ctx->user_ip6[1] = c->addr[1];
		ctx->user_ip6[2] = c->addr[2];
		ctx->user_ip6[3] = c->addr[3];
	} else {
		if (ctx->user_ip4 != rc->ip4 || (__u16)ctx->user_port != c->relay_port)
			return false;
		ctx->user_ip4 = c->addr[3];
	}
	ctx->user_port = c->port;
	return true;
}

#endif
