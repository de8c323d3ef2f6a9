/* Sandboxes in their own network namespace (included by egress.c).
 *
 * The agent's DNS proxy and name relay listen on loopback in the agent's
 * network namespace; a socket in another namespace (a container on a
 * bridge, `unshare -n`) has its own loopback, where nothing of the agent's
 * listens unless the agent opened listeners there. The agent records the
 * namespace it was loaded in (egress_home) and, per other namespace its
 * sandboxes' tasks live in, the ports of the listeners it opened there
 * (egress_netns, by netns cookie). DNS and relayed connects from a
 * namespace without listeners are refused (NET_R_NETNS), never sent
 * where nothing listens nor let out unjudged; the agent then opens them.
 *
 * Records keyed by a source port (DNS clients, relayed connections) carry
 * the netns cookie too: port spaces are per namespace.
 */
#ifndef WATCHER_EGRESS_NETNS_H
#define WATCHER_EGRESS_NETNS_H

#define NET_R_NETNS 12 /* the sandbox's network namespace has no agent listener (yet) */
#define EGRESS_MAX_NETNS 1024

/* egress_home[0]: the agent's netns cookie; 0 (not set, or a kernel
 * without netns cookies) means every socket is treated as the agent's. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} egress_home SEC(".maps");

/* The agent's listeners in one other network namespace, on the same
 * loopback addresses as in its own (net_config.proxy_ip*, relay_config.ip*). */
struct netns_ports {
	__u16 dns4, dns6;     /* network order, 0: none */
	__u16 relay4, relay6; /* network order, 0: none */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, EGRESS_MAX_NETNS);
	__type(key, __u64);
	__type(value, struct netns_ports);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} egress_netns SEC(".maps");

const struct netns_ports *unused_netns_ports __attribute__((unused));

/* sock_ns is the network namespace of the socket an operation is on. */
struct sock_ns {
	__u64 cookie;
	bool foreign;            /* not the agent's namespace */
	struct netns_ports *np;  /* its listeners, NULL when foreign without any */
};

static __always_inline void read_ns(struct bpf_sock_addr *ctx, struct sock_ns *ns)
{
	ns->cookie = bpf_get_netns_cookie(ctx);
	__u32 zero = 0;
	__u64 *home = bpf_map_lookup_elem(&egress_home, &zero);
	ns->foreign = home && *home && *home != ns->cookie;
	ns->np = NULL;
	if (ns->foreign)
		ns->np = bpf_map_lookup_elem(&egress_netns, &ns->cookie);
}

#endif
