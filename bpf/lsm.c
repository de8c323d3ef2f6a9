//go:build ignore

/* BPF LSM hooks: refuse dangerous operations from sandbox cgroups with a
 * real EPERM before they happen, or record them, per rule.
 *
 * The programs are global (lsm/...); each one first asks current_sandbox()
 * whether the task's cgroup or any ancestor is a sandbox root, so tasks
 * outside every sandbox pay one cached lookup. Rules live in pinned maps
 * keyed by sandbox id; sandbox id 0 holds defaults used when the sandbox's
 * own tables have no match. Every decision that is not a plain allow emits
 * an event on the alert ring.
 *
 * file_open judges the file the kernel actually opened: its path comes from
 * bpf_d_path() on the struct file (so symlinks, "..", /proc/self/root,
 * O_PATH re-opens through /proc/self/fd, openat2 and io_uring all arrive
 * resolved), its identity from the inode (hard links), its device number
 * and its filesystem type.
 */
#include "common.h"
#include "pathwalk.h"
#include "lsm_hook.h"
#include "tty.h"
#include "procfs.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define SIGKILL 9

/* From include/linux/fs.h and uapi headers (macros are not in BTF). */
#define FMODE_WRITE 0x2
#define O_ACCMODE 00000003
#define O_TRUNC 00001000
#define O_APPEND 00002000
#define S_IFMT 00170000
#define S_IFBLK 0060000
#define S_IFCHR 0020000
#define PTRACE_MODE_READ 0x01
#define PTRACE_MODE_ATTACH 0x02
#define PTRACE_MODE_NOAUDIT 0x04
#define CAP_OPT_NOAUDIT 0x02
#define PROC_SUPER_MAGIC 0x9fa0
#define MINORBITS 20
#define MINORMASK ((1U << MINORBITS) - 1)

/* Operations judged as a whole (not by path), per sandbox. */
enum lsm_op {
	LSM_OP_PTRACE_ATTACH = 1,    /* ptrace attach, /proc/PID/mem, process_vm_*, pidfd_getfd */
	LSM_OP_PTRACE_READ = 2,      /* read-mode access checks: /proc/PID/environ, maps, kcmp */
	LSM_OP_PTRACE_TRACEME = 3,   /* PTRACE_TRACEME: offering oneself to the parent */
	LSM_OP_MOUNT = 4,            /* mount(2), including remount, bind, move, propagation */
	LSM_OP_UMOUNT = 5,
	LSM_OP_MOVE_MOUNT = 6,       /* move_mount(2), which attaches fsmount(2) results */
	LSM_OP_PIVOT_ROOT = 7,
	LSM_OP_CHROOT = 8,
	LSM_OP_FSCONFIG = 9,         /* new mount API: fsconfig(2) parameters */
	LSM_OP_KERNEL_READ_FILE = 10, /* finit_module, kexec_file_load, firmware, policy */
	LSM_OP_KERNEL_LOAD_DATA = 11, /* init_module, kexec_load from a buffer */
	LSM_OP_BPF = 12,             /* the bpf(2) syscall */
	LSM_OP_PROC_MEM = 13,        /* opening /proc/PID/mem, any PID including self */
	LSM_OP_AGENT_SIGNAL = 14,    /* signals to the agent: blocked unless a rule says otherwise */
	LSM_OP_AGENT_PTRACE = 15,    /* ptrace access to the agent: likewise */
	LSM_OP_CLONE_INTO_CGROUP = 16, /* clone3(CLONE_INTO_CGROUP): a child started in another cgroup */
	LSM_OP_PERF_EVENT = 17,      /* perf_event_open(2) */
	LSM_OP_USERNS = 18,          /* creating a user namespace (clone, unshare) */
	LSM_OP_KEYRING = 19,         /* creating a key or keyring (add_key, keyctl) */
	LSM_OP_USERFAULTFD = 20,     /* userfaultfd(2), /dev/userfaultfd's ioctl */
	LSM_OP_IO_URING = 21,        /* io_uring_setup(2), where the kernel gives the ring a secure anon inode */
	LSM_OP_CLONE_FILES = 22,     /* clone/clone3 sharing the file table with a new process (not a thread) */
	LSM_OP_UNIX_CONNECT = 23,    /* unix connect/send to a socket outside the sandbox's socket paths */
	LSM_OP_EXEC_FILELESS = 24,   /* exec or PROT_EXEC mapping of a file with no name (memfd, deleted) */
	LSM_OP_KERNEL_IFACE = 25,    /* the kernel group of the dangerous list (iopl, acct, reboot, personality...) */
	LSM_OP_OTHER_TASK = 26,      /* a process outside the sandbox's subtree: signals, limits, scheduling, ptrace-mode reads */
	LSM_OP_OTHER_IPC = 27,       /* a System V IPC object or POSIX mqueue the sandbox did not create */
	LSM_OP_TTY_INJECT = 28,      /* TIOCSTI / TIOCLINUX on any terminal */
	LSM_OP_NOTIFY_MARK = 29,     /* a fanotify / inotify mark outside the workspaces */
	LSM_OP_MAX = 30,
};

/* Which table decided a file_open. */
enum file_match {
	MATCH_NONE = 0,
	MATCH_PATH = 1,
	MATCH_INODE = 2,
	MATCH_FS = 3,
	MATCH_DEVICE = 4,
	MATCH_PROC_MEM = 5,
	MATCH_OTHER_IPC = 8, /* a POSIX message queue the sandbox did not create (6, 7: exec) */
	MATCH_NOTIFY = 9,    /* a notify mark outside the sandbox's workspaces */
	MATCH_OTHER_TTY = 10, /* a terminal controlled by a session outside the sandbox (tty.h) */
	MATCH_OTHER_TASK = 11, /* a /proc/PID fd or fdinfo listing of a process outside (procfs.h) */
};

#define ANY 0xffffffffu
#define DEV_BLOCK 1
#define DEV_CHAR 2

/* Path rules: longest prefix match on {sandbox id, path bytes}. An exact
 * rule includes the terminating NUL in its prefix, so it matches only that
 * path while the same lookup still finds an enclosing prefix rule. */
#define LSM_PATH_LEN 252 /* LPM data is at most 256 bytes: 4 for the id */

struct path_key {
	__u32 prefixlen; /* bits after this field: 32 + 8 * bytes of path */
	__u32 sandbox_id;
	char path[LSM_PATH_LEN];
};

struct ino_key {
	__u32 sandbox_id;
	__u32 dev; /* kernel dev_t of the filesystem: MAJOR << 20 | MINOR */
	__u64 ino;
};

struct fs_key {
	__u32 sandbox_id;
	__u32 pad;
	__u64 magic; /* super_block.s_magic: CGROUP2_SUPER_MAGIC, SYSFS_MAGIC... */
};

struct dev_key {
	__u32 sandbox_id;
	__u32 type;  /* DEV_BLOCK or DEV_CHAR */
	__u32 major; /* or ANY */
	__u32 minor; /* or ANY */
};

/* What a file rule does to reads and to writes (write: FMODE_WRITE,
 * O_TRUNC or O_APPEND). */
struct access_rule {
	__u32 read_action;
	__u32 read_rule;
	__u32 write_action;
	__u32 write_rule;
};

struct op_key {
	__u32 sandbox_id;
	__u32 op; /* enum lsm_op */
};

struct decision {
	__u32 action;  /* enum action */
	__u32 rule_id;
};

/* Capabilities: one bit per CAP_* (cap < 64). Block wins over record. */
struct cap_rules {
	__u64 record;
	__u64 block;
	__u32 rule_id[64];
};

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct path_key);
	__type(value, struct access_rule);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lsm_path_rules SEC(".maps");

/* Exec rules: longest prefix match like lsm_path_rules, judged on the
 * file that supplies code (the executable, a script's interpreter, a file
 * mapped executable). */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 16384);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct path_key);
	__type(value, struct decision);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lsm_exec_rules SEC(".maps");

/* Inode entries name a file, not a number: an inode number freed by a
 * deleted file goes to the next file created (ext4, xfs: often at once),
 * and an entry written for the deleted file must not judge that one. An
 * entry holds the i_generation its file had when the agent wrote it
 * (filesystems draw a new one whenever they hand a number out again);
 * GEN_ANY where the agent could not read it (procfs, overlayfs, btrfs,
 * network filesystems): the number alone decides there. 0 is a real
 * generation (files written by mkfs). See internal/enforce/fileident.go.
 * (lsm_ino_rules, the table before, held no generation: a new name, so
 * an older agent's pin is never adopted with the wrong layout.) */
#define GEN_ANY 0xffffffffu

struct ino_rule {
	struct access_rule rule;
	__u32 generation; /* i_generation of the file, or GEN_ANY */
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct ino_key);
	__type(value, struct ino_rule);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lsm_inode_rules SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct fs_key);
	__type(value, struct access_rule);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lsm_fs_rules SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct dev_key);
	__type(value, struct access_rule);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lsm_dev_rules SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_SANDBOXES * LSM_OP_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct op_key);
	__type(value, struct decision);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lsm_op_rules SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_SANDBOXES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct cap_rules);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lsm_cap_rules SEC(".maps");

/* Per-CPU scratch: the path key and the path walk are too big for the
 * 512-byte stack. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct path_key);
} lsm_key_scratch SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct pathwalk);
} lsm_pw_scratch SEC(".maps");

/* --- events --------------------------------------------------------------- */

#define FILE_F_WRITE 1
#define FILE_F_TRUNCATED 2 /* the path is a prefix of the real one */

struct file_event {
	struct event_hdr hdr;
	__u64 ino;
	__u32 flags;   /* open flags (f_flags) */
	__u32 fmode;   /* f_mode */
	__u32 i_mode;  /* inode mode: type and permission bits */
	__u32 dev;     /* filesystem dev_t, MAJOR << 20 | MINOR */
	__u32 rdev;    /* device nodes: the device's dev_t */
	__u32 match;   /* enum file_match */
	__u32 fflags;  /* FILE_F_* */
	__u32 op;      /* enum path_op; 0 for file_open */
	__u64 magic;   /* filesystem magic */
	char path[PATH_MAX_LEN];
};

/* ptrace, signals, capabilities and bpf(2). */
struct task_event {
	struct event_hdr hdr;
	__u32 op;          /* enum lsm_op, 0 for capabilities */
	__u32 target_pid;  /* target's tgid (ptrace, signal) */
	__u32 mode;        /* ptrace mode, signal number or bpf command */
	__s32 cap;         /* capability number, -1 when not a capability */
	__u8 target_comm[TASK_COMM_LEN];
};

#define MOUNT_SRC_LEN 128
#define MOUNT_FSTYPE_LEN 32

struct mount_event {
	struct event_hdr hdr;
	__u32 op;    /* enum lsm_op */
	__u32 pad;
	__u64 flags; /* mount flags (MS_*) or umount flags */
	char source[MOUNT_SRC_LEN];
	char fstype[MOUNT_FSTYPE_LEN];
	char target[PATH_MAX_LEN];
};

struct module_event {
	struct event_hdr hdr;
	__u32 op; /* LSM_OP_KERNEL_READ_FILE or LSM_OP_KERNEL_LOAD_DATA */
	__u32 id; /* enum kernel_read_file_id / kernel_load_data_id */
	char path[PATH_MAX_LEN];
};

const struct file_event *unused_file_event __attribute__((unused));
const struct task_event *unused_task_event __attribute__((unused));
const struct mount_event *unused_mount_event __attribute__((unused));
const struct module_event *unused_module_event __attribute__((unused));
const struct path_key *unused_path_key __attribute__((unused));
const struct ino_key *unused_ino_key __attribute__((unused));
const struct ino_rule *unused_ino_rule __attribute__((unused));
const struct fs_key *unused_fs_key __attribute__((unused));
const struct dev_key *unused_dev_key __attribute__((unused));
const struct access_rule *unused_access_rule __attribute__((unused));
const struct op_key *unused_op_key __attribute__((unused));
const struct decision *unused_decision __attribute__((unused));
const struct cap_rules *unused_cap_rules __attribute__((unused));

/* --- decisions ------------------------------------------------------------ */

/* op_decision returns the sandbox's rule for op, else the default
 * (sandbox 0), else dflt. */
