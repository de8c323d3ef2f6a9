/* Backstop rule lookups: host-wide gates, a sandbox's own actions, the agent as a target. */
#pragma once

#ifndef bpf_ksym_exists
#define bpf_ksym_exists(sym) (!!(sym))
#endif

extern int bpf_send_signal_task(struct task_struct *task, int sig, enum pid_type type, __u64 value) __ksym __weak;

static __always_inline struct scratch *get_scratch(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&bs_scratch, &zero);
}

/* any_category reports whether some sandbox has a rule for cat (the
 * host-wide gate, an array lookup). */
static __always_inline bool any_category(__u32 cat)
{
	struct category_rule *c = bpf_map_lookup_elem(&bs_categories, &cat);
	return c && c->action;
}

/* sandbox_rule is the one lookup of a sandbox's syscall or category
 * action (what: SBR_* | number): its own entry, else the every-sandbox
 * entry (id 0), else 0 (allow). The rule id goes to *rule_id. Values, not
 * a pointer: a pointer kept across the event code is lost by 6.1's
 * verifier (it reloads it as a scalar). Nested cgroups resolve to their
 * sandbox root's id before. */
static __always_inline __u32 sandbox_rule(__u32 sandbox_id, __u32 what, __u32 *rule_id)
{
	struct sb_rule_key k = { .sandbox_id = sandbox_id, .what = what };
	struct category_rule *r = bpf_map_lookup_elem(&bs_sb_rules, &k);
	if (!r) {
		k.sandbox_id = 0;
		r = bpf_map_lookup_elem(&bs_sb_rules, &k);
	}
	if (!r)
		return 0;
	*rule_id = r->rule_id;
	return r->action;
}

/* sandbox_category is sandbox_rule for a category, behind the host-wide
 * gate. */
static __always_inline __u32 sandbox_category(__u32 sandbox_id, __u32 cat, __u32 *rule_id)
{
	if (!any_category(cat))
		return 0;
	return sandbox_rule(sandbox_id, SBR_CATEGORY | cat, rule_id);
}

/* The backstop cannot block: a block action is carried out as a kill. */
static __always_inline __u32 backstop_verdict(struct sandbox *sb, __u32 action)
{
	if (action == ACTION_BLOCK)
		action = ACTION_KILL;
	return effective_verdict(sb, action);
}

#define PIDFS_MAGIC 0x50494446
#define ANON_INODE_FS_MAGIC 0x09041934

/* pidfd_pid returns the pid a pidfd refers to: pidfs (Linux >= 6.9) keeps
 * the struct pid in the inode, older kernels' anon-inode pidfds in the
 * file. Other files give 0. */
static __always_inline __u32 pidfd_pid(long fd)
{
	struct file *f = pw_fd_file(fd);
	if (!f)
		return 0;
	struct inode *inode = BPF_CORE_READ(f, f_inode);
	unsigned long magic = BPF_CORE_READ(inode, i_sb, s_magic);
	struct pid *p;
	if (magic == PIDFS_MAGIC)
		p = BPF_CORE_READ(inode, i_private);
	else if (magic == ANON_INODE_FS_MAGIC)
		p = BPF_CORE_READ(f, private_data);
	else
		return 0;
	if (!p)
		return 0;
	int nr = 0;
	bpf_probe_read_kernel(&nr, sizeof(nr), &p->numbers[0].nr);
	return nr > 0 ? nr : 0;
}

/* target_is_agent checks a kill-family syscall's target. kill(-1) signals
 * every process the caller may signal, the agent included. */
static __always_inline bool target_is_agent(long nr, struct pt_regs *regs, __u32 *target)
{
	long a0 = BPF_CORE_READ(regs, di);
	__u32 agent = 0, zero = 0;
	__u32 *ap = bpf_map_lookup_elem(&agent_tgid, &zero);
	if (ap)
		agent = *ap;
	if (!agent)
		return false;
	switch (nr) {
	case NR_kill:
		if (a0 == -1) {
			*target = agent;
			return true;
		}
		/* fallthrough */
	case NR_tkill:
	case NR_tgkill:
	case NR_rt_sigqueueinfo:
	case NR_rt_tgsigqueueinfo:
		*target = (__u32)a0;
		return a0 == agent;
	case NR_pidfd_send_signal:
		*target = pidfd_pid(a0);
		return *target == agent;
	}
	return false;
}

static __always_inline bool category_matches(__u32 cat, long nr, struct pt_regs *regs, __u32 *target)
{
	switch (cat) {
	case CAT_CLONE_FILES: {
		__u64 flags = 0;
		if (nr == NR_clone) {
			flags = BPF_CORE_READ(regs, di);
		} else if (nr == NR_clone3) {
			struct clone_args *ua = (struct clone_args *)BPF_CORE_READ(regs, di);
			if (bpf_probe_read_user(&flags, sizeof(flags), &ua->flags))
				return true; /* unreadable: clone3 will fail or race; refuse */
		} else {
			return false;
		}
		return (flags & CLONE_FILES) && !(flags & CLONE_THREAD);
	}
	case CAT_SIGNAL_AGENT:
		return target_is_agent(nr, regs, target);
	case CAT_IO_URING:
		return true;
	case CAT_PACKET_SOCKET:
		/* The family is a register: nothing to race. */
		return nr == NR_socket && BPF_CORE_READ(regs, di) == 17 /* AF_PACKET */;
	}
	return false;
}
