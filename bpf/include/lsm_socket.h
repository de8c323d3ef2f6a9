/* Sockets: families and types the egress rules refuse, unix peers. */
#pragma once

/* socket_create runs for every family before the family's create function
 * (cgroup/sock_create runs only inside inet_create and inet6_create, so it
 * never sees AF_PACKET, AF_NETLINK or AF_VSOCK), from every entry (int 0x80
 * socketcall and socket alike). Rules are keyed like cgroup.c's socket
 * rules, most specific pattern first; ANY matches every value. */
struct sock_key {
	__u32 sandbox_id;
	__u32 family;
	__u32 type;
	__u32 protocol;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct sock_key);
	__type(value, struct decision);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lsm_sock_rules SEC(".maps");

/* Unix socket paths a sandbox whose egress restricts unix sockets may
 * connect or send to, judged on the socket the kernel found (its bound
 * path, walked like a file's): a symlink in the workspace to a host socket
 * arrives as the host socket. Same LPM layout as lsm_path_rules; the value
 * names the allowing rule. The refusal's decision is LSM_OP_UNIX_CONNECT's
 * op rule: no op rule, no restriction. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 4096);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct path_key);
	__type(value, struct decision);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lsm_unix_rules SEC(".maps");

enum sock_op {
	SOCK_OP_CREATE = 1,       /* socket(2), socketpair(2) */
	SOCK_OP_UNIX_CONNECT = 2, /* connect(2) of a stream or seqpacket unix socket */
	SOCK_OP_UNIX_SEND = 3,    /* connect or sendmsg of a datagram unix socket */
};

/* Why a unix peer was refused. */
#define UNIX_PEER_PATH 1     /* bound outside the sandbox's socket paths */
#define UNIX_PEER_ABSTRACT 2 /* an abstract name (the network namespace's, not the sandbox's) */

struct sock_event {
	struct event_hdr hdr;
	__u32 op;       /* enum sock_op */
	__u32 family;   /* AF_*; AF_UNIX for the unix hooks */
	__u32 type;     /* SOCK_* */
	__u32 protocol;
	__u32 reason;   /* UNIX_PEER_* */
	__u32 fflags;   /* FILE_F_TRUNCATED when the path was cut */
	char path[PATH_MAX_LEN]; /* the peer's resolved path (unix hooks) */
};

const struct sock_key *unused_sock_key __attribute__((unused));
const struct sock_event *unused_sock_event __attribute__((unused));

static __always_inline struct decision *sock_lookup(__u32 sid, __u32 family, __u32 type, __u32 protocol)
{
	struct sock_key k = { .sandbox_id = sid, .family = family, .type = type, .protocol = protocol };
	struct decision *d;
	if ((d = bpf_map_lookup_elem(&lsm_sock_rules, &k)))
		return d;
	k.type = ANY;
	if ((d = bpf_map_lookup_elem(&lsm_sock_rules, &k)))
		return d;
	k.type = type, k.protocol = ANY;
	if ((d = bpf_map_lookup_elem(&lsm_sock_rules, &k)))
		return d;
	k.type = ANY;
	if ((d = bpf_map_lookup_elem(&lsm_sock_rules, &k)))
		return d;
	k.family = ANY, k.type = type;
	return bpf_map_lookup_elem(&lsm_sock_rules, &k);
}

static __always_inline int sock_conclude(__u32 mech, __u32 kind, struct decision d, struct sandbox *sb, __u64 root,
					 __u32 op, __u32 family, __u32 type, __u32 protocol, __u32 reason,
					 const char *path, __u32 fflags)
{
	if (d.action == ACTION_ALLOW)
		return 0;
	__u32 verdict = effective_verdict(sb, d.action);
	struct sock_event *e = reserve_event(sizeof(*e), true);
	if (e) {
		fill_hdr(&e->hdr, kind + mech, verdict, d.rule_id, root, sb);
		e->op = op;
		e->family = family;
		e->type = type;
		e->protocol = protocol;
		e->reason = reason;
		e->fflags = fflags;
		e->path[0] = 0;
		if (path)
			bpf_probe_read_kernel_str(e->path, sizeof(e->path), path);
		submit_event(e, true);
	}
	return conclude(verdict);
}