static __always_inline struct decision op_decision(__u32 sid, __u32 op, __u32 dflt)
{
	struct op_key k = { .sandbox_id = sid, .op = op };
	struct decision *d = bpf_map_lookup_elem(&lsm_op_rules, &k);
	if (!d) {
		k.sandbox_id = 0;
		d = bpf_map_lookup_elem(&lsm_op_rules, &k);
	}
	if (d)
		return *d;
	struct decision def = { .action = dflt };
	return def;
}

/* conclude turns an action into the hook's return value: -EPERM for a
 * denial, SIGKILL plus -EPERM for a kill. */
static __always_inline int conclude(__u32 verdict)
{
	if (verdict == VERDICT_KILLED) {
		bpf_send_signal(SIGKILL);
		return -EPERM;
	}
	return verdict == VERDICT_DENIED ? -EPERM : 0;
}

/* quiet: the kernel's NOAUDIT probes (/proc/PID/stat asking whether it may
 * show wchan, ptrace_has_cap on a non-dumpable target, ns_capable_noaudit)
 * are the kernel asking on the process's behalf and degrade gracefully when
 * refused: decided like any check but not reported, the kernel's own audit
 * convention (otherwise every `ps` in a sandbox is a refusal of the agent). */
static __always_inline int judge_task(__u32 mech, __u32 op, __u32 kind, struct decision d, struct sandbox *sb,
				      __u64 root, struct task_struct *target, __u32 mode, __s32 cap, bool quiet)
{
	if (d.action == ACTION_ALLOW)
		return 0;
	__u32 verdict = effective_verdict(sb, d.action);
	struct task_event *e = quiet ? NULL : reserve_event(sizeof(*e), true);
	if (e) {
		fill_hdr(&e->hdr, kind + mech, verdict, d.rule_id, root, sb);
		e->op = op;
		e->mode = mode;
		e->cap = cap;
		if (target) {
			e->target_pid = BPF_CORE_READ(target, tgid);
			BPF_CORE_READ_STR_INTO(&e->target_comm, target, comm);
		} else {
			e->target_pid = 0;
			e->target_comm[0] = 0;
		}
		submit_event(e, true);
	}
	return conclude(verdict);
}

/* An operation judged by its op rule: the caller's sandbox and the rule's
 * decision, shared by the mount and kernel-code hooks. */
struct op_ctx {
	__u64 root;
	struct sandbox *sb;
	struct decision d;
};

/* op_begin fills c for op; false when there is nothing to judge (the task
 * is in no sandbox, or the rule allows). */
static __always_inline bool op_begin(struct op_ctx *c, __u32 op)
{
	c->root = 0;
	c->sb = current_sandbox(&c->root);
	if (!c->sb)
		return false;
	c->d = op_decision(c->sb->id, op, ACTION_ALLOW);
	return c->d.action != ACTION_ALLOW;
}

/* judge_op is the whole body of hooks judged by one op rule. */
static __always_inline int judge_op(__u32 mech, __u32 op, __u32 kind, __u32 mode)
{
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb)
		return 0;
	struct decision d = op_decision(sb->id, op, ACTION_ALLOW);
	return judge_task(mech, op, kind, d, sb, root, NULL, mode, -1, false);
}

/* --- dangerous syscalls judged by what they ask the kernel ---------------- */

/* Entries of the one dangerous list (internal/dangerous) without a hook of
 * their own are judged where the kernel checks them before any effect,
 * while the task is in that syscall: the capability the syscall asks for
 * first (iopl, acct, reboot, delete_module, mount_setattr...), the key
 * permission every keyctl, add_key and request_key needs, or, for those
 * with no check at all, the entry of the syscall itself (fentry: killed
 * at entry, at no cost to other syscalls). The Go loader fills
 * lsm_syscall_checks from the list: {syscall, check} -> the op whose rule
 * decides. */
#define TS_COMPAT 0x0002              /* thread_info.status: an i386 syscall is running */
#define X32_SYSCALL_BIT 0x40000000
#define SYSCALL_COMPAT 0x10000        /* i386 numbers are keyed as SYSCALL_COMPAT + nr */
#define SYSCALL_NONE 0xffffffffu
#define SYSCALL_TAG 0x80000000u       /* task_event.mode of a syscall-scoped decision: tag | syscall */
#define CHECK_KEY 64                  /* check: the key_permission hook */
#define CHECK_ENTRY 65                /* check: the syscall's entry (fentry) */

struct syscall_check_key {
	__u32 nr;    /* x86_64 number, or SYSCALL_COMPAT + i386 number */
	__u32 check; /* capability number (< 64), CHECK_KEY or CHECK_ENTRY */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, struct syscall_check_key);
	__type(value, __u32); /* enum lsm_op */
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lsm_syscall_checks SEC(".maps");

const struct syscall_check_key *unused_syscall_check_key __attribute__((unused));

/* current_syscall returns the syscall the current task is in, from its
 * saved registers: orig_ax is what the entry code dispatched (after
 * ptrace or seccomp had their say), TS_COMPAT marks the i386 table (int
 * 0x80, sysenter), x32 calls carry X32_SYSCALL_BIT on x86_64 numbers.
 * io_uring workers have zeroed registers: never a listed syscall. */
static __always_inline __u32 current_syscall(void)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task);
	__u64 nr = BPF_CORE_READ(regs, orig_ax);
	if (nr > 0xffffffffULL)
		return SYSCALL_NONE;
	if (BPF_CORE_READ(task, thread_info.status) & TS_COMPAT)
		return SYSCALL_COMPAT + (__u32)nr;
	return (__u32)nr & ~X32_SYSCALL_BIT;
}

/* syscall_check returns the op deciding check in syscall nr, 0 for none. */
static __always_inline __u32 syscall_check(__u32 nr, __u32 check)
{
	if (nr == SYSCALL_NONE)
		return 0;
	struct syscall_check_key k = { .nr = nr, .check = check };
	__u32 *op = bpf_map_lookup_elem(&lsm_syscall_checks, &k);
	return op ? *op : 0;
}

/* --- ptrace, signals, capabilities, bpf ----------------------------------- */

/* --- own subtree: the target must be a task of the sandbox's subtree ----- */

/* in_subtree reports whether task's cgroup in the default hierarchy (the
 * one bpf_get_current_cgroup_id() and current_sandbox() read) is root, the
 * sandbox's root cgroup, or below it: the same test current_sandbox makes
 * of the current task, made of the target. cgroup.self is the first member
 * of struct cgroup, so a parent css is its cgroup. */
static __always_inline bool in_subtree(struct task_struct *task, __u64 root)
{
	struct cgroup *cg = BPF_CORE_READ(task, cgroups, dfl_cgrp);
	for (int i = 0; i < MAX_CGROUP_DEPTH && cg; i++) {
		if (BPF_CORE_READ(cg, kn, id) == root)
			return true;
		cg = (struct cgroup *)BPF_CORE_READ(cg, self.parent);
	}
	return false;
}

/* Sub-operations of LSM_OP_OTHER_TASK judged outside the signal and
 * ptrace hooks: task_event.mode is OTHER_* | a detail. */
#define OTHER_SETRLIMIT 0x01000000u  /* | resource */
#define OTHER_SETNICE 0x02000000u    /* | (nice & 0xff) */
#define OTHER_SCHED 0x03000000u      /* sched_setscheduler, setattr, setaffinity */
#define OTHER_IOPRIO 0x04000000u     /* | (ioprio & 0xffff) */
#define OTHER_MOVEMEM 0x05000000u    /* migrate_pages, move_pages */

/* judge_other_task judges an operation of the current task on target by
 * the other-processes rule when target is outside the caller's sandbox
 * subtree. */
static __always_inline int judge_other_task(__u32 mech, __u32 kind, struct task_struct *target, __u32 mode)
{
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb || !target || in_subtree(target, root))
		return 0;
	struct decision d = op_decision(sb->id, LSM_OP_OTHER_TASK, ACTION_ALLOW);
	return judge_task(mech, LSM_OP_OTHER_TASK, kind, d, sb, root, target, mode, -1, false);
}

/* judge_ptrace judges ptrace access to target by op's rule, or by the
 * agent's (blocked unless a rule says otherwise) when target is the agent.
 * A target outside the sandbox's subtree is judged by the other-processes
 * rule too (subtree: false for PTRACE_TRACEME, which offers the caller to
 * its parent), the stricter of the two deciding. */
static __always_inline int judge_ptrace(__u32 mech, __u32 op, struct task_struct *target, __u32 mode, bool quiet,
					bool subtree)
{
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb)
		return 0;
	struct decision d;
	if (is_agent(BPF_CORE_READ(target, tgid))) {
		op = LSM_OP_AGENT_PTRACE;
		d = op_decision(sb->id, op, ACTION_BLOCK);
	} else {
		d = op_decision(sb->id, op, ACTION_ALLOW);
		if (subtree && !in_subtree(target, root)) {
			struct decision o = op_decision(sb->id, LSM_OP_OTHER_TASK, ACTION_ALLOW);
			if (o.action > d.action) {
				op = LSM_OP_OTHER_TASK;
				d = o;
			}
		}
	}
	return judge_task(mech, op, EV_PTRACE, d, sb, root, target, mode, -1, quiet);
}

static __always_inline int decide_ptrace_access_check(__u32 mech, struct task_struct *child, unsigned int mode, int ret)
{
	if (ret)
		return ret;
	__u32 op = (mode & PTRACE_MODE_ATTACH) ? LSM_OP_PTRACE_ATTACH : LSM_OP_PTRACE_READ;
	return judge_ptrace(mech, op, child, mode, mode & PTRACE_MODE_NOAUDIT, true);
}
WATCHER_HOOK(ptrace_access_check, security_ptrace_access_check,
	     decide_ptrace_access_check(mech, child, mode, ret),
	     struct task_struct *child, unsigned int mode, int ret)

static __always_inline int decide_ptrace_traceme(__u32 mech, struct task_struct *parent, int ret)
{
	if (ret)
		return ret;
	return judge_ptrace(mech, LSM_OP_PTRACE_TRACEME, parent, 0, false, false);
}
WATCHER_HOOK(ptrace_traceme, security_ptrace_traceme, decide_ptrace_traceme(mech, parent, ret),
	     struct task_struct *parent, int ret)

/* task_kill is called once per target task, for kill, tgkill, tkill,
 * pidfd_send_signal, rt_sigqueueinfo, process groups and kill(-1) alike.
 * The agent is the first target outside the subtree, with its own rule;
 * every other target outside is judged by the other-processes rule. A
 * non-NULL cred is a USB async I/O completion signalling on behalf of the
 * file's opener, not the current task: not the sandbox's doing. */
static __always_inline int decide_task_kill(__u32 mech, struct task_struct *p, int sig, const struct cred *cred, int ret)
{
	if (ret)
		return ret;
	if (!is_agent(BPF_CORE_READ(p, tgid))) {
		if (cred)
			return 0;
		return judge_other_task(mech, EV_SIGNAL, p, (__u32)sig);
	}
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb)
		return 0;
	struct decision d = op_decision(sb->id, LSM_OP_AGENT_SIGNAL, ACTION_BLOCK);
	return judge_task(mech, LSM_OP_AGENT_SIGNAL, EV_SIGNAL, d, sb, root, p, (__u32)sig, -1, false);
}
WATCHER_HOOK(task_kill, security_task_kill, decide_task_kill(mech, p, sig, cred, ret),
	     struct task_struct *p, struct kernel_siginfo *info, int sig, const struct cred *cred, int ret)

/* Limits, priority, scheduling, I/O priority and page migration of another
 * process. setrlimit and prlimit(2) with new limits both pass
 * task_setrlimit with the target (task_prlimit has only credentials on
 * 6.1); a process's limits are readable in /proc/PID/limits anyway, so
 * reading them is not judged. setpriority(PRIO_PGRP, PRIO_USER) asks once
 * per task. sched_setaffinity and sched_setattr ask task_setscheduler. */
