/* Mappings below vm.mmap_min_addr, for bpf/backstop.c (included once, after
 * its helpers): where no mmap_addr hook loads (lsm_task.h decide_mmap_addr),
 * a sandbox member whose policy blocks CAP_SYS_RAWIO could map page 0 (the
 * kernel's cap_mmap_addr asks cap_capable() directly, never the capable
 * hook). The backstop judges the result, on kernel state, after the fact:
 *
 * - sys_exit of mmap, mremap and shmat (x86_64): the return value is the
 *   address the kernel mapped. Below the minimum (errors are above it as
 *   unsigned numbers): killed before the thread returns to user space. The
 *   mapping exists until the kill lands; another thread of the process
 *   could use it in that window.
 * - sched_process_exec: the ELF loader maps a low ELF's segments, and page
 *   0 under the MMAP_PAGE_ZERO personality, itself. The new image's VMAs
 *   are probed page by page below the minimum; one found: killed before
 *   the new program runs an instruction (exec has replaced every thread).
 * - sys_exit of the i386 (int 0x80) mapping calls, old_mmap, mmap2, mremap,
 *   shmat and ipc(SHMAT) (which returns the address in user memory): the
 *   same probe of the caller's VMAs; x32 mmap, mremap and shmat (kernels
 *   with CONFIG_X86_X32_ABI: x86_64 numbers with X32_SYSCALL_BIT) too.
 *
 * The category's action is host-wide (CAT_LOW_MAPPING); the agent writes
 * vm.mmap_min_addr into bs_lowmap_min at Load and every SetRules (0 or
 * never written: nothing is below it, as the kernel then checks nothing).
 * The probe stops at LOWMAP_MAX_PAGES pages (1 MiB): a larger minimum is
 * judged at its first MiB only by the probes (the x86_64 return values are
 * compared with the whole minimum). Stack growth (MAP_GROWSDOWN) never
 * goes below the minimum: the kernel refuses it whatever the capability.
 */
#ifndef BACKSTOP_LOWMAP_H
#define BACKSTOP_LOWMAP_H

#define NR_mremap 25
#define NR_shmat 30
#define NR32_old_mmap 90
#define NR32_ipc 117
#define NR32_mremap 163
#define NR32_mmap2 192
#define NR32_shmat 397
#define IPC_SHMAT_ 21
#define MMAP_PAGE_ZERO_ 0x0100000
#define LOWMAP_MAX_PAGES 256

BS_MAP(bs_lowmap_min, BPF_MAP_TYPE_ARRAY, __u32, __u64, 1);

/* lowmap_min is vm.mmap_min_addr as the agent last wrote it (an array
 * lookup the verifier inlines). */
static __always_inline __u64 lowmap_min(void)
{
	__u32 zero = 0;
	__u64 *m = bpf_map_lookup_elem(&bs_lowmap_min, &zero);
	return m ? *m : 0;
}

/* lowmap_report kills (or records) the current task for a mapping at addr
 * below min, in a sandbox, when the category is set. Event: a syscall
 * event of category CAT_LOW_MAPPING whose args are {addr, personality,
 * min}; ret is the syscall's return value. */
static __always_inline void lowmap_report(__s64 nr, long ret, __u64 addr, __u64 min)
{
	if (!any_category(CAT_LOW_MAPPING))
		return;
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb)
		return;
	__u32 rule_id = 0;
	__u32 action = sandbox_rule(sb->id, SBR_CATEGORY | CAT_LOW_MAPPING, &rule_id);
	if (!action)
		return;
	__u32 verdict = backstop_verdict(sb, action);
	if (verdict == VERDICT_ALLOWED)
		return;
	if (verdict == VERDICT_KILLED)
		bpf_send_signal(SIGKILL);
	struct syscall_event *e = reserve_event(SYSCALL_EVENT_COMPACT, true);
	if (!e)
		return;
	__builtin_memset(e, 0, SYSCALL_EVENT_COMPACT);
	fill_hdr(&e->hdr, EV_KILL_SYSCALL, verdict, rule_id, root, sb);
	struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
	e->nr = nr;
	e->ret = ret;
	e->args[0] = addr;
	e->args[1] = BPF_CORE_READ(task, personality);
	e->args[2] = min;
	e->category = CAT_LOW_MAPPING;
	e->mnt_ns = current_mnt_ns();
	submit_event(e, true);
}

