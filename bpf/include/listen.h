/* The sandbox's own sockets, shared by cgroup.c (listen rules) and
 * egress.c (a sandbox's clients reach its own loopback servers).
 *
 * cgroup.c marks every inet socket a sandbox creates (cgroup/sock_create)
 * or binds; the mark is socket storage, freed with the socket, and the map
 * is pinned by name so both objects (and a restarted agent's) share it.
 */
#pragma once

#include "common.h"
#include <bpf/bpf_endian.h>

#ifndef AF_INET
#define AF_INET 2
#endif
#ifndef AF_INET6
#define AF_INET6 10
#endif

/* The task that created (or last bound) the socket: sockops runs without
 * the task helpers on older kernels, so its events name this one. */
struct listen_mark {
	__u64 sandbox_cg; /* sandbox root cgroup (its flags, its id) */
	__u64 cgroup_id;  /* the task's own cgroup */
	__u32 sandbox_id;
	__u32 pid, tgid, uid;
	__u8 comm[TASK_COMM_LEN];
};

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct listen_mark);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cg_listen_socks SEC(".maps");

static __always_inline bool v4_loopback(__u32 a)
{
	return (bpf_ntohl(a) >> 24) == 127;
}

static __always_inline bool v4_mapped(const __u32 a[4])
{
	return a[0] == 0 && a[1] == 0 && a[2] == bpf_htonl(0xffff);
}

/* v6_loopback: ::1 or a v4-mapped 127/8 address. */
static __always_inline bool v6_loopback(const __u32 a[4])
{
	if (v4_mapped(a))
		return v4_loopback(a[3]);
	return a[0] == 0 && a[1] == 0 && a[2] == 0 && a[3] == bpf_htonl(1);
}

/* listen_holder finds the socket that would receive a connection (TCP:
 * a listener) or a datagram (UDP: a bound socket) sent to addr:port (port
 * in host order; addr as the family's context gives it: IPv4 in addr[0],
 * or 16 bytes, v4-mapped looked up as IPv4). It returns whether one
 * exists and, in *owner, the sandbox id of its mark (0 for none). */
static __always_inline bool listen_holder(struct bpf_sock_addr *ctx, __u32 family,
					  const __u32 addr[4], __u16 port, __u32 *owner)
{
	struct bpf_sock_tuple t = {};
	__u32 size;
	if (family == AF_INET || v4_mapped(addr)) {
		t.ipv4.daddr = family == AF_INET ? addr[0] : addr[3];
		t.ipv4.dport = bpf_htons(port);
		size = sizeof(t.ipv4);
	} else {
		t.ipv6.daddr[0] = addr[0];
		t.ipv6.daddr[1] = addr[1];
		t.ipv6.daddr[2] = addr[2];
		t.ipv6.daddr[3] = addr[3];
		t.ipv6.dport = bpf_htons(port);
		size = sizeof(t.ipv6);
	}
	struct bpf_sock *sk;
	if (ctx->type == SOCK_STREAM)
		sk = bpf_sk_lookup_tcp(ctx, &t, size, BPF_F_CURRENT_NETNS, 0);
	else if (ctx->type == SOCK_DGRAM)
		sk = bpf_sk_lookup_udp(ctx, &t, size, BPF_F_CURRENT_NETNS, 0);
	else
		return false;
	if (!sk)
		return false;
	struct listen_mark *m = bpf_sk_storage_get(&cg_listen_socks, sk, 0, 0);
	*owner = m ? m->sandbox_id : 0;
	bpf_sk_release(sk);
	return true;
}