static __always_inline int decide_setrlimit(__u32 mech, struct task_struct *p, unsigned int resource, int ret)
{
	return ret ? ret : judge_other_task(mech, EV_OPERATION, p, OTHER_SETRLIMIT | (resource & 0xff));
}
WATCHER_HOOK(task_setrlimit, security_task_setrlimit, decide_setrlimit(mech, p, resource, ret),
	     struct task_struct *p, unsigned int resource, struct rlimit *new_rlim, int ret)

static __always_inline int decide_setnice(__u32 mech, struct task_struct *p, int nice, int ret)
{
	return ret ? ret : judge_other_task(mech, EV_OPERATION, p, OTHER_SETNICE | ((__u32)nice & 0xff));
}
WATCHER_HOOK(task_setnice, security_task_setnice, decide_setnice(mech, p, nice, ret),
	     struct task_struct *p, int nice, int ret)

static __always_inline int decide_setioprio(__u32 mech, struct task_struct *p, int ioprio, int ret)
{
	return ret ? ret : judge_other_task(mech, EV_OPERATION, p, OTHER_IOPRIO | ((__u32)ioprio & 0xffff));
}
WATCHER_HOOK(task_setioprio, security_task_setioprio, decide_setioprio(mech, p, ioprio, ret),
	     struct task_struct *p, int ioprio, int ret)

static __always_inline int decide_task_only(__u32 mech, struct task_struct *p, __u32 what, int ret)
{
	return ret ? ret : judge_other_task(mech, EV_OPERATION, p, what);
}
WATCHER_HOOK(task_setscheduler, security_task_setscheduler, decide_task_only(mech, p, OTHER_SCHED, ret),
	     struct task_struct *p, int ret)
WATCHER_HOOK(task_movememory, security_task_movememory, decide_task_only(mech, p, OTHER_MOVEMEM, ret),
	     struct task_struct *p, int ret)

/* Credentials the kernel substituted for the task's own (override_creds:
 * overlayfs acting as its mounter on the layers below a container root,
 * access(2) checking with the real ids) ask for the substitute's
 * capabilities, not the sandbox's: overlayfs checks the caller's own
 * credentials on the overlay inode before it switches. Judging them
 * refuses or records what the sandbox never asked for (every file of a
 * container root on overlayfs). The one substitution a sandboxed task can
 * choose, an io_uring personality, carries its own earlier credentials:
 * judged whenever the sandbox may use io_uring at all. */
static __always_inline bool substituted_cred(const struct cred *cred, __u32 sid)
{
	struct task_struct *cur = (struct task_struct *)bpf_get_current_task_btf();
	const struct cred *subjective = BPF_CORE_READ(cur, cred);
	if (cred != subjective || subjective == BPF_CORE_READ(cur, real_cred))
		return false;
	return op_decision(sid, LSM_OP_IO_URING, ACTION_ALLOW).action == ACTION_BLOCK;
}

/* cap_decision is the capability rule of cap (0..63) in sandbox sid, or of
 * the defaults (id 0) when the sandbox has no capability table. */
static __always_inline struct decision cap_decision(__u32 sid, int cap)
{
	struct decision d = { .action = ACTION_ALLOW };
	struct cap_rules *r = bpf_map_lookup_elem(&lsm_cap_rules, &sid);
	if (!r) {
		sid = 0;
		r = bpf_map_lookup_elem(&lsm_cap_rules, &sid);
		if (!r)
			return d;
	}
	__u64 bit = 1ULL << (cap & 63);
	if (r->block & bit)
		d.action = ACTION_BLOCK;
	else if (r->record & bit)
		d.action = ACTION_RECORD;
	else
		return d;
	d.rule_id = r->rule_id[cap & 63];
	return d;
}

static __always_inline int decide_capable(__u32 mech, const struct cred *cred, int cap, unsigned int opts, int ret)
{
	if (ret)
		return ret;
	if (cap < 0 || cap >= 64)
		return 0;
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb)
		return 0;
	if (substituted_cred(cred, sb->id))
		return 0;
	/* A dangerous syscall asking for the capability it checks before any
	 * effect (iopl, acct, reboot, swapon, delete_module, mount_setattr,
	 * open_by_handle_at): refused by the rule of its group. */
	__u32 nr = current_syscall();
	__u32 op = syscall_check(nr, (__u32)cap);
	if (op) {
		struct decision od = op_decision(sb->id, op, ACTION_ALLOW);
		int r = judge_task(mech, op, EV_OPERATION, od, sb, root, NULL, SYSCALL_TAG | nr, cap,
				   opts & CAP_OPT_NOAUDIT);
		if (r)
			return r;
	}
	struct decision d = cap_decision(sb->id, cap);
	if (d.action == ACTION_ALLOW)
		return 0;
	return judge_task(mech, 0, EV_CAPABILITY, d, sb, root, NULL, opts, cap, opts & CAP_OPT_NOAUDIT);
}
WATCHER_HOOK(capable, security_capable, decide_capable(mech, cred, cap, opts, ret),
	     const struct cred *cred, struct user_namespace *ns, int cap, unsigned int opts, int ret)

/* Mappings below vm.mmap_min_addr (page 0: the kernel NULL-dereference
 * exploit's landing pad) need CAP_SYS_RAWIO, but the kernel's
 * cap_mmap_addr asks cap_capable() directly, never security_capable(): the
 * capable hook above does not see it. security_mmap_addr is where mmap and
 * mmap2 with MAP_FIXED(_NOREPLACE), mremap(MREMAP_FIXED) and shmat at an
 * address, from either syscall table, arrive with the address the kernel
 * chose: judged here as a use of CAP_SYS_RAWIO by the capability rules.
 * The agent writes the sysctl's value into lsm_mmap_min_addr when it loads
 * and at every policy apply (0, or never written: nothing to judge, as the
 * kernel then checks nothing). Every mmap of every task on the host passes
 * here: an address at or above the minimum returns after one inlined
 * array lookup. */
#define CAP_SYS_RAWIO 17
#define MMAP_ADDR_MODE 0x40000000u /* task_event.mode of a capability event from mmap_addr: tag | page number */
#define MMAP_ADDR_PAGE_MAX 0x3fffffffu

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64); /* vm.mmap_min_addr (the kernel's dac_mmap_min_addr) */
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lsm_mmap_min_addr SEC(".maps");

static __always_inline int decide_mmap_addr(__u32 mech, unsigned long addr, int ret)
{
	if (ret)
		return ret;
	__u32 zero = 0;
	__u64 *min = bpf_map_lookup_elem(&lsm_mmap_min_addr, &zero);
	if (!min || addr >= *min)
		return 0;
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb)
		return 0;
	struct decision d = cap_decision(sb->id, CAP_SYS_RAWIO);
	if (d.action == ACTION_ALLOW)
		return 0;
	__u64 page = addr >> 12;
	if (page > MMAP_ADDR_PAGE_MAX)
		page = MMAP_ADDR_PAGE_MAX;
	return judge_task(mech, 0, EV_CAPABILITY, d, sb, root, NULL, MMAP_ADDR_MODE | (__u32)page, CAP_SYS_RAWIO, false);
}
WATCHER_HOOK(mmap_addr, security_mmap_addr, decide_mmap_addr(mech, addr, ret), unsigned long addr, int ret)

/* bpf(2): 6.1 passes (cmd, attr, size), 6.18 adds a `kernel` flag, so the
 * previous program's return value sits at another index: this hook does
 * not read it (watcher is the only BPF program judging bpf(2)). */
WATCHER_HOOK(bpf, security_bpf, judge_op(mech, LSM_OP_BPF, EV_BPF, (__u32)cmd), int cmd)

/* --- kernel code: modules, kexec, firmware -------------------------------- */

/* walk_path writes p's path relative to the current task's root into dst
 * (size bytes, NUL-terminated) using the per-CPU path walk. Works in every
 * hook, unlike bpf_d_path (see lsm_hook.h). */
static __always_inline void walk_path(struct path *p, char *dst, __u32 size)
{
	__u32 zero = 0;
	struct pathwalk *pw = bpf_map_lookup_elem(&lsm_pw_scratch, &zero);
	dst[0] = 0;
	if (!pw || !p)
		return;
	struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
	struct path root = BPF_CORE_READ(task, fs, root);
	pw_resolve(pw, p, &root);
	bpf_probe_read_kernel_str(dst, size, pw->buf);
}

/* judge_module reports a kernel-code load judged in c (file: what is
 * read, NULL for a buffer) and returns the hook's result. */
static __always_inline int judge_module(__u32 mech, __u32 op, struct op_ctx *c, struct file *file, __u32 id)
{
	__u32 verdict = effective_verdict(c->sb, c->d.action);
	struct module_event *e = reserve_event(sizeof(*e), true);
	if (e) {
		fill_hdr(&e->hdr, EV_MODULE + mech, verdict, c->d.rule_id, c->root, c->sb);
		e->op = op;
		e->id = id;
		e->path[0] = 0;
		if (file) {
			struct path fp = BPF_CORE_READ(file, f_path);
			walk_path(&fp, e->path, sizeof(e->path));
		}
		submit_event(e, true);
	}
	return conclude(verdict);
}

static __always_inline int decide_kernel_read_file(__u32 mech, struct file *file, enum kernel_read_file_id id, int ret)
{
	struct op_ctx c;
	if (ret || !op_begin(&c, LSM_OP_KERNEL_READ_FILE))
		return ret;
	return judge_module(mech, LSM_OP_KERNEL_READ_FILE, &c, file, (__u32)id);
}
WATCHER_HOOK(kernel_read_file, security_kernel_read_file, decide_kernel_read_file(mech, file, id, ret),
	     struct file *file, enum kernel_read_file_id id, bool contents, int ret)

static __always_inline int decide_kernel_load_data(__u32 mech, enum kernel_load_data_id id, int ret)
{
	struct op_ctx c;
	if (ret || !op_begin(&c, LSM_OP_KERNEL_LOAD_DATA))
		return ret;
	return judge_module(mech, LSM_OP_KERNEL_LOAD_DATA, &c, NULL, (__u32)id);
}
WATCHER_HOOK(kernel_load_data, security_kernel_load_data, decide_kernel_load_data(mech, id, ret),
	     enum kernel_load_data_id id, bool contents, int ret)

/* --- mount family ---------------------------------------------------------- */

/* mount_begin reserves the event of a mount operation judged in c. */
static __always_inline struct mount_event *mount_begin(__u32 mech, __u32 op, struct op_ctx *c, __u32 *verdict)
{
	*verdict = effective_verdict(c->sb, c->d.action);
	struct mount_event *e = reserve_event(sizeof(*e), true);
	if (!e)
		return NULL;
	fill_hdr(&e->hdr, EV_MOUNT + mech, *verdict, c->d.rule_id, c->root, c->sb);
	e->op = op;
	e->flags = 0;
	e->source[0] = 0;
	e->fstype[0] = 0;
	e->target[0] = 0;
	return e;
}

/* mount_end submits e (when reserved) and returns the hook's result. */
static __always_inline int mount_end(struct mount_event *e, __u32 verdict)
{
	if (e)
		submit_event(e, true);
	return conclude(verdict);
}

static __always_inline int decide_sb_mount(__u32 mech, const char *dev_name, const struct path *path,
					   const char *type, unsigned long flags, int ret)
{
	struct op_ctx c;
	if (ret || !op_begin(&c, LSM_OP_MOUNT))
		return ret;
	__u32 verdict;
	struct mount_event *e = mount_begin(mech, LSM_OP_MOUNT, &c, &verdict);
	if (e) {
		e->flags = flags;
		if (dev_name)
			bpf_probe_read_kernel_str(e->source, sizeof(e->source), dev_name);
		if (type)
			bpf_probe_read_kernel_str(e->fstype, sizeof(e->fstype), type);
		struct path p = { .mnt = BPF_CORE_READ(path, mnt), .dentry = BPF_CORE_READ(path, dentry) };
		walk_path(&p, e->target, sizeof(e->target));
	}
	return mount_end(e, verdict);
}
WATCHER_HOOK(sb_mount, security_sb_mount, decide_sb_mount(mech, dev_name, path, type, flags, ret),
	     const char *dev_name, const struct path *path, const char *type, unsigned long flags, void *data, int ret)