/* lowmap_exit: an x86_64 mmap, mremap or shmat returned. One comparison
 * for the common case (an address at or above the minimum, or an error). */
static __always_inline void lowmap_exit(long nr, long ret)
{
	__u64 min = lowmap_min();
	if ((unsigned long)ret >= min)
		return;
	lowmap_report(nr, ret, (unsigned long)ret, min);
}

struct lowmap_probe {
	__u64 min;
	__u64 addr; /* start of the VMA found */
	__u32 hit;
	__u32 pad;
};

static long lowmap_vma_cb(struct task_struct *task, struct vm_area_struct *vma, void *data)
{
	struct lowmap_probe *p = data;
	p->addr = BPF_CORE_READ(vma, vm_start);
	p->hit = 1;
	return 0;
}

/* bpf_find_vma only calls back for a VMA containing the address: one
 * probe per page. It fails (-EBUSY) when the mm's lock is held for
 * writing; at exec only the exec'ing thread uses the new mm, and at a
 * compat call's return nothing else of this thread writes it. */
static long lowmap_probe_step(__u64 i, void *arg)
{
	struct lowmap_probe *p = arg;
	__u64 addr = i << 12;
	if (addr >= p->min)
		return 1;
	struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
	bpf_find_vma(task, addr, lowmap_vma_cb, p, 0);
	return p->hit;
}

/* lowmap_probe judges the current task's VMAs below the minimum, for a
 * sandbox member when the category is set (checked first: the probe costs
 * one VMA lookup per page). */
static __always_inline void lowmap_probe(__s64 nr, long ret)
{
	if (!any_category(CAT_LOW_MAPPING))
		return;
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb)
		return;
	__u32 rid = 0;
	if (!sandbox_rule(sb->id, SBR_CATEGORY | CAT_LOW_MAPPING, &rid))
		return;
	struct lowmap_probe p = { .min = lowmap_min() };
	if (!p.min)
		return;
	bpf_loop(LOWMAP_MAX_PAGES, lowmap_probe_step, &p, 0);
	if (p.hit)
		lowmap_report(nr, ret, p.addr, p.min);
}

/* lowmap_compat_exit: an i386 (or x32) syscall returned; the mapping calls
 * are probed. */
static __always_inline void lowmap_compat_exit(struct pt_regs *regs, long nr, long ret)
{
	if (ret < 0)
		return;
	bool mapping = false;
	if (nr & X32_SYSCALL_BIT) {
		long n = nr & ~X32_SYSCALL_BIT;
		mapping = n == NR_mmap || n == NR_mremap || n == NR_shmat;
	} else {
		mapping = nr == NR32_old_mmap || nr == NR32_mremap || nr == NR32_mmap2 || nr == NR32_shmat ||
			  (nr == NR32_ipc && (BPF_CORE_READ(regs, bx) & 0xffff) == IPC_SHMAT_);
		nr += COMPAT_NR_BASE;
	}
	if (mapping)
		lowmap_probe(nr, ret);
}

/* After a successful exec: the new image's mappings, the loader's own. */
SEC("tp_btf/sched_process_exec")
int BPF_PROG(backstop_exec_lowmap, struct task_struct *p, pid_t old_pid, struct linux_binprm *bprm)
{
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(p);
	__s64 nr = regs ? BPF_CORE_READ(regs, orig_ax) : NR_execve;
	if (in_compat_syscall(nr))
		nr = COMPAT_NR_BASE + (nr & 0xffff);
	lowmap_probe(nr, 0);
	return 0;
}

#endif
