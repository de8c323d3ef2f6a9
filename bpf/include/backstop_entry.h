/* Own subtree and host-wide state, judged at sys_enter from a call's arguments. */
#pragma once

/* entry_category picks the category of a call from its registers only,
 * before the caller's sandbox is looked up, so the hot calls of every task
 * (ioctl, fcntl, signals to its own threads) leave at once. subtree_target
 * then judges the target on kernel state. The call itself still runs: a
 * SIGKILL queued at sys_enter is acted on when the task returns to user
 * space (a signal sent, a limit set, the clock set, before it dies).
 */

#define TIOCSTI_ 0x5412
#define TIOCLINUX_ 0x541C
/* CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWPID|NEWNET|NEWTIME: namespaces
 * that ask for CAP_SYS_ADMIN (a new user namespace alone does not: the
 * user-namespaces rule). */
#define CLONE_NS_ADMIN 0x6e020080ULL
#define NSFS_MAGIC_ 0x6e736673
#define PRIO_PROCESS_ 0
#define IOPRIO_WHO_PROCESS_ 1
#define TARGET_MANY 0xffffffffu /* a process group, a user's processes, every process */

/* net_config_ioctl: the socket ioctls (0x89xx, wireless 0x8Bxx) that
 * change interfaces, addresses, routes, ARP, bridges, bonds, VLANs; every
 * one asks for CAP_NET_ADMIN. The reads (SIOCGIF*, SIOCGARP, timestamps,
 * owners) stay allowed. */
static __always_inline bool net_config_ioctl(__u32 cmd)
{
	if (cmd >= 0x8B00 && cmd <= 0x8BDF)
		return !(cmd & 1); /* wireless: even numbers set */
	if (cmd < 0x890B || cmd > 0x89FF)
		return false;
	switch (cmd) {
	case 0x8910: case 0x8912: case 0x8913: case 0x8915: case 0x8917: case 0x8919:
	case 0x891b: case 0x891d: case 0x891f: case 0x8921: case 0x8925: case 0x8927:
	case 0x8929: case 0x8933: case 0x8935: case 0x8938: case 0x8940: case 0x8942:
	case 0x8946: /* SIOCETHTOOL: its set commands are in user memory (not covered) */
	case 0x8947: case 0x8948: case 0x894B: case 0x894C: case 0x8954: case 0x8961:
	case 0x8970: case 0x8982: case 0x89b1:
		return false;
	}
	return true;
}

static __always_inline bool signal_nr(long nr)
{
	return nr == NR_kill || nr == NR_tkill || nr == NR_tgkill || nr == NR_rt_sigqueueinfo ||
	       nr == NR_rt_tgsigqueueinfo || nr == NR_pidfd_send_signal;
}

static __always_inline __u32 entry_category(__u32 cat, long nr, struct pt_regs *regs)
{
	long a0 = BPF_CORE_READ(regs, di);
	switch (nr) {
	case NR_ioctl: {
		__u32 cmd = BPF_CORE_READ(regs, si);
		if (cmd == TIOCSTI_ || cmd == TIOCLINUX_)
			return CAT_TTY_INJECT;
		if (cmd == FIOSETOWN_ || cmd == SIOCSPGRP_)
			return CAT_OTHER_TASK;
		return net_config_ioctl(cmd) ? CAT_NET_CONFIG : CAT_NONE;
	}
	case NR_fcntl: {
		__u32 cmd = BPF_CORE_READ(regs, si);
		return cmd == F_SETOWN_ || cmd == F_SETOWN_EX_ ? CAT_OTHER_TASK : CAT_NONE;
	}
	case NR_kill: case NR_tkill: case NR_rt_sigqueueinfo:
	case NR_tgkill: case NR_rt_tgsigqueueinfo:
		/* Its own process (tgkill: a thread of it; the kernel checks the
		 * thread is in that group): the Go runtime's preemption. */
		if (a0 > 0 && a0 == st_own_vtgid())
			return CAT_NONE;
		return CAT_OTHER_TASK;
	case NR_prlimit64:
		/* No new limit: a read. pid 0: itself. */
		return a0 == 0 || BPF_CORE_READ(regs, dx) == 0 ? CAT_NONE : CAT_OTHER_TASK;
	case NR_sched_setparam: case NR_sched_setscheduler: case NR_sched_setaffinity:
	case NR_sched_setattr: case NR_migrate_pages: case NR_move_pages:
		return a0 == 0 ? CAT_NONE : CAT_OTHER_TASK;
	case NR_setpriority:
		return a0 == PRIO_PROCESS_ && BPF_CORE_READ(regs, si) == 0 ? CAT_NONE : CAT_OTHER_TASK;
	case NR_ioprio_set:
		return a0 == IOPRIO_WHO_PROCESS_ && BPF_CORE_READ(regs, si) == 0 ? CAT_NONE : CAT_OTHER_TASK;
	case NR_pidfd_send_signal: case NR_pidfd_open: case NR_process_madvise: case NR_kcmp:
		return CAT_OTHER_TASK;
	case NR_adjtimex: case NR_clock_adjtime:
		return CAT_CLOCK_ADJUST;
	case NR_setns:
		return CAT_NAMESPACES;
	case NR_unshare:
		return (a0 & CLONE_NS_ADMIN) ? CAT_NAMESPACES : CAT_NONE;
	case NR_clone:
		if ((a0 & CLONE_FILES) && !(a0 & CLONE_THREAD))
			return CAT_CLONE_FILES;
		return (a0 & CLONE_NS_ADMIN) ? CAT_NAMESPACES : CAT_NONE;
	case NR_shmat: case NR_semop: case NR_semtimedop: case NR_msgsnd: case NR_msgrcv:
	case NR_mq_timedsend: case NR_mq_timedreceive: case NR_mq_notify:
		return CAT_OTHER_IPC;
	case NR_shmctl: case NR_msgctl:
		return ipc_ctl_changes(nr, BPF_CORE_READ(regs, si)) ? CAT_OTHER_IPC : CAT_NONE;
	case NR_semctl:
		return ipc_ctl_changes(nr, BPF_CORE_READ(regs, dx)) ? CAT_OTHER_IPC : CAT_NONE;
	case NR_syslog:
		/* 4 READ_CLEAR, 5 CLEAR, 6 CONSOLE_OFF, 7 CONSOLE_ON, 8 CONSOLE_LEVEL */
		return a0 >= 4 && a0 <= 8 ? CAT_SYSLOG : CAT_NONE;
	case NR_quotactl: case NR_quotactl_fd: {
		__u32 sub = (nr == NR_quotactl ? (__u32)a0 : (__u32)BPF_CORE_READ(regs, si)) >> 8;
		/* Reads: Q_SYNC, Q_GETFMT, Q_GETINFO, Q_GETQUOTA, Q_GETNEXTQUOTA
		 * and the XFS gets. */
		switch (sub) {
		case 0x800001: case 0x800004: case 0x800005: case 0x800007: case 0x800009:
		case 0x5803: case 0x5805: case 0x5807: case 0x5808: case 0x5809:
			return CAT_NONE;
		}
		return CAT_QUOTA;
	}
	}
	return cat;
}