static __always_inline int decide_sb_umount(__u32 mech, struct vfsmount *mnt, int flags, int ret)
{
	struct op_ctx c;
	if (ret || !op_begin(&c, LSM_OP_UMOUNT))
		return ret;
	__u32 verdict;
	struct mount_event *e = mount_begin(mech, LSM_OP_UMOUNT, &c, &verdict);
	if (e) {
		struct path p = { .mnt = mnt, .dentry = BPF_CORE_READ(mnt, mnt_root) };
		e->flags = (__u32)flags;
		walk_path(&p, e->target, sizeof(e->target));
		bpf_probe_read_kernel_str(e->fstype, sizeof(e->fstype),
					  BPF_CORE_READ(mnt, mnt_sb, s_type, name));
	}
	return mount_end(e, verdict);
}
WATCHER_HOOK(sb_umount, security_sb_umount, decide_sb_umount(mech, mnt, flags, ret),
	     struct vfsmount *mnt, int flags, int ret)

/* two_path_mount judges the mount operations that name a source and a
 * target path (move_mount, pivot_root); chroot names only a target. */
static __always_inline int two_path_mount(__u32 mech, __u32 op, const struct path *src_path,
					  const struct path *dst_path, int ret)
{
	struct op_ctx c;
	if (ret || !op_begin(&c, op))
		return ret;
	__u32 verdict;
	struct mount_event *e = mount_begin(mech, op, &c, &verdict);
	if (e) {
		if (src_path) {
			struct path src = { .mnt = BPF_CORE_READ(src_path, mnt), .dentry = BPF_CORE_READ(src_path, dentry) };
			walk_path(&src, e->source, sizeof(e->source));
		}
		struct path dst = { .mnt = BPF_CORE_READ(dst_path, mnt), .dentry = BPF_CORE_READ(dst_path, dentry) };
		walk_path(&dst, e->target, sizeof(e->target));
	}
	return mount_end(e, verdict);
}
WATCHER_HOOK(move_mount, security_move_mount, two_path_mount(mech, LSM_OP_MOVE_MOUNT, from_path, to_path, ret),
	     const struct path *from_path, const struct path *to_path, int ret)
WATCHER_HOOK(sb_pivotroot, security_sb_pivotroot, two_path_mount(mech, LSM_OP_PIVOT_ROOT, old_path, new_path, ret),
	     const struct path *old_path, const struct path *new_path, int ret)
WATCHER_HOOK(path_chroot, security_path_chroot, two_path_mount(mech, LSM_OP_CHROOT, NULL, path, ret),
	     const struct path *path, int ret)

/* The new mount API: fsopen(2) has no hook, but every fsconfig(2)
 * parameter passes here, and move_mount(2) (above) is the only way to
 * attach what fsmount(2) returns. */
static __always_inline int decide_fs_context_parse_param(__u32 mech, struct fs_context *fc,
							 struct fs_parameter *param, int ret)
{
	/* -ENOPARAM from an earlier LSM means "not mine": keep judging. */
	struct op_ctx c;
	if ((ret && ret != -519) || !op_begin(&c, LSM_OP_FSCONFIG))
		return ret;
	__u32 verdict;
	struct mount_event *e = mount_begin(mech, LSM_OP_FSCONFIG, &c, &verdict);
	if (e) {
		bpf_probe_read_kernel_str(e->fstype, sizeof(e->fstype), BPF_CORE_READ(fc, fs_type, name));
		bpf_probe_read_kernel_str(e->source, sizeof(e->source), BPF_CORE_READ(param, key));
		if (BPF_CORE_READ_BITFIELD_PROBED(param, type) == fs_value_is_string)
			bpf_probe_read_kernel_str(e->target, sizeof(e->target), BPF_CORE_READ(param, string));
	}
	int r = mount_end(e, verdict);
	return r ? r : ret;
}
WATCHER_HOOK(fs_context_parse_param, security_fs_context_parse_param,
	     decide_fs_context_parse_param(mech, fc, param, ret),
	     struct fs_context *fc, struct fs_parameter *param, int ret)

/* --- own subtree: System V IPC objects and POSIX message queues ---------- */

/* Objects a sandbox created, so only its own subtree reaches them. System V
 * objects are keyed by their kern_ipc_perm: the alloc hooks run in the
 * creating task (shmget, semget, msgget with IPC_CREAT making a new one)
 * and the free hooks (fentry on security_*_free: the LSM's free hooks are
 * void, no fmod_ret) drop the entry, so a freed object's address handed
 * to a host object later is no match. ipc_permission (every ipcperms:
 * shmat, shmget of an existing key, semop, semctl, msgsnd, msgrcv, the
 * *_STAT commands) and the *ctl hooks (IPC_RMID, IPC_SET, SHM_LOCK, which
 * ask ownership or CAP_SYS_ADMIN instead) judge the rest. */
struct ipc_owner {
	__u64 sandbox_cg; /* root cgroup of the sandbox that created it */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 32768);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u64); /* struct kern_ipc_perm * */
	__type(value, struct ipc_owner);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lsm_ipc_owner SEC(".maps");

/* POSIX message queues a sandbox created, by {mqueue superblock dev_t,
 * inode number} (mqueue inode numbers come from get_next_ino(): not handed
 * out again until it wraps). mq_open(O_CREAT) creates through vfs_mkobj
 * (inode_create, on the negative dentry) and opens with dentry_open
 * (file_open, no FMODE_CREATED): the pending map carries the dentry from
 * the one hook to the other within the call. open(O_CREAT) on a mounted
 * mqueue filesystem sets FMODE_CREATED. */
struct mq_key {
	__u32 dev;
	__u32 pad;
	__u64 ino;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct mq_key);
	__type(value, struct ipc_owner);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lsm_mq_owner SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);   /* pid_tgid of the creating thread */
	__type(value, __u64); /* the dentry being created */
} lsm_mq_pending SEC(".maps");

const struct ipc_owner *unused_ipc_owner __attribute__((unused));
const struct mq_key *unused_mq_key __attribute__((unused));

#define MQUEUE_MAGIC 0x19800202
#define FMODE_CREATED (1U << 20)
#define IPC_TAG 0x20000000u /* task_event.mode of an other-ipc event: tag | what (IPC_WHAT_*) << 16 | detail */
#define IPC_WHAT_PERM 1     /* ipc_permission: detail is the access flag (S_IRUGO, S_IWUGO bits) */
#define IPC_WHAT_CTL 2      /* shmctl, semctl, msgctl: detail is the command */

static __always_inline int record_ipc_owner(__u32 mech, struct kern_ipc_perm *perm, int ret)
{
	(void)mech; /* nothing to report: creation is never refused here */
	if (ret)
		return ret;
	__u64 root = 0;
	if (!current_sandbox(&root))
		return 0;
	__u64 k = (__u64)perm;
	struct ipc_owner o = { .sandbox_cg = root };
	bpf_map_update_elem(&lsm_ipc_owner, &k, &o, BPF_ANY);
	return 0;
}
WATCHER_HOOK(shm_alloc_security, security_shm_alloc, record_ipc_owner(mech, perm, ret), struct kern_ipc_perm *perm, int ret)
WATCHER_HOOK(sem_alloc_security, security_sem_alloc, record_ipc_owner(mech, perm, ret), struct kern_ipc_perm *perm, int ret)
WATCHER_HOOK(msg_queue_alloc_security, security_msg_queue_alloc, record_ipc_owner(mech, perm, ret),
	     struct kern_ipc_perm *perm, int ret)

