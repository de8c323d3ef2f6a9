/* Sockets made outside the sandbox (included by egress.c).
 *
 * The kernel runs cgroup sock_addr programs for the cgroup a socket was
 * made in (sk_cgrp_data, set at socket()), not the caller's: a socket
 * inherited across the move into a sandbox cgroup, or received by
 * SCM_RIGHTS or pidfd_getfd from a process outside, never reaches the
 * programs attached to the sandbox. The egress_foreign_* programs are
 * attached once to the cgroup v2 root, so they run for every socket on the
 * host (after the sandbox's own, which the kernel runs first): a task
 * outside every sandbox pays one membership lookup; a sandboxed task
 * connecting a socket made in its own subtree passes on; a socket made
 * anywhere else is refused (NET_R_FOREIGN_SOCK), whatever its address.
 */
#ifndef WATCHER_EGRESS_FOREIGN_H
#define WATCHER_EGRESS_FOREIGN_H

#define NET_R_FOREIGN_SOCK 13 /* socket made outside the sandbox's cgroup subtree */

/* Sockets a sandbox's own programs have seen: every sandbox-attached
 * connect and sendmsg program marks the socket before judging it. The
 * kernel runs a socket's cgroup programs from its own cgroup up to the
 * root, so by the time the root's program runs, a socket made in any
 * sandbox cgroup carries the mark; a socket made outside never does.
 * (bpf_sk_cgroup_id, the direct test, is not offered to sock_addr
 * programs.) */
struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, __u8);
} egress_seen SEC(".maps");

/* ctx_sk loads ctx->sk in one instruction off ctx itself: the verifier
 * refuses a context load through a pointer the compiler derived from ctx. */
static __always_inline struct bpf_sock *ctx_sk(struct bpf_sock_addr *ctx)
{
	struct bpf_sock *sk;
	asm volatile("%0 = *(u64 *)(%1 + %2)"
		     : "=r"(sk)
		     : "r"(ctx), "i"(__builtin_offsetof(struct bpf_sock_addr, sk)));
	return sk;
}

/* mark_seen marks ctx's socket as judged by a sandbox's own programs. */
static __always_inline void mark_seen(struct bpf_sock_addr *ctx)
{
	struct bpf_sock *sk = ctx_sk(ctx);
	if (sk)
		bpf_sk_storage_get(&egress_seen, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
}

/* foreign_sock says whether ctx's socket was made outside every sandbox
 * cgroup (no sandbox program has seen it). */
static __always_inline bool foreign_sock(struct bpf_sock_addr *ctx)
{
	struct bpf_sock *sk = ctx_sk(ctx);
	if (!sk)
		return false;
	return !bpf_sk_storage_get(&egress_seen, sk, 0, 0);
}

#endif
