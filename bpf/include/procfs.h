/* /proc/PID files that show what a process holds (issue 25): environ,
 * auxv, the memory maps, open descriptors, stack, syscall, io, timers.
 * The kernel asks a ptrace-mode read check for most of them (the LSM's
 * ptrace_access_check judges those); the fd and fdinfo listings ask for
 * none, so file_open judges them itself. The kill backstop judges the
 * whole list when the open returns. cmdline, stat and status stay
 * readable, as ps and top need. */
#ifndef WATCHER_PROCFS_H
#define WATCHER_PROCFS_H

enum proc_judged {
	PROC_NOT_JUDGED = 0,
	PROC_PTRACE_CHECKED = 1, /* the kernel checks ptrace read access */
	PROC_UNCHECKED = 2,      /* fd, fdinfo: listed with no ptrace check */
};

/* proc_name_is: the first n bytes of a /proc name (NUL included) are s. */
static __always_inline bool proc_name_is(const char *buf, const char *s, int n)
{
	for (int i = 0; i < n && i < 16; i++)
		if (buf[i] != s[i])
			return false;
	return true;
}

/* proc_judged_name sorts the /proc file the dentry names (also under
 * task/TID, and the entries of fdinfo). */
static __always_inline enum proc_judged proc_judged_name(struct dentry *d)
{
	char b[16] = {}, pb[8] = {};
	bpf_probe_read_kernel(b, sizeof(b), BPF_CORE_READ(d, d_name.name));
	bpf_probe_read_kernel(pb, sizeof(pb), BPF_CORE_READ(d, d_parent, d_name.name));
	if (proc_name_is(b, "fd", 3) || proc_name_is(b, "fdinfo", 7) || proc_name_is(pb, "fdinfo", 7))
		return PROC_UNCHECKED;
	if (proc_name_is(b, "environ", 8) || proc_name_is(b, "auxv", 5) || proc_name_is(b, "maps", 5) ||
	    proc_name_is(b, "smaps", 6) || proc_name_is(b, "smaps_rollup", 13) || proc_name_is(b, "numa_maps", 10) ||
	    proc_name_is(b, "pagemap", 8) || proc_name_is(b, "stack", 6) || proc_name_is(b, "syscall", 8) ||
	    proc_name_is(b, "io", 3) || proc_name_is(b, "personality", 12) || proc_name_is(b, "timers", 7) ||
	    proc_name_is(b, "map_files", 10))
		return PROC_PTRACE_CHECKED;
	return PROC_NOT_JUDGED;
}

/* proc_inode_pid is the struct pid a /proc/PID inode stands for. */
static __always_inline struct pid *proc_inode_pid(struct inode *inode)
{
	struct proc_inode *pi = (struct proc_inode *)((void *)inode -
						      bpf_core_field_offset(struct proc_inode, vfs_inode));
	return BPF_CORE_READ(pi, pid);
}

/* pid_leader_task is the task whose pid p is (NULL once it is gone). */
static __always_inline struct task_struct *pid_leader_task(struct pid *p)
{
	if (!p)
		return NULL;
	struct hlist_node *first = BPF_CORE_READ(p, tasks[0].first);
	if (!first)
		return NULL;
	return (struct task_struct *)((void *)first - bpf_core_field_offset(struct task_struct, pid_links));
}

#endif