#define WATCHER_IPC_FREE(fn)                                     \
	SEC("fentry/" #fn)                                       \
	int BPF_PROG(entry_##fn, struct kern_ipc_perm *perm)     \
	{                                                        \
		__u64 k = (__u64)perm;                           \
		bpf_map_delete_elem(&lsm_ipc_owner, &k);         \
		return 0;                                        \
	}
WATCHER_IPC_FREE(security_shm_free)
WATCHER_IPC_FREE(security_sem_free)
WATCHER_IPC_FREE(security_msg_queue_free)

/* judge_ipc judges access to a System V object by the other-IPC rule
 * unless the caller's sandbox created it. The event's target_pid is the
 * object's id. */
static __always_inline int judge_ipc(__u32 mech, struct kern_ipc_perm *perm, __u32 what, __u32 detail)
{
	if (!perm)
		return 0;
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb)
		return 0;
	struct decision d = op_decision(sb->id, LSM_OP_OTHER_IPC, ACTION_ALLOW);
	if (d.action == ACTION_ALLOW)
		return 0;
	__u64 k = (__u64)perm;
	struct ipc_owner *o = bpf_map_lookup_elem(&lsm_ipc_owner, &k);
	if (o && o->sandbox_cg == root)
		return 0;
	__u32 verdict = effective_verdict(sb, d.action);
	struct task_event *e = reserve_event(sizeof(*e), true);
	if (e) {
		fill_hdr(&e->hdr, EV_OPERATION + mech, verdict, d.rule_id, root, sb);
		e->op = LSM_OP_OTHER_IPC;
		e->target_pid = (__u32)BPF_CORE_READ(perm, id);
		e->mode = IPC_TAG | (what << 16) | (detail & 0xffff);
		e->cap = BPF_CORE_READ(perm, key); /* the object's key */
		e->target_comm[0] = 0;
		submit_event(e, true);
	}
	return conclude(verdict);
}

static __always_inline int decide_ipc_permission(__u32 mech, struct kern_ipc_perm *ipcp, short flag, int ret)
{
	return ret ? ret : judge_ipc(mech, ipcp, IPC_WHAT_PERM, (__u32)(unsigned short)flag);
}
WATCHER_HOOK(ipc_permission, security_ipc_permission, decide_ipc_permission(mech, ipcp, flag, ret),
	     struct kern_ipc_perm *ipcp, short flag, int ret)

static __always_inline int decide_ipc_ctl(__u32 mech, struct kern_ipc_perm *perm, int cmd, int ret)
{
	return ret ? ret : judge_ipc(mech, perm, IPC_WHAT_CTL, (__u32)cmd);
}
WATCHER_HOOK(shm_shmctl, security_shm_shmctl, decide_ipc_ctl(mech, perm, cmd, ret),
	     struct kern_ipc_perm *perm, int cmd, int ret)
WATCHER_HOOK(sem_semctl, security_sem_semctl, decide_ipc_ctl(mech, perm, cmd, ret),
	     struct kern_ipc_perm *perm, int cmd, int ret)
WATCHER_HOOK(msg_queue_msgctl, security_msg_queue_msgctl, decide_ipc_ctl(mech, perm, cmd, ret),
	     struct kern_ipc_perm *perm, int cmd, int ret)

/* mq_open(O_CREAT) of a new queue: note the dentry for file_open. */
static __always_inline int decide_inode_create(__u32 mech, struct inode *dir, struct dentry *dentry, int ret)
{
	(void)mech;
	if (ret || BPF_CORE_READ(dir, i_sb, s_magic) != MQUEUE_MAGIC)
		return ret;
	__u64 root = 0;
	if (!current_sandbox(&root))
		return 0;
	__u64 id = bpf_get_current_pid_tgid();
	__u64 d = (__u64)dentry;
	bpf_map_update_elem(&lsm_mq_pending, &id, &d, BPF_ANY);
	return 0;
}
WATCHER_HOOK(inode_create, security_inode_create, decide_inode_create(mech, dir, dentry, ret),
	     struct inode *dir, struct dentry *dentry, umode_t mode, int ret)

/* mq_decision is the file_open decision on a message queue: allowed when
 * the caller's sandbox created it (now or before), else the other-IPC
 * rule. */
static __always_inline struct decision mq_decision(struct file *file, __u32 sid, __u64 root, __u32 dev, __u64 ino)
{
	struct decision allow = { .action = ACTION_ALLOW };
	struct mq_key k = { .dev = dev, .ino = ino };
	struct ipc_owner o = { .sandbox_cg = root };
	__u64 id = bpf_get_current_pid_tgid();
	__u64 *pending = bpf_map_lookup_elem(&lsm_mq_pending, &id);
	bool created = BPF_CORE_READ(file, f_mode) & FMODE_CREATED;
	if (pending && *pending == (__u64)BPF_CORE_READ(file, f_path.dentry))
		created = true;
	if (pending)
		bpf_map_delete_elem(&lsm_mq_pending, &id);
	if (created) {
		bpf_map_update_elem(&lsm_mq_owner, &k, &o, BPF_ANY);
		return allow;
	}
	struct ipc_owner *own = bpf_map_lookup_elem(&lsm_mq_owner, &k);
	if (own && own->sandbox_cg == root)
		return allow;
	return op_decision(sid, LSM_OP_OTHER_IPC, ACTION_ALLOW);
}

/* --- file_open --------------------------------------------------------------- */

struct file_verdict {
	__u32 action;
	__u32 rule_id;
	__u32 match;
};

static __always_inline void consider(struct file_verdict *v, struct access_rule *r, bool write, __u32 match)
{
	if (!r)
		return;
	__u32 action = write ? r->write_action : r->read_action;
	__u32 rule = write ? r->write_rule : r->read_rule;
	/* Strictest wins; a match that allows still counts as a match so the
	 * defaults of sandbox 0 are not consulted. */
	if (v->match == MATCH_NONE || action > v->action) {
		v->action = action;
		v->rule_id = rule;
		v->match = match;
	}
}

/* What a file decision is about: the inode (absent for a name about to be
 * created) and its filesystem. */
struct file_facts {
	__u64 ino;
	__u64 magic; /* super_block.s_magic */
	__u32 dev;   /* kernel dev_t of the filesystem */
	__u32 rdev;  /* device nodes: the device's dev_t */
	__u32 mode;  /* i_mode: type and permission bits */
	__u32 generation; /* i_generation */
};

static __always_inline void facts_of(struct file_facts *f, struct inode *inode, struct super_block *s)
{
	f->ino = 0;
	f->mode = 0;
	f->rdev = 0;
	f->generation = 0;
	if (inode) {
		f->ino = BPF_CORE_READ(inode, i_ino);
		f->mode = BPF_CORE_READ(inode, i_mode);
		f->rdev = BPF_CORE_READ(inode, i_rdev);
		f->generation = BPF_CORE_READ(inode, i_generation);
	}
	f->dev = BPF_CORE_READ(s, s_dev);
	f->magic = BPF_CORE_READ(s, s_magic);
}

/* judge_file_tables checks every file table of one sandbox id. */
static __always_inline void judge_file_tables(struct file_verdict *v, __u32 sid, struct path_key *key,
					      const struct file_facts *f, bool write)
{
	struct ino_key ik = { .sandbox_id = sid, .dev = f->dev, .ino = f->ino };
	struct ino_rule *ir = bpf_map_lookup_elem(&lsm_inode_rules, &ik);
	/* An entry of another file with this number is no match. */
	if (ir && (ir->generation == GEN_ANY || ir->generation == f->generation))
		consider(v, &ir->rule, write, MATCH_INODE);

	struct fs_key fk = { .sandbox_id = sid, .magic = f->magic };
	consider(v, bpf_map_lookup_elem(&lsm_fs_rules, &fk), write, MATCH_FS);

	__u32 ftype = f->mode & S_IFMT;
	if (ftype == S_IFBLK || ftype == S_IFCHR) {
		struct dev_key dk = {
			.sandbox_id = sid,
			.type = ftype == S_IFBLK ? DEV_BLOCK : DEV_CHAR,
			.major = f->rdev >> MINORBITS,
			.minor = f->rdev & MINORMASK,
		};
		struct access_rule *r = bpf_map_lookup_elem(&lsm_dev_rules, &dk);
		if (!r) {
			dk.minor = ANY;
			r = bpf_map_lookup_elem(&lsm_dev_rules, &dk);
		}
		if (!r) {
			dk.major = ANY;
			r = bpf_map_lookup_elem(&lsm_dev_rules, &dk);
		}
		consider(v, r, write, MATCH_DEVICE);
	}

	key->sandbox_id = sid;
	consider(v, bpf_map_lookup_elem(&lsm_path_rules, key), write, MATCH_PATH);
}

/* judge_file_rules judges by the sandbox's file tables, else by the
 * defaults (sandbox 0): the write or read rules, or with read_too both
 * (strictest wins). */
static __always_inline void judge_file_rules(struct file_verdict *v, __u32 sid, struct path_key *key,
					     const struct file_facts *f, bool write, bool read_too)
{
	judge_file_tables(v, sid, key, f, write);
	if (read_too)
		judge_file_tables(v, sid, key, f, false);
	if (v->match != MATCH_NONE)
		return;
	judge_file_tables(v, 0, key, f, write);
	if (read_too)
		judge_file_tables(v, 0, key, f, false);
}

/* set_key_len sets key's prefix length from n, the bytes copied with their
 * NUL: the NUL counts (exact rules match) unless the path was cut, when
 * only prefix rules may match. */
static __always_inline void set_key_len(struct path_key *key, long n, bool truncated)
{
	if (n <= 0) {
		key->path[0] = 0;
		n = 1;
	}
	if (n > LSM_PATH_LEN)
		n = LSM_PATH_LEN;
	if (truncated)
		n--;
	key->prefixlen = 32 + 8 * (__u32)n;
}

/* key_from_walk resolves p (relative to the task's root) with the path
 * walk into pw and key; it returns whether the path was cut. */
static __always_inline bool key_from_walk(struct path_key *key, struct pathwalk *pw, struct path *p)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
	struct path rootp = BPF_CORE_READ(task, fs, root);
	pw_resolve(pw, p, &rootp);
	long n = bpf_probe_read_kernel_str(key->path, sizeof(key->path), pw->buf);
	bool truncated = n <= 0 || (pw->flags & PW_F_TRUNCATED) || pw->len + 1 > LSM_PATH_LEN;
	set_key_len(key, n, truncated);
	return truncated;
}

/* A file decision in progress: the caller's sandbox and the per-CPU
 * scratch for its path. */
struct file_ctx {
	__u64 root;
	struct sandbox *sb;
	struct path_key *key;
	struct pathwalk *pw;
};

/* file_begin fills c; false when the task is in no sandbox (allowed). */
static __always_inline bool file_begin(struct file_ctx *c)
{
	__u32 zero = 0;
	c->root = 0;
	c->sb = current_sandbox(&c->root);
	c->key = bpf_map_lookup_elem(&lsm_key_scratch, &zero);
	c->pw = bpf_map_lookup_elem(&lsm_pw_scratch, &zero);
	return c->sb && c->key && c->pw;
}

/* emit_file reports a file decision on the path in c->key and returns the
 * hook's result. */
static __always_inline int emit_file(__u32 kind, struct file_ctx *c, __u32 action, __u32 rule_id,
				     const struct file_facts *f, __u32 flags, __u32 fmode, __u32 match, __u32 fflags,
				     __u32 op)
{
	__u32 verdict = effective_verdict(c->sb, action);
	struct file_event *e = reserve_event(sizeof(*e), true);
	if (e) {
		fill_hdr(&e->hdr, kind, verdict, rule_id, c->root, c->sb);
		e->ino = f->ino;
		e->flags = flags;
		e->fmode = fmode;
		e->i_mode = f->mode;
		e->dev = f->dev;
		e->rdev = f->rdev;
		e->match = match;
		e->fflags = fflags;
		e->op = op;
		e->magic = f->magic;
		bpf_probe_read_kernel_str(e->path, sizeof(e->path), c->key->path);
		submit_event(e, true);
	}
	return conclude(verdict);
}

static __always_inline int decide_file_open(__u32 mech, struct file *file, int ret)
{
	if (ret)
		return ret;
	struct file_ctx c;
	if (!file_begin(&c))
		return 0;

	__u32 fmode = BPF_CORE_READ(file, f_mode);
	__u32 fflags = BPF_CORE_READ(file, f_flags);
	bool write = (fmode & FMODE_WRITE) || (fflags & (O_TRUNC | O_APPEND));
	struct inode *inode = BPF_CORE_READ(file, f_inode);
	struct file_facts f;
	facts_of(&f, inode, BPF_CORE_READ(inode, i_sb));

	/* The path as the kernel opened it, relative to the task's root. */
	bool truncated = false;
	long n = bpf_d_path((struct path *)&file->f_path, c.key->path, sizeof(c.key->path));
	if (n <= 0) {
		/* Longer than the key: the walk keeps the first bytes, which
		 * is all a prefix rule needs. */
		pw_resolve_file(c.pw, file);
		n = bpf_probe_read_kernel_str(c.key->path, sizeof(c.key->path), c.pw->buf);
		truncated = true;
	}
	set_key_len(c.key, n, truncated);

	struct file_verdict v = {};
	/* A message queue's "path" is its name in the mqueue filesystem
	 * (mq_open), not a file the file rules could mean: it is judged by
	 * its creator below. */
	if (f.magic != MQUEUE_MAGIC)
		judge_file_rules(&v, c.sb->id, c.key, &f, write, false);

	/* /proc/PID/mem (and /proc/PID/task/TID/mem), any PID. */
	if (f.magic == PROC_SUPER_MAGIC) {
		char name[4] = {};
		bpf_probe_read_kernel(name, sizeof(name), BPF_CORE_READ(file, f_path.dentry, d_name.name));
		if (name[0] == 'm' && name[1] == 'e' && name[2] == 'm' && name[3] == 0) {
			struct decision d = op_decision(c.sb->id, LSM_OP_PROC_MEM, ACTION_ALLOW);
			if (d.action > v.action) {
				v.action = d.action;
				v.rule_id = d.rule_id;
				v.match = MATCH_PROC_MEM;
			}
		}
	}

	/* The fd and fdinfo listings of a process outside the subtree: the
	 * kernel asks no ptrace check for them (procfs.h). */
	if (f.magic == PROC_SUPER_MAGIC && proc_judged_name(BPF_CORE_READ(file, f_path.dentry)) == PROC_UNCHECKED) {
		struct task_struct *t = pid_leader_task(proc_inode_pid(inode));
		if (t && !in_subtree(t, c.root)) {
			struct decision d = op_decision(c.sb->id, LSM_OP_OTHER_TASK, ACTION_ALLOW);
			if (d.action > v.action) {
				v.action = d.action;
				v.rule_id = d.rule_id;
				v.match = MATCH_OTHER_TASK;
			}
		}
	}

	/* A POSIX message queue another sandbox or the host created. */
	if (f.magic == MQUEUE_MAGIC) {
		struct decision d = mq_decision(file, c.sb->id, c.root, f.dev, f.ino);
		if (d.action > v.action) {
			v.action = d.action;
			v.rule_id = d.rule_id;
			v.match = MATCH_OTHER_IPC;
		}
	}

	/* A terminal controlled from outside the sandbox: /dev/pts/N on
	 * devpts, whose dentry holds the slave tty (the kernel opens a pty
	 * slave only through its devpts dentry). */
	if (f.magic == DEVPTS_SUPER_MAGIC_ && tty_pts_slave(f.mode, f.rdev)) {
		struct task_struct *leader = tty_foreign_leader(BPF_CORE_READ(file, f_path.dentry, d_fsdata));
		if (leader && !in_subtree(leader, c.root)) {
			struct decision d = op_decision(c.sb->id, LSM_OP_TTY_INJECT, ACTION_ALLOW);
			if (d.action > v.action) {
				v.action = d.action;
				v.rule_id = d.rule_id;
				v.match = MATCH_OTHER_TTY;
			}
		}
	}

	if (v.action == ACTION_ALLOW)
		return 0;
	return emit_file(EV_FILE_OPEN + mech, &c, v.action, v.rule_id, &f, fflags, fmode, v.match,
			 (write ? FILE_F_WRITE : 0) | (truncated ? FILE_F_TRUNCATED : 0), 0);
}
/* bpf_d_path is allowed on security_file_open for fmod_ret too. */
WATCHER_HOOK(file_open, security_file_open, decide_file_open(mech, file, ret), struct file *file, int ret)

/* --- path operations: changing data without opening for write ------------ */

/* Each is judged by the file write rules, the tables file_open uses, on
 * the path the operation changes (a new name's path is its parent's plus
 * the name: the negative dentry already hangs below the parent). The path
 * walk of pathwalk.h works under both mechanisms. */
