/* Exec rules: the file that supplies the code. */
#pragma once

#define PROT_EXEC 0x4
#define MATCH_EXEC 6
#define MATCH_FILELESS 7 /* the fileless-exec op: a file with no name */

/* judge_exec judges op on file by the exec rules (the sandbox's, else the
 * defaults). A file with no name (memfd_create + execveat, a file deleted
 * after it was opened, O_TMPFILE) has no path an exec rule could give: it
 * is judged by the fileless-exec op instead. */
static __always_inline int judge_exec(__u32 mech, __u32 op, struct file *file)
{
	if (!file)
		return 0;
	struct file_ctx c;
	if (!file_begin(&c))
		return 0;
	struct path fp = BPF_CORE_READ(file, f_path);
	bool truncated = key_from_walk(c.key, c.pw, &fp);
	struct inode *inode = BPF_CORE_READ(file, f_inode);
	struct file_facts f;
	facts_of(&f, inode, BPF_CORE_READ(inode, i_sb));

	struct decision d = { .action = ACTION_ALLOW };
	__u32 match = MATCH_EXEC;
	if (!BPF_CORE_READ(inode, __i_nlink)) {
		d = op_decision(c.sb->id, LSM_OP_EXEC_FILELESS, ACTION_ALLOW);
		match = MATCH_FILELESS;
		/* Its pseudo path is "/": report the name it was given
		 * ("memfd:payload"). */
		bpf_probe_read_kernel_str(c.key->path, sizeof(c.key->path), BPF_CORE_READ(file, f_path.dentry, d_name.name));
	} else {
		c.key->sandbox_id = c.sb->id;
		struct decision *r = bpf_map_lookup_elem(&lsm_exec_rules, c.key);
		if (!r) {
			c.key->sandbox_id = 0;
			r = bpf_map_lookup_elem(&lsm_exec_rules, c.key);
		}
		if (r)
			d = *r;
	}
	if (d.action == ACTION_ALLOW)
		return 0;
	return emit_file(EV_FILE_OP + mech, &c, d.action, d.rule_id, &f, BPF_CORE_READ(file, f_flags),
			 BPF_CORE_READ(file, f_mode), match, truncated ? FILE_F_TRUNCATED : 0, op);
}

/* Called once per binary of the chain: the file execve named, then the
 * interpreter a #! line or binfmt_misc chose; memfd and execveat arrive as
 * the file the kernel runs. The kernel function is security_bprm_check. */
static __always_inline int decide_bprm_check(__u32 mech, struct linux_binprm *bprm, int ret)
{
	if (ret)
		return ret;
	return judge_exec(mech, PATH_OP_EXEC, BPF_CORE_READ(bprm, file));
}
WATCHER_HOOK(bprm_check_security, security_bprm_check, decide_bprm_check(mech, bprm, ret),
	     struct linux_binprm *bprm, int ret)

static __always_inline int decide_mmap_exec(__u32 mech, struct file *file, unsigned long prot, int ret)
{
	if (ret)
		return ret;
	if (!(prot & PROT_EXEC) || !file)
		return 0;
	return judge_exec(mech, PATH_OP_MMAP_EXEC, file);
}
/* The LSM hook has the caller's and the kernel's protection (reqprot,
 * prot); security_mmap_file only the caller's: two wrappers by hand. The
 * caller's PROT_EXEC is what matters (READ_IMPLIES_EXEC adds it to prot
 * too, so the LSM program judges prot). */
SEC("lsm/mmap_file")
int BPF_PROG(lsm_mmap_file, struct file *file, unsigned long reqprot, unsigned long prot, unsigned long flags, int ret)
{
	return decide_mmap_exec(MECH_LSM, file, prot, ret);
}
SEC("fmod_ret/security_mmap_file")
int BPF_PROG(fmod_mmap_file, struct file *file, unsigned long prot, unsigned long flags, int ret)
{
	return decide_mmap_exec(EV_FMOD_RET, file, prot, ret);
}

/* mprotect(PROT_EXEC) of a file mapping made without it. */
static __always_inline int decide_file_mprotect(__u32 mech, struct vm_area_struct *vma, unsigned long prot, int ret)
{
	if (ret)
		return ret;
	if (!(prot & PROT_EXEC))
		return 0;
	struct file *file = BPF_CORE_READ(vma, vm_file);
	if (!file)
		return 0;
	return judge_exec(mech, PATH_OP_MMAP_EXEC, file);
}
WATCHER_HOOK(file_mprotect, security_file_mprotect, decide_file_mprotect(mech, vma, prot, ret),
	     struct vm_area_struct *vma, unsigned long reqprot, unsigned long prot, int ret)
