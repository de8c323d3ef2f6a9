/* Anonymous inodes: userfaultfd and io_uring. */
#pragma once

/* The kernel names the anonymous inode it creates for a userfaultfd
 * ("[userfaultfd]") and, on kernels that give io_uring a secure inode,
 * for a ring ("[io_uring]"). */
static __always_inline int decide_anon_inode(__u32 mech, const struct qstr *name, int ret)
{
	if (ret)
		return ret;
	char n[16] = {};
	bpf_probe_read_kernel_str(n, sizeof(n), BPF_CORE_READ(name, name));
	__u32 op;
	if (n[0] == '[' && n[1] == 'u' && n[2] == 's' && n[3] == 'e' && n[4] == 'r' && n[5] == 'f' && n[11] == 'd' && n[12] == ']')
		op = LSM_OP_USERFAULTFD;
	else if (n[0] == '[' && n[1] == 'i' && n[2] == 'o' && n[3] == '_' && n[4] == 'u' && n[8] == 'g' && n[9] == ']')
		op = LSM_OP_IO_URING;
	else
		return 0;
	return judge_op(mech, op, EV_OPERATION, 0);
}
WATCHER_HOOK(inode_init_security_anon, security_inode_init_security_anon, decide_anon_inode(mech, name, ret),
	     struct inode *inode, const struct qstr *name, const struct inode *context_inode, int ret)