enum path_op {
	PATH_OP_TRUNCATE = 1,    /* truncate, ftruncate, open(O_TRUNC) with any access mode */
	PATH_OP_CREATE = 2,      /* mknod(2), and open(O_CREAT) creating a file */
	PATH_OP_MKDIR = 3,
	PATH_OP_UNLINK = 4,
	PATH_OP_RMDIR = 5,
	PATH_OP_SYMLINK = 6,     /* the new symlink's name */
	PATH_OP_LINK_SOURCE = 7, /* the file a hard link would give another name: read and write rules */
	PATH_OP_LINK = 8,        /* the new name */
	PATH_OP_RENAME_FROM = 9,
	PATH_OP_RENAME_TO = 10,
	PATH_OP_CHMOD = 11,
	PATH_OP_CHOWN = 12,
	PATH_OP_SETXATTR = 13,
	PATH_OP_REMOVEXATTR = 14,
	PATH_OP_EXEC = 15,       /* a file execve runs: the binary, then a script's interpreter */
	PATH_OP_MMAP_EXEC = 16,  /* a file mapped executable (ld.so /tmp/x, a preloaded library) */
	PATH_OP_UTIMES = 17,     /* utimensat, utimes, futimesat: the times alone */
	PATH_OP_NOTIFY = 18,     /* an inotify or fanotify mark (path_notify) */
};

/* judge_path judges op on the file at {mnt, dentry} (dentry may be
 * negative: a name about to be created). read_too adds the read rules
 * (strictest wins): a new name for a file is a way to read it too. */
static __always_inline int judge_path(__u32 mech, __u32 op, struct vfsmount *mnt, struct dentry *dentry, bool read_too)
{
	struct file_ctx c;
	if (!file_begin(&c))
		return 0;
	struct path p = { .mnt = mnt, .dentry = dentry };
	bool truncated = key_from_walk(c.key, c.pw, &p);
	struct file_facts f;
	facts_of(&f, BPF_CORE_READ(dentry, d_inode), BPF_CORE_READ(dentry, d_sb));

	struct file_verdict v = {};
	judge_file_rules(&v, c.sb->id, c.key, &f, true, read_too);
	if (v.action == ACTION_ALLOW)
		return 0;
	return emit_file(EV_FILE_OP + mech, &c, v.action, v.rule_id, &f, 0, 0, v.match,
			 FILE_F_WRITE | (truncated ? FILE_F_TRUNCATED : 0), op);
}

static __always_inline int judge_path_at(__u32 mech, __u32 op, const struct path *path, int ret)
{
	if (ret)
		return ret;
	return judge_path(mech, op, BPF_CORE_READ(path, mnt), BPF_CORE_READ(path, dentry), false);
}

/* judge_entry judges a name in dir (existing or about to be created). */
static __always_inline int judge_entry(__u32 mech, __u32 op, const struct path *dir, struct dentry *dentry, int ret)
{
	if (ret)
		return ret;
	return judge_path(mech, op, BPF_CORE_READ(dir, mnt), dentry, false);
}

/* 6.1 truncates through path_truncate for truncate(2), ftruncate(2) and
 * open(O_TRUNC); from 6.2 the last two go through file_truncate. */
WATCHER_HOOK(path_truncate, security_path_truncate, judge_path_at(mech, PATH_OP_TRUNCATE, path, ret),
	     const struct path *path, int ret)

static __always_inline int decide_file_truncate(__u32 mech, struct file *file, int ret)
{
	if (ret)
		return ret;
	return judge_path(mech, PATH_OP_TRUNCATE, BPF_CORE_READ(file, f_path.mnt), BPF_CORE_READ(file, f_path.dentry), false);
}
WATCHER_HOOK(file_truncate, security_file_truncate, decide_file_truncate(mech, file, ret), struct file *file, int ret)

/* open(O_CREAT) of a name that does not exist calls path_mknod too
 * (may_o_create), whatever the access mode. */
WATCHER_HOOK(path_mknod, security_path_mknod, judge_entry(mech, PATH_OP_CREATE, dir, dentry, ret),
	     const struct path *dir, struct dentry *dentry, umode_t mode, unsigned int dev, int ret)
WATCHER_HOOK(path_mkdir, security_path_mkdir, judge_entry(mech, PATH_OP_MKDIR, dir, dentry, ret),
	     const struct path *dir, struct dentry *dentry, umode_t mode, int ret)
WATCHER_HOOK(path_unlink, security_path_unlink, judge_entry(mech, PATH_OP_UNLINK, dir, dentry, ret),
	     const struct path *dir, struct dentry *dentry, int ret)
WATCHER_HOOK(path_rmdir, security_path_rmdir, judge_entry(mech, PATH_OP_RMDIR, dir, dentry, ret),
	     const struct path *dir, struct dentry *dentry, int ret)
WATCHER_HOOK(path_symlink, security_path_symlink, judge_entry(mech, PATH_OP_SYMLINK, dir, dentry, ret),
	     const struct path *dir, struct dentry *dentry, const char *old_name, int ret)

/* A hard link stays on one mount (EXDEV otherwise): the source's mount is
 * the new directory's. */
static __always_inline int decide_path_link(__u32 mech, struct dentry *old_dentry, const struct path *new_dir,
					    struct dentry *new_dentry, int ret)
{
	if (ret)
		return ret;
	struct vfsmount *mnt = BPF_CORE_READ(new_dir, mnt);
	int r = judge_path(mech, PATH_OP_LINK_SOURCE, mnt, old_dentry, true);
	if (r)
		return r;
	return judge_path(mech, PATH_OP_LINK, mnt, new_dentry, false);
}
WATCHER_HOOK(path_link, security_path_link, decide_path_link(mech, old_dentry, new_dir, new_dentry, ret),
	     struct dentry *old_dentry, const struct path *new_dir, struct dentry *new_dentry, int ret)

/* Both names are judged: moving a protected file away, and replacing one
 * (RENAME_EXCHANGE swaps both). */
static __always_inline int decide_path_rename(__u32 mech, const struct path *old_dir, struct dentry *old_dentry,
					      const struct path *new_dir, struct dentry *new_dentry, int ret)
{
	if (ret)
		return ret;
	int r = judge_path(mech, PATH_OP_RENAME_FROM, BPF_CORE_READ(old_dir, mnt), old_dentry, false);
	if (r)
		return r;
	return judge_path(mech, PATH_OP_RENAME_TO, BPF_CORE_READ(new_dir, mnt), new_dentry, false);
}
WATCHER_HOOK(path_rename, security_path_rename, decide_path_rename(mech, old_dir, old_dentry, new_dir, new_dentry, ret),
	     const struct path *old_dir, struct dentry *old_dentry, const struct path *new_dir,
	     struct dentry *new_dentry, unsigned int flags, int ret)

WATCHER_HOOK(path_chmod, security_path_chmod, judge_path_at(mech, PATH_OP_CHMOD, path, ret),
	     const struct path *path, umode_t mode, int ret)
WATCHER_HOOK(path_chown, security_path_chown, judge_path_at(mech, PATH_OP_CHOWN, path, ret),
	     const struct path *path, unsigned int uid, unsigned int gid, int ret)

/* The xattr hooks get a dentry without its mount: walk from the
 * superblock's first mount, which names the file where it was first
 * mounted (a bind mount elsewhere reports the original path, which is
 * what the rules name). */
struct super_block___list {
	struct list_head s_mounts;
} __attribute__((preserve_access_index));

struct mount___list {
	struct list_head mnt_instance;
} __attribute__((preserve_access_index));

static __always_inline int judge_dentry(__u32 mech, __u32 op, struct dentry *dentry, int ret)
{
	if (ret)
		return ret;
	struct super_block *s = BPF_CORE_READ(dentry, d_sb);
	void *m;
	if (bpf_core_field_exists(struct mount, mnt_next_for_sb)) {
		/* 6.13+: s_mounts points at the first mount. */
		m = BPF_CORE_READ(s, s_mounts);
	} else {
		/* Before: a list of struct mount through mnt_instance. */
		struct super_block___list *sl = (void *)s;
		void *first = BPF_CORE_READ(sl, s_mounts.next);
		m = first - bpf_core_field_offset(struct mount___list, mnt_instance);
	}
	if (!m)
		return 0;
	struct vfsmount *mnt = (struct vfsmount *)(m + bpf_core_field_offset(struct mount, mnt));
	return judge_path(mech, op, mnt, dentry, false);
}
/* The first argument is a user namespace on 6.1, an idmap from 6.3: unused. */
WATCHER_HOOK(inode_setxattr, security_inode_setxattr, judge_dentry(mech, PATH_OP_SETXATTR, dentry, ret),
	     void *idmap, struct dentry *dentry, const char *name, const void *value, size_t size, int flags, int ret)
WATCHER_HOOK(inode_removexattr, security_inode_removexattr, judge_dentry(mech, PATH_OP_REMOVEXATTR, dentry, ret),
	     void *idmap, struct dentry *dentry, const char *name, int ret)

/* From include/linux/fs.h (struct iattr's ia_valid). */
#define ATTR_MODE (1 << 0)
#define ATTR_UID (1 << 1)
#define ATTR_GID (1 << 2)
#define ATTR_SIZE (1 << 3)
#define ATTR_ATIME (1 << 4)
#define ATTR_MTIME (1 << 5)

/* utimensat(2), utimes(2) and futimesat(2) reach no path hook: only
 * notify_change's inode_setattr. Judged when the times change and nothing
 * a path hook judged already does (chmod, chown, truncate set ATTR_MODE,
 * ATTR_UID/GID, ATTR_SIZE). The arguments moved across kernels: 6.1's LSM
 * hook is (dentry, attr) while its security_inode_setattr is (userns,
 * dentry, attr); from 6.9 both are (idmap, dentry, attr). So they are read
 * by count. The previous program's return value is not read (see bpf). */
static __always_inline int decide_inode_setattr(__u32 mech, void *ctx)
{
	__u64 d = 0, a = 0;
	__u32 first = bpf_get_func_arg_cnt(ctx) >= 3 ? 1 : 0;
	if (bpf_get_func_arg(ctx, first, &d) || bpf_get_func_arg(ctx, first + 1, &a) || !d || !a)
		return 0;
	unsigned int valid = BPF_CORE_READ((struct iattr *)a, ia_valid);
	if (!(valid & (ATTR_ATIME | ATTR_MTIME)) || (valid & (ATTR_MODE | ATTR_UID | ATTR_GID | ATTR_SIZE)))
		return 0;
	return judge_dentry(mech, PATH_OP_UTIMES, (struct dentry *)d, 0);
}
WATCHER_HOOK(inode_setattr, security_inode_setattr, decide_inode_setattr(mech, ctx), void *first_arg)

/* --- leaving the sandbox at creation, namespaces, perf, keys ------------- */

#define CLONE_INTO_CGROUP 0x200000000ULL
#define CLONE_FILES 0x00000400ULL
#define CLONE_THREAD 0x00010000ULL

/* task_alloc gets the flags the kernel copied (clone's register, or
 * clone3's clone_args after copy_from_user): kernel state, not user memory
 * a sibling thread can still flip.
 *
 * clone3(CLONE_INTO_CGROUP) starts the child in the cgroup of a directory
 * fd, without a cgroup.procs write the file rules would see. task_alloc
 * runs before the kernel resolves that fd, so the flag itself is judged.
 *
 * CLONE_FILES without CLONE_THREAD: a second process sharing the file
 * table, so one process's descriptors are another's (the event's mode is
 * the low 32 bits of the flags). Threads share it by design and stay
 * allowed. */
static __always_inline int decide_task_alloc(__u32 mech, unsigned long long clone_flags, int ret)
{
	if (ret)
		return ret;
	if (clone_flags & CLONE_INTO_CGROUP)
		return judge_op(mech, LSM_OP_CLONE_INTO_CGROUP, EV_OPERATION, (__u32)(clone_flags >> 32));
	if ((clone_flags & CLONE_FILES) && !(clone_flags & CLONE_THREAD))
		return judge_op(mech, LSM_OP_CLONE_FILES, EV_OPERATION, (__u32)clone_flags);
	return 0;
}
WATCHER_HOOK(task_alloc, security_task_alloc, decide_task_alloc(mech, clone_flags, ret),
	     struct task_struct *task, unsigned long long clone_flags, int ret)

