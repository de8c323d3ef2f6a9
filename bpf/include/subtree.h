/* Own-subtree checks (issue 25): whether a task a syscall reaches belongs
 * to the caller's sandbox, judged on kernel state. A task is inside when
 * its cgroup on the default (v2) hierarchy is the sandbox root or a
 * descendant of it, whatever pid namespace it is seen from.
 *
 * Pids in syscall arguments are numbers of the caller's pid namespace:
 * they are resolved with bpf_task_from_vpid (Linux >= 6.13), else, for a
 * caller in the initial namespace only, bpf_task_from_pid. A pid that
 * resolves to no task is left to the kernel (ESRCH). */
#ifndef WATCHER_SUBTREE_H
#define WATCHER_SUBTREE_H

extern struct task_struct *bpf_task_from_pid(s32 pid) __ksym __weak;
extern struct task_struct *bpf_task_from_vpid(s32 vpid) __ksym __weak;
extern void bpf_task_release(struct task_struct *p) __ksym __weak;

#ifndef bpf_ksym_exists
#define bpf_ksym_exists(sym) (!!(sym))
#endif

#define ST_PIDTYPE_TGID 1
#define ST_MAX_PID_LEVEL 32

/* st_pid_nr is a struct pid's number at namespace level lvl (0 when the
 * pid is not seen there). */
static __always_inline __s32 st_pid_nr(struct pid *p, __u32 lvl)
{
	if (!p || lvl > ST_MAX_PID_LEVEL || BPF_CORE_READ(p, level) < lvl)
		return 0;
	__s32 nr = 0;
	bpf_probe_read_kernel(&nr, sizeof(nr), &p->numbers[lvl].nr);
	return nr;
}

/* st_own_level is the level of the caller's active pid namespace. */
static __always_inline __u32 st_own_level(void)
{
	struct task_struct *cur = (struct task_struct *)bpf_get_current_task_btf();
	return BPF_CORE_READ(cur, thread_pid, level);
}

/* st_own_vtgid is the caller's process id as its own namespace numbers it
 * (what getpid returns there). */
static __always_inline __s32 st_own_vtgid(void)
{
	struct task_struct *cur = (struct task_struct *)bpf_get_current_task_btf();
	struct pid *p = BPF_CORE_READ(cur, signal, pids[ST_PIDTYPE_TGID]);
	return st_pid_nr(p, st_own_level());
}

/* st_cgroup_in is whether cgroup cg is the cgroup with id root or below it. */
static __always_inline bool st_cgroup_in(struct cgroup *cg, __u64 root)
{
	int level = BPF_CORE_READ(cg, level);
	for (int i = 0; i <= MAX_CGROUP_DEPTH; i++) {
		if (i > level)
			break;
		struct cgroup *anc = NULL;
		bpf_probe_read_kernel(&anc, sizeof(anc), &cg->ancestors[i]);
		if (!anc)
			break;
		if (BPF_CORE_READ(anc, kn, id) == root)
			return true;
	}
	return false;
}

/* st_task_below is whether task t's cgroup on the default hierarchy (the
 * one current_sandbox reads) is root or below it: the test current_sandbox
 * makes of the current task, made of t. */
static __always_inline bool st_task_below(struct task_struct *t, __u64 root)
{
	return st_cgroup_in(BPF_CORE_READ(t, cgroups, dfl_cgrp), root);
}

/* st_task_in is whether task t belongs to the subtree of sandbox root, for
 * a caller inside it: a task of the caller's own cgroup is inside without
 * the walk. */
static __always_inline bool st_task_in(struct task_struct *t, __u64 root)
{
	struct cgroup *cg = BPF_CORE_READ(t, cgroups, dfl_cgrp);
	struct task_struct *cur = (struct task_struct *)bpf_get_current_task_btf();
	if (cg == BPF_CORE_READ(cur, cgroups, dfl_cgrp))
		return true;
	return st_cgroup_in(cg, root);
}

/* st_vpid_outside resolves vpid in the caller's pid namespace: the tgid
 * (initial namespace) of its process when that task is outside the
 * subtree of root, else 0 (inside, or no such task: the kernel fails the
 * call). */
static __always_inline __u32 st_vpid_outside(__s64 vpid, __u64 root)
{
	if (vpid <= 0 || vpid > 0x3fffffff)
		return 0;
	struct task_struct *t = NULL;
	if (bpf_ksym_exists(bpf_task_from_vpid))
		t = bpf_task_from_vpid(vpid);
	else if (bpf_ksym_exists(bpf_task_from_pid) && st_own_level() == 0)
		t = bpf_task_from_pid(vpid);
	if (!t)
		return 0;
	__u32 out = st_task_in(t, root) ? 0 : BPF_CORE_READ(t, tgid);
	bpf_task_release(t);
	return out;
}

/* st_pid_outside is st_vpid_outside for a pid of the initial namespace
 * (what a pidfd's struct pid gives as numbers[0]). */
static __always_inline __u32 st_pid_outside(__s64 pid, __u64 root)
{
	if (pid <= 0 || pid > 0x3fffffff || !bpf_ksym_exists(bpf_task_from_pid))
		return 0;
	struct task_struct *t = bpf_task_from_pid(pid);
	if (!t)
		return 0;
	__u32 out = st_task_in(t, root) ? 0 : BPF_CORE_READ(t, tgid);
	bpf_task_release(t);
	return out;
}

#endif