/* host_cap_held: the caller holds capability cap over the initial user
 * namespace (its credentials are in it and cap is effective): only then can
 * a host-state call change the host. A caller without it gets the kernel's
 * EPERM (watcher exec drops them); one in a user namespace of its own
 * changes only its own namespaces. */
static __always_inline bool host_cap_held(int cap)
{
	struct task_struct *t = (struct task_struct *)bpf_get_current_task_btf();
	const struct cred *cred = BPF_CORE_READ(t, cred);
	if (BPF_CORE_READ(cred, user_ns, level) != 0)
		return false;
	__u64 eff = 0;
	bpf_probe_read_kernel(&eff, sizeof(eff), &cred->cap_effective);
	return (eff >> cap) & 1;
}

/* host_cap_of is the capability a host-state call needs (-1: none of
 * them; internal/dangerous HostState). */
static __always_inline int host_cap_of(long nr, __u32 cat)
{
	switch (cat) {
	case CAT_NET_CONFIG: return 12;
	case CAT_CLOCK_ADJUST: return 25;
	case CAT_NAMESPACES: case CAT_QUOTA: return 21;
	case CAT_SYSLOG: return 34;
	}
	switch (nr) {
	case NR_settimeofday: case NR_clock_settime: return 25;
	case NR_sethostname: case NR_setdomainname: case NR_fanotify_init: return 21;
	}
	return -1;
}

/* pidfd_or_proc_pid is the pid (initial namespace) behind a descriptor
 * naming a process: a pidfd, or a /proc/PID directory (pidfd_send_signal
 * accepts both). 0 for other files. */
static __always_inline __u32 pidfd_or_proc_pid(long fd)
{
	__u32 pid = pidfd_pid(fd);
	if (pid)
		return pid;
	struct file *f = pw_fd_file(fd);
	if (!f)
		return 0;
	struct inode *inode = BPF_CORE_READ(f, f_inode);
	if (BPF_CORE_READ(inode, i_sb, s_magic) != PROC_SUPER_MAGIC)
		return 0;
	struct proc_inode *pi = (void *)inode - bpf_core_field_offset(struct proc_inode, vfs_inode);
	struct pid *p = BPF_CORE_READ(pi, pid);
	return p ? st_pid_nr(p, 0) : 0;
}

/* owner_outside judges a new SIGIO/SIGURG owner: > 0 a process, < 0 a
 * process group (refused: its members are not looked at), 0 none. */
static __always_inline __u32 owner_outside(long owner, __u64 root)
{
	if (owner < 0)
		return TARGET_MANY;
	return st_vpid_outside(owner, root);
}

/* subtree_target returns the process outside the subtree of root that a
 * CAT_OTHER_TASK call reaches (its tgid, TARGET_MANY for groups, users
 * and every process), 0 when it stays inside. Process-group signals are
 * left to signal_generate, which sees each member the kernel signals. */