/* perf_event_open: 6.1 passes (attr, type), 6.18 only (type), so the
 * previous return value moves: not read (see bpf above). */
WATCHER_HOOK(perf_event_open, security_perf_event_open, judge_op(mech, LSM_OP_PERF_EVENT, EV_OPERATION, 0), void *unused)

static __always_inline int decide_op(__u32 mech, __u32 op, int ret)
{
	if (ret)
		return ret;
	return judge_op(mech, op, EV_OPERATION, 0);
}
/* clone(CLONE_NEWUSER) and unshare(CLONE_NEWUSER); the kernel function is
 * security_create_user_ns. */
WATCHER_HOOK(userns_create, security_create_user_ns, decide_op(mech, LSM_OP_USERNS, ret),
	     const struct cred *cred, int ret)
/* add_key(2) and keyctl(2) creating keys or keyrings (KEYCTL_JOIN_SESSION_KEYRING...). */
WATCHER_HOOK(key_alloc, security_key_alloc, decide_op(mech, LSM_OP_KEYRING, ret),
	     struct key *key, const struct cred *cred, unsigned long flags, int ret)

/* Every keyctl(2), add_key(2) and request_key(2) that touches a key or
 * keyring (reading, linking, searching, updating, the keyring a new key
 * goes to) asks key_permission first: refused while the task is in one of
 * those syscalls. The kernel's own lookups on the task's behalf
 * (fscrypt, ecryptfs at open) are left alone. */
static __always_inline int decide_key_permission(__u32 mech, int ret)
{
	if (ret)
		return ret;
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb)
		return 0;
	__u32 nr = current_syscall();
	__u32 op = syscall_check(nr, CHECK_KEY);
	if (!op)
		return 0;
	struct decision d = op_decision(sb->id, op, ACTION_ALLOW);
	return judge_task(mech, op, EV_OPERATION, d, sb, root, NULL, SYSCALL_TAG | nr, -1, false);
}
WATCHER_HOOK(key_permission, security_key_permission, decide_key_permission(mech, ret),
	     key_ref_t key_ref, const struct cred *cred, enum key_need_perm need_perm, int ret)

/* --- syscalls no hook judges: killed at their entry ------------------------- */

/* personality(2), name_to_handle_at(2) and io_uring_enter/register check
 * nothing an LSM hook sees. An fentry program on each syscall's own entry
 * point kills the caller as the backstop does, before the call returns to
 * user space, while every other syscall of the host runs untaxed: nothing
 * the call changed outlives the process (a personality is the dying
 * task's, a handle is useless with open_by_handle_at refused, a ring dies
 * with its only user). Tracing programs cannot return an errno: block is
 * a kill. */
static __always_inline int kill_in_syscall(void)
{
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb)
		return 0;
	__u32 nr = current_syscall();
	__u32 op = syscall_check(nr, CHECK_ENTRY);
	if (!op)
		return 0;
	struct decision d = op_decision(sb->id, op, ACTION_ALLOW);
	if (d.action == ACTION_BLOCK)
		d.action = ACTION_KILL;
	judge_task(EV_FENTRY, op, EV_OPERATION, d, sb, root, NULL, SYSCALL_TAG | nr, -1, false);
	return 0;
}

