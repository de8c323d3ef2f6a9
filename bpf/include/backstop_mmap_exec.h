/* Code mapped from a file (mmap, mprotect PROT_EXEC), judged by the exec rules. */
#pragma once

#define PROT_EXEC_ 0x4
#define MAP_ANONYMOUS_ 0x20

/* mmap_exec_file: code mapped from a file (the dynamic loader's `ld.so
 * /tmp/x`, a hand-written loader) is judged by the exec rules like an exec
 * of the file, before the mapping exists. prot, flags and fd are
 * registers; the file is the descriptor's (kernel state). */
static __always_inline struct file *mmap_exec_file(struct pt_regs *regs)
{
	__u64 prot = BPF_CORE_READ(regs, dx), flags = BPF_CORE_READ(regs, r10);
	if (!(prot & PROT_EXEC_) || (flags & MAP_ANONYMOUS_))
		return NULL;
	return pw_fd_file((long)BPF_CORE_READ(regs, r8));
}

#define MPROTECT_MAX_VMAS 4

struct vma_file {
	struct file *file;
	__u64 end;
};

static long vma_file_cb(struct task_struct *task, struct vm_area_struct *vma, void *data)
{
	struct vma_file *v = data;
	v->file = BPF_CORE_READ(vma, vm_file);
	v->end = BPF_CORE_READ(vma, vm_end);
	return 0;
}

/* mprotect_exec_file: mprotect/pkey_mprotect adding PROT_EXEC to a file
 * mapping (mapped readable, then made executable) is judged like mmap
 * PROT_EXEC, on the kernel's VMAs in the range, not user memory: the file
 * of the first file mapping among the first MPROTECT_MAX_VMAS (one
 * judgement per call keeps the program small enough for older
 * verifiers). */
static __always_inline struct file *mprotect_exec_file(struct pt_regs *regs)
{
	if (!(BPF_CORE_READ(regs, dx) & PROT_EXEC_))
		return NULL;
	__u64 addr = BPF_CORE_READ(regs, di), end = addr + BPF_CORE_READ(regs, si);
	struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
	for (int i = 0; i < MPROTECT_MAX_VMAS && addr < end; i++) {
		struct vma_file v = {};
		if (bpf_find_vma(task, addr, vma_file_cb, &v, 0) || v.end <= addr)
			return NULL; /* a hole: the kernel refuses the call (ENOMEM) */
		if (v.file)
			return v.file;
		addr = v.end;
	}
	return NULL;
}