static __always_inline __u32 subtree_target(long nr, struct pt_regs *regs, __u64 root)
{
	long a0 = BPF_CORE_READ(regs, di), a1 = BPF_CORE_READ(regs, si), a2 = BPF_CORE_READ(regs, dx);
	switch (nr) {
	case NR_kill:
		if (a0 == -1)
			return TARGET_MANY;
		return a0 > 0 ? st_vpid_outside(a0, root) : 0;
	case NR_tkill: case NR_rt_sigqueueinfo: case NR_pidfd_open:
	case NR_sched_setparam: case NR_sched_setscheduler: case NR_sched_setaffinity:
	case NR_sched_setattr: case NR_migrate_pages: case NR_move_pages: case NR_prlimit64:
		return st_vpid_outside(a0, root);
	case NR_tgkill: case NR_rt_tgsigqueueinfo:
		return st_vpid_outside(a1, root);
	case NR_kcmp: {
		__u32 t = st_vpid_outside(a0, root);
		return t ? t : st_vpid_outside(a1, root);
	}
	case NR_pidfd_send_signal: case NR_process_madvise:
		return st_pid_outside(pidfd_or_proc_pid(a0), root);
	case NR_setpriority: case NR_ioprio_set:
		/* A process by pid (0 left at entry_category); groups and users
		 * reach whatever processes they hold. */
		if (a0 == (nr == NR_setpriority ? PRIO_PROCESS_ : IOPRIO_WHO_PROCESS_))
			return st_vpid_outside(a1, root);
		return TARGET_MANY;
	case NR_fcntl:
		if ((__u32)a1 == F_SETOWN_)
			return owner_outside((int)a2, root);
		/* F_SETOWN_EX: struct f_owner_ex {int type; pid_t pid;} in user
		 * memory, read at entry (another thread may change it after). */
		{
			int ex[2] = {};
			if (bpf_probe_read_user(ex, sizeof(ex), (void *)a2))
				return 0; /* EFAULT */
			if (ex[0] == 2 /* F_OWNER_PGRP */)
				return ex[1] ? TARGET_MANY : 0;
			return st_vpid_outside(ex[1], root);
		}
	case NR_ioctl: {
		/* FIOSETOWN / SIOCSPGRP: the owner is an int in user memory. */
		int owner = 0;
		if (bpf_probe_read_user(&owner, sizeof(owner), (void *)a2))
			return 0;
		return owner_outside(owner, root);
	}
	}
	return 0;
}

/* setns_foreign: setns to a namespace file that is not one the caller is
 * already in, or to a process outside its subtree (pidfd). */
static __always_inline bool setns_foreign(long fd, __u64 root)
{
	__u32 pid = pidfd_pid(fd);
	if (pid)
		return st_pid_outside(pid, root) != 0;
	struct file *f = pw_fd_file(fd);
	if (!f)
		return false; /* EBADF */
	struct inode *inode = BPF_CORE_READ(f, f_inode);
	if (BPF_CORE_READ(inode, i_sb, s_magic) != NSFS_MAGIC_)
		return false; /* EINVAL */
	__u64 ino = BPF_CORE_READ(inode, i_ino);
	struct task_struct *t = (struct task_struct *)bpf_get_current_task_btf();
	return ino != BPF_CORE_READ(t, nsproxy, mnt_ns, ns.inum) &&
	       ino != BPF_CORE_READ(t, nsproxy, uts_ns, ns.inum) &&
	       ino != BPF_CORE_READ(t, nsproxy, ipc_ns, ns.inum) &&
	       ino != BPF_CORE_READ(t, nsproxy, net_ns, ns.inum) &&
	       ino != BPF_CORE_READ(t, nsproxy, cgroup_ns, ns.inum) &&
	       ino != BPF_CORE_READ(t, nsproxy, pid_ns_for_children, ns.inum) &&
	       ino != BPF_CORE_READ(t, thread_pid, numbers[0].ns, ns.inum) &&
	       ino != BPF_CORE_READ(t, cred, user_ns, ns.inum);
}

/* clock_adjust_sets: adjtimex/clock_adjtime with modes set (a read has
 * modes 0). The struct is in user memory: read at entry, another thread
 * may set modes after; the cap_capable program sees the CAP_SYS_TIME the
 * kernel then checks (after the fact). */
static __always_inline bool clock_adjust_sets(long nr, struct pt_regs *regs)
{
	__u64 buf = nr == NR_adjtimex ? BPF_CORE_READ(regs, di) : BPF_CORE_READ(regs, si);
	__u32 modes = 0;
	if (bpf_probe_read_user(&modes, sizeof(modes), (void *)buf))
		return false; /* EFAULT */
	return modes != 0;
}

static __always_inline __u64 current_mnt_ns(void)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
	return BPF_CORE_READ(task, nsproxy, mnt_ns, ns.inum);
}