#define WATCHER_ENTRY(fn)                   \
	SEC("fentry/" #fn)                  \
	int BPF_PROG(entry_##fn)            \
	{                                   \
		return kill_in_syscall();   \
	}

/* io_uring_setup: where the ring gets a secure anonymous inode (6.1)
 * inode_init_security_anon refuses it with EPERM, a refusal a program
 * probing for io_uring survives; elsewhere the ring comes back and the
 * caller is killed on the way out (fexit), before user space runs. */
#define WATCHER_EXIT(fn)                                                \
	SEC("fexit/" #fn)                                               \
	int BPF_PROG(exit_##fn, const struct pt_regs *regs, long ret)   \
	{                                                               \
		return ret < 0 ? 0 : kill_in_syscall();                 \
	}
WATCHER_ENTRY(__x64_sys_personality)
WATCHER_ENTRY(__ia32_sys_personality)
/* Debian 6.1's BTF lists the name_to_handle_at wrappers twice (an
 * ambiguous attach target): the function both entries call, after the
 * path lookup and before the handle is encoded, instead. */
WATCHER_ENTRY(do_sys_name_to_handle)
WATCHER_EXIT(__x64_sys_io_uring_setup)
WATCHER_EXIT(__ia32_sys_io_uring_setup)
WATCHER_ENTRY(__x64_sys_io_uring_enter)
WATCHER_ENTRY(__ia32_sys_io_uring_enter)
WATCHER_ENTRY(__x64_sys_io_uring_register)
WATCHER_ENTRY(__ia32_sys_io_uring_register)

/* --- SIGIO and SIGURG to the agent ------------------------------------------ */

/* F_SETOWN (or F_SETOWN_EX, or a process group containing the agent) plus
 * O_ASYNC makes the kernel signal the owner when I/O is ready: no kill
 * syscall and no task_kill hook. The agent never asks for SIGIO, so every
 * such delivery to it is refused; the sandbox is the current task's when
 * it is in one (the delivery may run in another task's context). Another
 * owner outside the sandbox's subtree is judged by the other-processes
 * rule when the task making the I/O ready is in the sandbox (a host task
 * readying the file signals on its own account). */
/* --- SIGIO/SIGURG owners a sandbox set -------------------------------------
 *
 * The kernel sends a file's SIGIO or SIGURG from whatever task makes the
 * event happen: the writer, a task closing its files as it exits, a
 * kworker finishing a delayed close. Judged by that task alone, an owner
 * a sandbox set on the host escapes whenever the signal comes from outside
 * the sandbox (a socket's hang-up at its close killed the host process).
 * So the sandbox that sets a file's owner (fcntl F_SETOWN, F_SETOWN_EX;
 * ioctl FIOSETOWN, SIOCSPGRP) is recorded with the file, and every signal
 * for that file is judged as that sandbox's, whoever triggers it. */
#define F_SETOWN_ 8
#define F_SETOWN_EX_ 15
#define FIOSETOWN_ 0x8901
#define SIOCSPGRP_ 0x8902

struct fown_setter {
	__u64 root; /* the sandbox's root cgroup */
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64); /* struct file * */
	__type(value, struct fown_setter);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lsm_fown_setters SEC(".maps");

/* Before Linux 6.12 the owner was part of struct file. */
struct file___fown_inline {
	struct fown_struct f_owner;
} __attribute__((preserve_access_index));

static __always_inline struct file *fown_file(struct fown_struct *fown)
{
	if (bpf_core_field_exists(fown->file))
		return BPF_CORE_READ(fown, file);
	return (struct file *)((void *)fown - bpf_core_field_offset(struct file___fown_inline, f_owner));
}

static __always_inline void record_fown_setter(struct file *file)
{
	__u64 root = 0;
	if (!file || !current_sandbox(&root))
		return;
	__u64 k = (__u64)file;
	struct fown_setter v = { .root = root };
	bpf_map_update_elem(&lsm_fown_setters, &k, &v, BPF_ANY);
}

static __always_inline int decide_file_fcntl(__u32 mech, struct file *file, unsigned int cmd, int ret)
{
	(void)mech; /* recorded, never refused here (the pid names no task yet) */
	if (!ret && (cmd == F_SETOWN_ || cmd == F_SETOWN_EX_))
		record_fown_setter(file);
	return ret;
}
WATCHER_HOOK(file_fcntl, security_file_fcntl, decide_file_fcntl(mech, file, cmd, ret),
	     struct file *file, unsigned int cmd, unsigned long arg, int ret)

SEC("fentry/security_file_free")
int BPF_PROG(entry_security_file_free, struct file *file)
{
	__u64 k = (__u64)file;
	bpf_map_delete_elem(&lsm_fown_setters, &k);
	return 0;
}

/* judge_sigio judges a SIGIO/SIGURG (sig 0: SIGIO) for tsk as sandbox sb's
 * (rooted at root): the agent by its own rule, any other task outside the
 * subtree by the other-processes rule. */
static __always_inline int judge_sigio(__u32 mech, struct task_struct *tsk, int sig, struct sandbox *sb, __u64 root)
{
	if (!is_agent(BPF_CORE_READ(tsk, tgid))) {
		if (in_subtree(tsk, root))
			return 0;
		struct decision d = op_decision(sb->id, LSM_OP_OTHER_TASK, ACTION_ALLOW);
		return judge_task(mech, LSM_OP_OTHER_TASK, EV_SIGNAL, d, sb, root, tsk, (__u32)(sig ? sig : 29), -1, false);
	}
	struct decision d = op_decision(sb->id, LSM_OP_AGENT_SIGNAL, ACTION_BLOCK);
	if (d.action < ACTION_BLOCK && sig != 0)
		d.action = ACTION_RECORD;
	return judge_task(mech, LSM_OP_AGENT_SIGNAL, EV_SIGNAL, d, sb, root, tsk, (__u32)(sig ? sig : 29), -1, false);
}

static __always_inline int decide_file_send_sigiotask(__u32 mech, struct task_struct *tsk, struct fown_struct *fown,
						      int sig, int ret)
{
	if (ret)
		return ret;
	/* An owner a sandbox set: that sandbox's signal, whoever sends it. */
	__u64 fk = (__u64)fown_file(fown);
	struct fown_setter *st = bpf_map_lookup_elem(&lsm_fown_setters, &fk);
	if (st) {
		__u64 root = st->root;
		struct sandbox *owner = bpf_map_lookup_elem(&sandboxes, &root);
		if (owner)
			return judge_sigio(mech, tsk, sig, owner, root);
	}
	if (!is_agent(BPF_CORE_READ(tsk, tgid)))
		return judge_other_task(mech, EV_SIGNAL, tsk, (__u32)(sig ? sig : 29 /* SIGIO */));
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	struct sandbox none = {};
	struct decision d = { .action = ACTION_BLOCK };
	if (sb)
		d = op_decision(sb->id, LSM_OP_AGENT_SIGNAL, ACTION_BLOCK);
	else
		sb = &none;
	if (d.action < ACTION_BLOCK && sig != 0)
		d.action = ACTION_RECORD;
	return judge_task(mech, LSM_OP_AGENT_SIGNAL, EV_SIGNAL, d, sb, root, tsk, (__u32)(sig ? sig : 29 /* SIGIO */), -1, false);
}
WATCHER_HOOK(file_send_sigiotask, security_file_send_sigiotask, decide_file_send_sigiotask(mech, tsk, fown, sig, ret),
	     struct task_struct *tsk, struct fown_struct *fown, int sig, int ret)

/* --- exec rules: the file that supplies the code ---------------------------- */

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

/* --- anonymous inodes: userfaultfd and io_uring ------------------------------ */

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

/* --- sockets: families and types the egress rules refuse, unix peers ------- */

/* socket_create runs for every family before the family's create function
 * (cgroup/sock_create runs only inside inet_create and inet6_create, so it
 * never sees AF_PACKET, AF_NETLINK or AF_VSOCK), from every entry (int 0x80
 * socketcall and socket alike). Rules are keyed like cgroup.c's socket
 * rules, most specific pattern first; ANY matches every value. */
struct sock_key {
	__u32 sandbox_id;
	__u32 family;
	__u32 type;
	__u32 protocol;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct sock_key);
	__type(value, struct decision);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lsm_sock_rules SEC(".maps");

/* Unix socket paths a sandbox whose egress restricts unix sockets may
 * connect or send to, judged on the socket the kernel found (its bound
 * path, walked like a file's): a symlink in the workspace to a host socket
 * arrives as the host socket. Same LPM layout as lsm_path_rules; the value
 * names the allowing rule. The refusal's decision is LSM_OP_UNIX_CONNECT's
 * op rule: no op rule, no restriction. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 4096);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct path_key);
	__type(value, struct decision);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lsm_unix_rules SEC(".maps");

enum sock_op {
	SOCK_OP_CREATE = 1,       /* socket(2), socketpair(2) */
	SOCK_OP_UNIX_CONNECT = 2, /* connect(2) of a stream or seqpacket unix socket */
	SOCK_OP_UNIX_SEND = 3,    /* connect or sendmsg of a datagram unix socket */
};

/* Why a unix peer was refused. */
#define UNIX_PEER_PATH 1     /* bound outside the sandbox's socket paths */
#define UNIX_PEER_ABSTRACT 2 /* an abstract name (the network namespace's, not the sandbox's) */

struct sock_event {
	struct event_hdr hdr;
	__u32 op;       /* enum sock_op */
	__u32 family;   /* AF_*; AF_UNIX for the unix hooks */
	__u32 type;     /* SOCK_* */
	__u32 protocol;
	__u32 reason;   /* UNIX_PEER_* */
	__u32 fflags;   /* FILE_F_TRUNCATED when the path was cut */
	char path[PATH_MAX_LEN]; /* the peer's resolved path (unix hooks) */
};

const struct sock_key *unused_sock_key __attribute__((unused));
const struct sock_event *unused_sock_event __attribute__((unused));

static __always_inline struct decision *sock_lookup(__u32 sid, __u32 family, __u32 type, __u32 protocol)
{
	struct sock_key k = { .sandbox_id = sid, .family = family, .type = type, .protocol = protocol };
	struct decision *d;
	if ((d = bpf_map_lookup_elem(&lsm_sock_rules, &k)))
		return d;
	k.type = ANY;
	if ((d = bpf_map_lookup_elem(&lsm_sock_rules, &k)))
		return d;
	k.type = type, k.protocol = ANY;
	if ((d = bpf_map_lookup_elem(&lsm_sock_rules, &k)))
		return d;
	k.type = ANY;
	if ((d = bpf_map_lookup_elem(&lsm_sock_rules, &k)))
		return d;
	k.family = ANY, k.type = type;
	return bpf_map_lookup_elem(&lsm_sock_rules, &k);
}

static __always_inline int sock_conclude(__u32 mech, __u32 kind, struct decision d, struct sandbox *sb, __u64 root,
					 __u32 op, __u32 family, __u32 type, __u32 protocol, __u32 reason,
					 const char *path, __u32 fflags)
{
	if (d.action == ACTION_ALLOW)
		return 0;
	__u32 verdict = effective_verdict(sb, d.action);
	struct sock_event *e = reserve_event(sizeof(*e), true);
	if (e) {
		fill_hdr(&e->hdr, kind + mech, verdict, d.rule_id, root, sb);
		e->op = op;
		e->family = family;
		e->type = type;
		e->protocol = protocol;
		e->reason = reason;
		e->fflags = fflags;
		e->path[0] = 0;
		if (path)
			bpf_probe_read_kernel_str(e->path, sizeof(e->path), path);
		submit_event(e, true);
	}
	return conclude(verdict);
}

static __always_inline int decide_socket_create(__u32 mech, int family, int type, int protocol, int kern, int ret)
{
	if (ret)
		return ret;
	if (kern)
		return 0; /* the kernel's own sockets */
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb)
		return 0;
	struct decision *r = sock_lookup(sb->id, family, type, protocol);
	if (!r)
		r = sock_lookup(0, family, type, protocol);
	if (!r)
		return 0;
	struct decision d = *r;
	return sock_conclude(mech, EV_LSM_SOCKET, d, sb, root, SOCK_OP_CREATE, family, type, protocol, 0, NULL, 0);
}
WATCHER_HOOK(socket_create, security_socket_create, decide_socket_create(mech, family, type, protocol, kern, ret),
	     int family, int type, int protocol, int kern, int ret)

#define AF_UNIX_FAMILY 1

/* judge_unix_peer judges a unix connect or send from the current task to
 * the socket other, by where other is bound. Unnamed peers (socketpair,
 * a socket never bound) have no name to judge and stay allowed. */
static __always_inline int judge_unix_peer(__u32 mech, __u32 op, struct sock *other, __u32 type)
{
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb || !other)
		return 0;
	struct decision d = op_decision(sb->id, LSM_OP_UNIX_CONNECT, ACTION_ALLOW);
	if (d.action == ACTION_ALLOW)
		return 0;
	struct unix_sock *u = (struct unix_sock *)other;
	struct unix_address *addr = BPF_CORE_READ(u, addr);
	if (!addr)
		return 0;
	struct dentry *dentry = BPF_CORE_READ(u, path.dentry);
	if (!dentry) {
		/* Bound, but not in the filesystem: an abstract name. */
		return sock_conclude(mech, EV_LSM_UNIX, d, sb, root, op, AF_UNIX_FAMILY, type, 0, UNIX_PEER_ABSTRACT, NULL, 0);
	}
	__u32 zero = 0;
	struct path_key *key = bpf_map_lookup_elem(&lsm_key_scratch, &zero);
	struct pathwalk *pw = bpf_map_lookup_elem(&lsm_pw_scratch, &zero);
	if (!key || !pw)
		return 0;
	struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
	struct path rootp = BPF_CORE_READ(task, fs, root);
	struct path p = { .mnt = BPF_CORE_READ(u, path.mnt), .dentry = dentry };
	pw_resolve(pw, &p, &rootp);
	long n = bpf_probe_read_kernel_str(key->path, sizeof(key->path), pw->buf);
	bool truncated = (pw->flags & PW_F_TRUNCATED) || pw->len + 1 > LSM_PATH_LEN;
	if (n <= 0) {
		key->path[0] = 0;
		n = 1;
		truncated = true;
	}
	if (n > LSM_PATH_LEN)
		n = LSM_PATH_LEN;
	if (truncated)
		n--;
	key->prefixlen = 32 + 8 * (__u32)n;
	key->sandbox_id = sb->id;
	if (bpf_map_lookup_elem(&lsm_unix_rules, key))
		return 0;
	return sock_conclude(mech, EV_LSM_UNIX, d, sb, root, op, AF_UNIX_FAMILY, type, 0, UNIX_PEER_PATH, pw->buf,
			     truncated ? FILE_F_TRUNCATED : 0);
}

/* connect(2) of a stream or seqpacket socket: other is the listener the
 * kernel looked up (after resolving every symlink of the path). */
static __always_inline int decide_unix_stream_connect(__u32 mech, struct sock *sock, struct sock *other, int ret)
{
	if (ret)
		return ret;
	return judge_unix_peer(mech, SOCK_OP_UNIX_CONNECT, other, BPF_CORE_READ(sock, sk_type));
}
WATCHER_HOOK(unix_stream_connect, security_unix_stream_connect, decide_unix_stream_connect(mech, sock, other, ret),
	     struct sock *sock, struct sock *other, struct sock *newsk, int ret)

/* Datagram connect(2) and every sendmsg(2) of a datagram socket. */
static __always_inline int decide_unix_may_send(__u32 mech, struct socket *sock, struct socket *other, int ret)
{
	if (ret)
		return ret;
	return judge_unix_peer(mech, SOCK_OP_UNIX_SEND, BPF_CORE_READ(other, sk), BPF_CORE_READ(sock, type));
}
WATCHER_HOOK(unix_may_send, security_unix_may_send, decide_unix_may_send(mech, sock, other, ret),
	     struct socket *sock, struct socket *other, int ret)


/* --- own subtree: terminals and notify marks --------------------------------- */

#define TIOCSTI 0x5412
#define TIOCLINUX 0x541C

/* TIOCSTI pushes bytes into a terminal's input as if typed (the operator's
 * shell runs them); TIOCLINUX's selection paste does the same on a virtual
 * console. Refused on every terminal, the sandbox's own included: nothing
 * everyday needs them. 32-bit callers reach the same hook (compat_ioctl
 * calls security_file_ioctl on 6.1; file_ioctl_compat where the kernel has
 * it judges below too). */
static __always_inline int decide_file_ioctl(__u32 mech, struct file *file, unsigned int cmd, int ret)
{
	if (ret)
		return ret;
	if (cmd == FIOSETOWN_ || cmd == SIOCSPGRP_)
		record_fown_setter(file);
	if (cmd != TIOCSTI && cmd != TIOCLINUX)
		return 0;
	return judge_op(mech, LSM_OP_TTY_INJECT, EV_OPERATION, cmd);
}
WATCHER_HOOK(file_ioctl, security_file_ioctl, decide_file_ioctl(mech, file, cmd, ret),
	     struct file *file, unsigned int cmd, unsigned long arg, int ret)
WATCHER_HOOK(file_ioctl_compat, security_file_ioctl_compat, decide_file_ioctl(mech, file, cmd, ret),
	     struct file *file, unsigned int cmd, unsigned long arg, int ret)

/* Paths where a sandbox may put an inotify or fanotify mark: its
 * workspaces (same LPM layout as lsm_path_rules; a key ending in "/"
 * covers the tree, one ending in NUL that path). Judged only when the
 * sandbox has a LSM_OP_NOTIFY_MARK rule. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 4096);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct path_key);
	__type(value, struct decision);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} lsm_notify_paths SEC(".maps");

#define FSNOTIFY_OBJ_SB 2

/* file_op_begin fills c and op's decision d for a file judged as a whole
 * by an op rule; false when there is nothing to judge. */
static __always_inline bool file_op_begin(struct file_ctx *c, __u32 op, struct decision *d)
{
	if (!file_begin(c))
		return false;
	*d = op_decision(c->sb->id, op, ACTION_ALLOW);
	return d->action != ACTION_ALLOW;
}

/* A mark sees what other processes do to the file (fanotify's permission
 * events even hold their opens): on a file outside the workspaces it reads
 * a host process's secrets as they are opened. A filesystem-wide mark
 * (FAN_MARK_FILESYSTEM) sees every file of the filesystem: refused
 * wherever it is put. */
static __always_inline int decide_path_notify(__u32 mech, const struct path *path, unsigned int obj_type, int ret)
{
	if (ret)
		return ret;
	struct file_ctx c;
	struct decision d;
	if (!file_op_begin(&c, LSM_OP_NOTIFY_MARK, &d))
		return 0;
	struct path p = { .mnt = BPF_CORE_READ(path, mnt), .dentry = BPF_CORE_READ(path, dentry) };
	bool truncated = key_from_walk(c.key, c.pw, &p);
	c.key->sandbox_id = c.sb->id;
	if (obj_type != FSNOTIFY_OBJ_SB && bpf_map_lookup_elem(&lsm_notify_paths, c.key))
		return 0;
	struct file_facts f;
	facts_of(&f, BPF_CORE_READ(p.dentry, d_inode), BPF_CORE_READ(p.dentry, d_sb));
	return emit_file(EV_FILE_OP + mech, &c, d.action, d.rule_id, &f, obj_type, 0, MATCH_NOTIFY,
			 truncated ? FILE_F_TRUNCATED : 0, PATH_OP_NOTIFY);
}
WATCHER_HOOK(path_notify, security_path_notify, decide_path_notify(mech, path, obj_type, ret),
	     const struct path *path, __u64 mask, unsigned int obj_type, int ret)

/* mq_unlink(2) removes a queue by name without opening it (vfs_unlink:
 * inode_unlink, no path_unlink): a queue the caller's sandbox did not
 * create is judged by the other-IPC rule. */
static __always_inline int decide_inode_unlink(__u32 mech, struct inode *dir, struct dentry *dentry, int ret)
{
	if (ret || BPF_CORE_READ(dir, i_sb, s_magic) != MQUEUE_MAGIC)
		return ret;
	struct file_ctx c;
	struct decision d;
	if (!file_op_begin(&c, LSM_OP_OTHER_IPC, &d))
		return 0;
	struct file_facts f;
	facts_of(&f, BPF_CORE_READ(dentry, d_inode), BPF_CORE_READ(dir, i_sb));
	struct mq_key k = { .dev = f.dev, .ino = f.ino };
	struct ipc_owner *own = bpf_map_lookup_elem(&lsm_mq_owner, &k);
	if (own && own->sandbox_cg == c.root)
		return 0;
	bpf_probe_read_kernel_str(c.key->path, sizeof(c.key->path), BPF_CORE_READ(dentry, d_name.name));
	return emit_file(EV_FILE_OP + mech, &c, d.action, d.rule_id, &f, 0, 0, MATCH_OTHER_IPC, 0, PATH_OP_UNLINK);
}
WATCHER_HOOK(inode_unlink, security_inode_unlink, decide_inode_unlink(mech, dir, dentry, ret),
	     struct inode *dir, struct dentry *dentry, int ret)
