/* Unix peers: connect to a socket bound outside the sandbox's socket paths. */
#pragma once

/* cgroup/connect_unix judges the path a process passes, before the kernel
 * resolves it: a symlink in the workspace to a host socket (the Docker
 * socket, D-Bus, a resolver's varlink) passes it. Where no LSM unix hook
 * runs, the socket the kernel connected to is judged when connect(2)
 * returns: its peer's bound path, walked like a file's (symlinks and bind
 * mounts already resolved by the kernel), must lie in one of the sandbox's
 * socket paths. After the fact: the connection exists when the process is
 * killed on its way back to user space, so the thread that connected sends
 * nothing, but another thread of the same process could write to the
 * descriptor in between (the layer table says so). Datagrams sent by name
 * (sendto) are delivered before any tracepoint could judge them.
 *
 * bs_unix_paths, per sandbox: an entry with only the sandbox id (prefixlen
 * 32) marks the sandbox as restricted (ops 0); entries with ops OP_CONNECT
 * are the allowed paths (prefix entries end in '/'; exact ones include the
 * NUL). No entry: the sandbox does not restrict unix sockets.
 */
#define OP_CONNECT 8
#define AF_UNIX_ 1
#define S_IFSOCK_ 0140000

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 4096);
	__type(key, struct path_key);
	__type(value, struct path_rule);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} bs_unix_paths SEC(".maps");

static __always_inline void unix_peer_connected(struct pt_regs *regs)
{
	if (!any_category(CAT_UNIX_PEER))
		return;
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb)
		return;
	__u32 cat_rule = 0;
	__u32 action = sandbox_rule(sb->id, SBR_CATEGORY | CAT_UNIX_PEER, &cat_rule);
	if (!action)
		return;
	struct file *file = pw_fd_file((long)BPF_CORE_READ(regs, di));
	if (!file)
		return;
	struct inode *inode = BPF_CORE_READ(file, f_inode);
	if ((BPF_CORE_READ(inode, i_mode) & 00170000) != S_IFSOCK_)
		return;
	struct socket *sock = BPF_CORE_READ(file, private_data);
	struct sock *sk = BPF_CORE_READ(sock, sk);
	if (!sk || BPF_CORE_READ(sk, __sk_common.skc_family) != AF_UNIX_)
		return;
	struct unix_sock *peer = (struct unix_sock *)BPF_CORE_READ((struct unix_sock *)sk, peer);
	if (!peer || !BPF_CORE_READ(peer, addr))
		return; /* unnamed peer (never bound): no name to judge */
	struct scratch *s = get_scratch();
	if (!s)
		return;
	s->key.prefixlen = 32;
	s->key.sandbox_id = sb->id;
	struct path_rule *marker = bpf_map_lookup_elem(&bs_unix_paths, &s->key);
	if (!marker)
		return; /* this sandbox does not restrict unix sockets */
	__u32 rule_id = marker->rule_id;
	struct path p = { .mnt = BPF_CORE_READ(peer, path.mnt), .dentry = BPF_CORE_READ(peer, path.dentry) };
	struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
	struct path troot = BPF_CORE_READ(task, fs, root);
	if (p.dentry) {
		pw_resolve(&s->pw, &p, &troot);
		if (!(s->pw.flags & PW_F_TRUNCATED)) {
			__u32 len = s->pw.len + 1;
			if (len > RULE_PATH_LEN)
				len = RULE_PATH_LEN;
			s->key.prefixlen = (4 + len) * 8;
			bpf_probe_read_kernel(s->key.path, sizeof(s->key.path), s->pw.buf);
			s->key.sandbox_id = sb->id;
			struct path_rule *pr = bpf_map_lookup_elem(&bs_unix_paths, &s->key);
			if (pr && (pr->ops & OP_CONNECT))
				return;
		}
	} else {
		/* Bound, but not in the filesystem: an abstract name. */
		s->pw.buf[0] = '@';
		s->pw.buf[1] = 0;
		s->pw.flags = 0;
	}
	__u32 verdict = backstop_verdict(sb, action);
	if (verdict == VERDICT_ALLOWED)
		return;
	if (verdict == VERDICT_KILLED)
		bpf_send_signal(SIGKILL);
	struct inode *pi = p.dentry ? BPF_CORE_READ(p.dentry, d_inode) : NULL;
	send_file_event(s, verdict, rule_id, root, sb, NR_connect, CAT_UNIX_PEER, (struct file_ident){
		.ino = pi ? BPF_CORE_READ(pi, i_ino) : 0,
		.dev = pi ? BPF_CORE_READ(pi, i_sb, s_dev) : 0,
		.i_mode = S_IFSOCK_,
	});
}