static __always_inline int decide_socket_create(__u32 mech, int family, int type, int protocol, int kern, int ret)
{
	if (ret)
		return ret;
	if (kern)
		return 0; /* the kernel's own sockets */
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb)
		return 0;
	struct decision *r = sock_lookup(sb->id, family, type, protocol);
	if (!r)
		r = sock_lookup(0, family, type, protocol);
	if (!r)
		return 0;
	struct decision d = *r;
	return sock_conclude(mech, EV_LSM_SOCKET, d, sb, root, SOCK_OP_CREATE, family, type, protocol, 0, NULL, 0);
}
WATCHER_HOOK(socket_create, security_socket_create, decide_socket_create(mech, family, type, protocol, kern, ret),
	     int family, int type, int protocol, int kern, int ret)

#define AF_UNIX_FAMILY 1

/* judge_unix_peer judges a unix connect or send from the current task to
 * the socket other, by where other is bound. Unnamed peers (socketpair,
 * a socket never bound) have no name to judge and stay allowed. */
static __always_inline int judge_unix_peer(__u32 mech, __u32 op, struct sock *other, __u32 type)
{
	struct op_ctx c;
	if (!other || !op_begin(&c, LSM_OP_UNIX_CONNECT))
		return 0;
	struct unix_sock *u = (struct unix_sock *)other;
	struct unix_address *addr = BPF_CORE_READ(u, addr);
	if (!addr)
		return 0;
	struct dentry *dentry = BPF_CORE_READ(u, path.dentry);
	if (!dentry) {
		/* Bound, but not in the filesystem: an abstract name. */
		return sock_conclude(mech, EV_LSM_UNIX, c.d, c.sb, c.root, op, AF_UNIX_FAMILY, type, 0, UNIX_PEER_ABSTRACT, NULL, 0);
	}
	__u32 zero = 0;
	struct path_key *key = bpf_map_lookup_elem(&lsm_key_scratch, &zero);
	struct pathwalk *pw = bpf_map_lookup_elem(&lsm_pw_scratch, &zero);
	if (!key || !pw)
		return 0;
	struct path p = { .mnt = BPF_CORE_READ(u, path.mnt), .dentry = dentry };
	bool truncated = key_from_walk(key, pw, &p);
	key->sandbox_id = c.sb->id;
	if (bpf_map_lookup_elem(&lsm_unix_rules, key))
		return 0;
	return sock_conclude(mech, EV_LSM_UNIX, c.d, c.sb, c.root, op, AF_UNIX_FAMILY, type, 0, UNIX_PEER_PATH, pw->buf,
			     truncated ? FILE_F_TRUNCATED : 0);
}

/* connect(2) of a stream or seqpacket socket: other is the listener the
 * kernel looked up (after resolving every symlink of the path). */
static __always_inline int decide_unix_stream_connect(__u32 mech, struct sock *sock, struct sock *other, int ret)
{
	if (ret)
		return ret;
	return judge_unix_peer(mech, SOCK_OP_UNIX_CONNECT, other, BPF_CORE_READ(sock, sk_type));
}
WATCHER_HOOK(unix_stream_connect, security_unix_stream_connect, decide_unix_stream_connect(mech, sock, other, ret),
	     struct sock *sock, struct sock *other, struct sock *newsk, int ret)

/* Datagram connect(2) and every sendmsg(2) of a datagram socket. */
static __always_inline int decide_unix_may_send(__u32 mech, struct socket *sock, struct socket *other, int ret)
{
	if (ret)
		return ret;
	return judge_unix_peer(mech, SOCK_OP_UNIX_SEND, BPF_CORE_READ(other, sk), BPF_CORE_READ(sock, type));
}
WATCHER_HOOK(unix_may_send, security_unix_may_send, decide_unix_may_send(mech, sock, other, ret),
	     struct socket *sock, struct socket *other, int ret)
