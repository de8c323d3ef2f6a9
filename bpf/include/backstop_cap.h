/* Capabilities used, after the check (cap_capable). */
#pragma once

/* cap_capable (Linux >= 6.14) fires after every capability check with its
 * result, silent probes included (cap_vm_enough_memory's CAP_SYS_ADMIN on
 * every mmap, inet_diag's CAP_NET_ADMIN for `ss`), so only capabilities
 * the plan lists (internal/dangerous: checked only before a change) are
 * keyed in bs_sb_rules (SBR_CAP). CAP_NET_ADMIN is judged only in a send
 * on a route, xfrm or netfilter netlink socket (rtnetlink checks it for
 * every RTM_NEW and RTM_DEL, nfnetlink for every message). The change the
 * check allowed is made before the process dies: after the fact. Checks
 * under substituted credentials (a filesystem acting for the task) are
 * not the task's.
 */

#define CAP_NET_ADMIN_ 12
#define AF_NETLINK_ 16
#define SOCKFS_MAGIC_ 0x534F434B

static __always_inline bool netlink_config_send(long nr, struct pt_regs *regs)
{
	if (nr != NR_sendmsg && nr != NR_sendto && nr != NR_write && nr != NR_writev && nr != NR_sendmmsg)
		return false;
	struct file *f = pw_fd_file(BPF_CORE_READ(regs, di));
	if (!f || BPF_CORE_READ(f, f_inode, i_sb, s_magic) != SOCKFS_MAGIC_)
		return false;
	struct socket *sock = BPF_CORE_READ(f, private_data);
	struct sock *sk = BPF_CORE_READ(sock, sk);
	if (!sk || BPF_CORE_READ(sk, __sk_common.skc_family) != AF_NETLINK_)
		return false;
	__u16 proto = BPF_CORE_READ(sk, sk_protocol);
	return proto == 0 /* ROUTE */ || proto == 6 /* XFRM */ || proto == 12 /* NETFILTER */;
}

SEC("tp_btf/cap_capable")
int BPF_PROG(backstop_cap_capable, const struct cred *cred, struct user_namespace *target_ns,
	     const struct user_namespace *capable_ns, int cap, int ret)
{
	if (ret != 0 || cap < 0 || cap > 63 || !any_category(CAT_CAP_USE))
		return 0;
	/* A capability over a user namespace below the initial one changes
	 * only namespaces of its own (a netns, a timens). */
	if (BPF_CORE_READ(target_ns, level) != 0)
		return 0;
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb)
		return 0;
	__u32 rule_id = 0;
	__u32 action = sandbox_rule(sb->id, SBR_CAP | cap, &rule_id);
	if (!action)
		return 0;
	struct task_struct *cur = (struct task_struct *)bpf_get_current_task_btf();
	if (cap == CAP_NET_ADMIN_) {
		struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(cur);
		if (!regs || !netlink_config_send(BPF_CORE_READ(regs, orig_ax), regs))
			return 0;
	} else if ((void *)cred != (void *)BPF_CORE_READ(cur, cred)) {
		return 0;
	}
	if (dying())
		return 0;
	__u32 verdict = backstop_verdict(sb, action);
	if (verdict == VERDICT_KILLED)
		bpf_send_signal(SIGKILL);
	send_after(sb, root, verdict, rule_id, CAT_CAP_USE, cap, 0, RET_UNKNOWN);
	return 0;
}
