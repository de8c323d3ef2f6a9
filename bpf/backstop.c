//go:build ignore

/* Kill backstop: where no blocking hook can load (BPF LSM refused or absent),
 * tracepoints decide and bpf_send_signal(SIGKILL) stops the sandboxed
 * process. The operation may already have happened (a mount stays mounted),
 * so events say VERDICT_KILLED, carry the syscall's return value, and the
 * agent undoes what it can.
 *
 * - sys_enter: syscall rules (ptrace, process_vm_*, pidfd_getfd, mount
 *   family, bpf, modules, kexec, ...) and argument-checked categories
 *   (clone sharing the file table, io_uring_setup, signals to the agent).
 *   The kill is sent before the syscall runs: pending SIGKILL makes
 *   fork/clone fail and remote page access (process_vm_*) stop with EINTR;
 *   the event is completed at sys_exit with the return value.
 * - sys_exit of the open family: the returned descriptor's file is judged
 *   on its resolved, mount-aware path (dentry walk, see pathwalk.h), its
 *   inode (hard links), its filesystem (cgroupfs writes) and /proc/PID/mem.
 * - sched_prepare_exec (optional): exec of a path under an exec rule.
 * - io_uring_submit_req (optional): opens through io_uring when a policy
 *   allows io_uring at all (fixed-file opens never return a descriptor).
 * - cgroup_attach_task: a task of a sandbox moved outside it.
 * - sys_exit of connect: the unix peer the kernel found (symlinks
 *   resolved), for sandboxes whose egress restricts unix sockets where no
 *   LSM unix hook runs (see "Unix peers" below).
 * - sys_exit of mmap/mremap/shmat, i386 mapping calls and
 *   sched_process_exec: mappings below vm.mmap_min_addr, where no
 *   mmap_addr hook runs (include/backstop_lowmap.h).
 */
#include "common.h"
#include "pathwalk.h"
#include "subtree.h"
#include "tty.h"
#include "ipcobj.h"
#include "procfs.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Map declarations. The rule and counter maps are pinned by name, so a
 * later agent's programs share them; per-task state lives in task storage. */
#define BS_MAP(name, map_type, key_type, value_type, entries) \
	struct { \
		__uint(type, map_type); \
		__uint(max_entries, entries); \
		__type(key, key_type); \
		__type(value, value_type); \
		__uint(pinning, LIBBPF_PIN_BY_NAME); \
	} name SEC(".maps")

#define BS_TASK_STORAGE(name, value_type) \
	struct { \
		__uint(type, BPF_MAP_TYPE_TASK_STORAGE); \
		__uint(map_flags, BPF_F_NO_PREALLOC); \
		__type(key, int); \
		__type(value, value_type); \
	} name SEC(".maps")

#define SIGKILL 9
#define MAX_SYSCALLS 512

#define FMODE_READ 0x1
#define FMODE_WRITE 0x2
#define FMODE_PATH 0x4000

#define CGROUP_SUPER_MAGIC 0x27e0eb
#define CGROUP2_SUPER_MAGIC 0x63677270
#define PROC_SUPER_MAGIC 0x9fa0

#define CLONE_FILES 0x00000400
#define CLONE_THREAD 0x00010000

/* x86_64 syscall numbers used here. */
#define NR_open 2
#define NR_clone 56
#define NR_execve 59
#define NR_kill 62
#define NR_socket 41
#define NR_connect 42
#define NR_creat 85
#define NR_rt_sigqueueinfo 129
#define NR_tkill 200
#define NR_tgkill 234
#define NR_openat 257
#define NR_rt_tgsigqueueinfo 297
#define NR_open_by_handle_at 304
#define NR_finit_module 313
#define NR_kexec_file_load 320
#define NR_pidfd_send_signal 424
#define NR_io_uring_enter 426
#define NR_clone3 435
#define NR_openat2 437
#define NR_pidfd_getfd 438
#define NR_mmap 9
#define NR_write 1
#define NR_ioctl 16
#define NR_writev 20
#define NR_sendto 44
#define NR_sendmsg 46
#define NR_fcntl 72
#define NR_syslog 103
#define NR_setpriority 141
#define NR_sched_setparam 142
#define NR_sched_setscheduler 144
#define NR_adjtimex 159
#define NR_quotactl 179
#define NR_sched_setaffinity 203
#define NR_ioprio_set 251
#define NR_migrate_pages 256
#define NR_unshare 272
#define NR_move_pages 279
#define NR_prlimit64 302
#define NR_clock_adjtime 305
#define NR_sendmmsg 307
#define NR_setns 308
#define NR_kcmp 312
#define NR_sched_setattr 314
#define NR_pidfd_open 434
#define NR_process_madvise 440
#define NR_quotactl_fd 443
#define NR_settimeofday 164
#define NR_clock_settime 227
#define NR_sethostname 170
#define NR_fanotify_init 300
#define NR_setdomainname 171

/* Argument-checked categories (index of bs_categories). */
enum bs_category {
	CAT_NONE = 0,
	CAT_CGROUP_WRITE = 1,  /* write-open of a cgroupfs file */
	CAT_PROC_MEM = 2,      /* open of another process's /proc/PID/mem */
	CAT_CLONE_FILES = 3,   /* clone/clone3 with CLONE_FILES, no CLONE_THREAD */
	CAT_IO_URING = 4,      /* io_uring_setup */
	CAT_IO_URING_OPEN = 5, /* IORING_OP_OPENAT/OPENAT2 submitted */
	CAT_SIGNAL_AGENT = 6,  /* kill-family syscall aimed at the agent */
	CAT_CGROUP_ESCAPE = 7, /* a sandbox task moved to a cgroup outside it */
	CAT_PATH = 8,          /* path or inode rule (events only) */
	CAT_COMPAT = 9,        /* any 32-bit (int 0x80, x32) syscall */
	CAT_MODIFY = 10,       /* an inode changed outside writable places */
	CAT_EXEC_FILELESS = 11, /* exec of a file with no name (memfd, deleted) */
	CAT_MMAP_EXEC = 12,    /* mmap PROT_EXEC of a file: judged by exec rules */
	CAT_PACKET_SOCKET = 13, /* socket(AF_PACKET): no cgroup hook runs for them */
	CAT_UNIX_PEER = 14,    /* unix connect to a peer bound outside the sandbox's socket paths */
	CAT_LOW_MAPPING = 15,  /* a mapping below vm.mmap_min_addr (backstop_lowmap.h) */
	CAT_OTHER_TASK = 16,   /* a process outside the sandbox's subtree (subtree.h) */
	CAT_TTY_INJECT = 17,   /* ioctl TIOCSTI / TIOCLINUX */
	CAT_NET_CONFIG = 18,   /* socket ioctls setting interfaces, routes, ARP (CAP_NET_ADMIN) */
	CAT_CLOCK_ADJUST = 19, /* adjtimex / clock_adjtime with modes set (CAP_SYS_TIME) */
	CAT_NAMESPACES = 20,   /* setns to a namespace not its own, unshare/clone of namespaces (CAP_SYS_ADMIN) */
	CAT_SYSLOG = 21,       /* syslog actions other than reading (CAP_SYSLOG) */
	CAT_QUOTA = 22,        /* quotactl commands other than reading (CAP_SYS_ADMIN) */
	CAT_CAP_USE = 23,      /* a capability granted (cap_capable tracepoint, after the check) */
	CAT_OTHER_IPC = 24,    /* a System V object the sandbox did not create (ipcobj.h) */
	CAT_NOTIFY_MARK = 25,  /* an inotify mark outside the sandbox's writable places */
	CAT_MAX = 26,
	/* bs_categories' size: room for categories to come, so the pinned
	 * map an upgraded agent adopts keeps its shape. */
	CAT_SLOTS = 64,
};

/* Operations a path rule applies to. */
#define OP_READ 1
#define OP_WRITE 2
#define OP_EXEC 4

/* Per syscall number, host-wide: whether any sandbox has a plain rule for
 * it (action: the strictest, nonzero) or, when category is set, an
 * argument check. The fast path: syscalls no sandbox rules on cost one
 * array lookup. Each sandbox's own action is in bs_sb_rules. */
struct syscall_rule {
	__u32 action;
	__u32 rule_id;
	__u32 category;
};

struct category_rule {
	__u32 action;
	__u32 rule_id;
};

/* Key of bs_sb_rules: one sandbox's rule for a syscall or a category.
 * what is SBR_* | number. */
#define SBR_SYSCALL 0x00000   /* x86_64 syscall number */
#define SBR_SYSCALL32 0x10000 /* i386 syscall number (int 0x80) */
#define SBR_CATEGORY 0x20000  /* enum bs_category */
#define SBR_CAP 0x40000       /* capability number: refused when used (cap_capable) */
struct sb_rule_key {
	__u32 sandbox_id; /* 0: every sandbox without an entry of its own */
	__u32 what;
};

/* LPM key: sandbox id (0 = every sandbox) then the path. Exact rules
 * include the terminating NUL in their prefix, prefix rules do not. */
#define RULE_PATH_LEN 252
struct path_key {
	__u32 prefixlen;
	__u32 sandbox_id;
	char path[RULE_PATH_LEN];
};

struct path_rule {
	__u32 action;
	__u32 rule_id;
	__u32 ops; /* OP_* */
	__u32 generation; /* bs_inode_rules: the file's i_generation (GEN_ANY) */
};

/* Inode entries name a file, not a number: an inode number freed by a
 * deleted file goes to the next file created (ext4, xfs: often at once),
 * and an entry written for the deleted file must not judge that one. An
 * entry holds the i_generation its file had when the agent wrote it
 * (filesystems draw a new one whenever they hand a number out again);
 * GEN_ANY where the agent could not read it (procfs, overlayfs, btrfs,
 * network filesystems): the number alone decides there. 0 is a real
 * generation (files written by mkfs, such as an image's /etc/shadow). See
 * internal/enforce/fileident.go. The field was padding before: the
 * programs of an older agent, attached until this agent's replace them,
 * read the same layout and ignore it. */
#define GEN_ANY 0xffffffffu

static __always_inline bool same_generation(__u32 entry, struct inode *inode)
{
	return entry == GEN_ANY || entry == BPF_CORE_READ(inode, i_generation);
}

/* Exact file rules are also keyed by inode, so hard links (another name
 * for the same inode) match too. */
struct inode_key {
	__u64 ino;
	__u32 dev; /* MAJOR<<20 | MINOR */
	__u32 sandbox_id;
};

struct file_event {
	struct event_hdr hdr;
	__s64 nr;         /* syscall (or NR_execve for exec, NR_io_uring_enter) */
	__u64 ino;
	__u32 f_flags;
	__u32 f_mode;
	__u32 i_mode;
	__u32 dev;
	__u32 category;   /* enum bs_category */
	__u32 path_flags; /* PW_F_* */
	__u32 target_pid; /* /proc/PID/mem: PID */
	__u32 pad;
	char path[PW_HALF];
};

struct syscall_event {
	struct event_hdr hdr;
	__s64 nr;
	__s64 ret;        /* return value; RET_UNKNOWN when not seen */
	__u64 args[6];
	__u64 mnt_ns;     /* mount namespace inode of the caller */
	__u32 category;
	__u32 target_pid; /* ptrace, process_vm_*, pidfd_*, signals */
	__u8 target_comm[TASK_COMM_LEN];
	char str[PW_HALF];  /* mount target, chroot/pivot_root path, module path */
	char aux[PW_HALF];  /* cwd when str is relative, or mount source */
	char fstype[32];
};

#define RET_UNKNOWN (-(1LL << 62))

/* Syscall events whose strings are all empty (most: ptrace, signals, bpf,
 * recorded syscalls) travel without them: the record ends before str. The
 * reader treats the missing bytes as zero. */
#define SYSCALL_EVENT_COMPACT __builtin_offsetof(struct syscall_event, str)

_Static_assert(sizeof(struct syscall_event) + 8 <= WAKEUP_WINDOW, "record longer than WAKEUP_WINDOW");
_Static_assert(sizeof(struct file_event) + 8 <= WAKEUP_WINDOW, "record longer than WAKEUP_WINDOW");

struct cgroup_event {
	struct event_hdr hdr;
	__u64 dst_cgroup;  /* cgroup id the task was moved to */
	__u64 from_sandbox; /* sandbox root it left */
	__u32 moved_pid;
	__u32 mover_pid;
	__u8 moved_comm[TASK_COMM_LEN];
	char dst_path[PW_HALF];
};

_Static_assert(sizeof(struct cgroup_event) + 8 <= WAKEUP_WINDOW, "record longer than WAKEUP_WINDOW");

const struct file_event *unused_file_event __attribute__((unused));
const struct syscall_event *unused_syscall_event __attribute__((unused));
const struct cgroup_event *unused_cgroup_event __attribute__((unused));
const struct path_key *unused_path_key __attribute__((unused));
const struct path_rule *unused_path_rule __attribute__((unused));
const struct inode_key *unused_inode_key __attribute__((unused));
const struct syscall_rule *unused_syscall_rule __attribute__((unused));
const struct category_rule *unused_category_rule __attribute__((unused));
const struct sb_rule_key *unused_sb_rule_key __attribute__((unused));

BS_MAP(bs_syscall_rules, BPF_MAP_TYPE_ARRAY, __u32, struct syscall_rule, MAX_SYSCALLS);

/* The same per i386 number (int 0x80), for when CAT_COMPAT allows 32-bit
 * syscalls at all. */
BS_MAP(bs_syscall_rules32, BPF_MAP_TYPE_ARRAY, __u32, struct syscall_rule, MAX_SYSCALLS);

/* Directories (and exact files) deciding changes of inodes below them, by
 * inode, so every name of a file (hard links, renames, files created after
 * the rules were written) is judged the same. The deepest entry above a
 * changed inode decides; none: the sandbox's entry with ino 0 (its write
 * default, the rule on "/"). */
#define DIR_WRITABLE 1  /* changes allowed below */
#define DIR_PROTECTED 2 /* reads refused below: links and renames too */
#define DIR_MOUNTED_SB 0xffffffff /* sandbox_id of {dev, ino 0}: a filesystem the agent sees */
struct dir_key {
	__u64 ino;
	__u32 dev;
	__u32 sandbox_id;
};

struct dir_rule {
	__u32 kind; /* DIR_* (0 for the default entry) */
	__u32 action;
	__u32 rule_id;
	__u32 generation; /* the place's i_generation (GEN_ANY); ino 0 entries: unused */
};

const struct dir_key *unused_dir_key __attribute__((unused));
const struct dir_rule *unused_dir_rule __attribute__((unused));

BS_MAP(bs_dirs, BPF_MAP_TYPE_HASH, struct dir_key, struct dir_rule, 4096);

/* Signals sandboxed processes sent to the agent, per signal number: the
 * agent ignores a SIGTERM/SIGINT/SIGHUP whose count moved. */
BS_MAP(bs_agent_signals, BPF_MAP_TYPE_ARRAY, __u32, __u64, 65);

/* Signals to the agent that look like its operator's, per signal number:
 * sent by a user process outside every sandbox (kill, tgkill, sigqueue:
 * si_code <= 0) or by the kernel itself (a terminal's ^C or hangup). A
 * file owner's SIGIO/SIGURG (si_code > 0) never counts, whatever context
 * generated it (the writer's, a kworker's, softirq). The agent stops on a
 * SIGTERM/SIGINT/SIGHUP only when this count moved: a sandbox sending the
 * same signal twice (a write, then the close at its exit) cannot make one
 * of them look like the operator's. */
BS_MAP(bs_operator_signals, BPF_MAP_TYPE_ARRAY, __u32, __u64, 65);

/* Per category, host-wide: whether any sandbox has a rule (action: the
 * strictest, nonzero), a gate before the sandbox is known. */
BS_MAP(bs_categories, BPF_MAP_TYPE_ARRAY, __u32, struct category_rule, CAT_SLOTS);

/* Each sandbox's own syscall and category actions, so a sandbox whose
 * policy allows an operation is never killed because another sandbox
 * blocks it. Only rules that are not allow are stored (plus allow entries
 * overriding the every-sandbox set, id 0), i386 numbers only where 32-bit
 * calls run: about 50 entries per sandbox of the presets without BPF LSM,
 * so some 1300 sandboxes (SetRules refuses more with a clear error). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct sb_rule_key);
	__type(value, struct category_rule);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} bs_sb_rules SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 4096);
	__type(key, struct path_key);
	__type(value, struct path_rule);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} bs_path_rules SEC(".maps");

BS_MAP(bs_inode_rules, BPF_MAP_TYPE_HASH, struct inode_key, struct path_rule, 4096);

/* Events decided at sys_enter, completed with the return value at sys_exit,
 * kept per task (thread): filled in place, no hash update and delete per
 * syscall. hdr.kind is EV_KILL_SYSCALL while an event waits, 0 once sent. */
BS_TASK_STORAGE(bs_pending, struct syscall_event);

/* Sandbox a task belongs to, kept from fork and cgroup moves, so a move out
 * of the sandbox is seen after the fact (cgroup_attach_task fires after the
 * task has already changed cgroup). */
struct task_sandbox {
	__u64 sandbox_cg;
	__u32 sandbox_id;
	__u32 pad;
};

BS_TASK_STORAGE(bs_tasks, struct task_sandbox);

/* The script an exec went through (its shebang named an interpreter): the
 * interpreter's open of that name is judged as the exec of the file it
 * opens, the file that supplies the code. */
struct script_pending {
	char name[PW_HALF];
	__u32 set;
	__u32 pad;
};

BS_TASK_STORAGE(bs_scripts, struct script_pending);

struct scratch {
	char upath[PW_HALF];
	struct pathwalk pw;
	struct path_key key;
	struct syscall_event ev;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct scratch);
} bs_scratch SEC(".maps");

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

/* --- Own subtree and host-wide state at sys_enter (issue 25) ---------------
 *
 * entry_category picks the category of a call from its registers only,
 * before the caller's sandbox is looked up, so the hot calls of every task
 * (ioctl, fcntl, signals to its own threads) leave at once. subtree_target
 * then judges the target on kernel state. The call itself still runs: a
 * SIGKILL queued at sys_enter is acted on when the task returns to user
 * space (a signal sent, a limit set, the clock set, before it dies).
 */

#define TIOCSTI_ 0x5412
#define TIOCLINUX_ 0x541C
#define FIOSETOWN_ 0x8901
#define SIOCSPGRP_ 0x8902
#define F_SETOWN_ 8
#define F_SETOWN_EX_ 15
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

/* --- System V objects of other sandboxes and the host (issue 25) ------------
 *
 * Without the LSM's ipc hooks, a System V object is the sandbox's own when
 * bpf/ipc.c recorded its creation by a process of the sandbox (its
 * tracepoints are attached while a sandbox needs this). Using another's
 * (shmat, semop, semtimedop, msgsnd, msgrcv) or changing it (the *ctl
 * commands below) is judged by the other-IPC rule at entry: the call
 * completes before the kill, so a shmat maps the segment and the process
 * dies before it returns. Reads of an object's state (IPC_STAT, *_INFO,
 * GETVAL...) stay allowed, as ipcs needs. */
#define NR_shmat 30 /* also backstop_lowmap.h's */
#define NR_shmctl 31
#define NR_semop 65
#define NR_semctl 66
#define NR_msgsnd 69
#define NR_msgrcv 70
#define NR_msgctl 71
#define NR_semtimedop 220
#define IPC_64_ 0x100
#define NR_mq_timedsend 242
#define NR_mq_timedreceive 243
#define NR_mq_notify 244
#define MQUEUE_MAGIC_ 0x19800202

/* ipc_ctl_changes: a *ctl command that removes or changes the object. */
static __always_inline bool ipc_ctl_changes(long nr, __u64 cmd)
{
	cmd &= ~(__u64)IPC_64_;
	if (cmd == 0 || cmd == 1) /* IPC_RMID, IPC_SET */
		return true;
	if (nr == NR_semctl)
		return cmd == 16 || cmd == 17; /* SETVAL, SETALL */
	if (nr == NR_shmctl)
		return cmd == 11 || cmd == 12; /* SHM_LOCK, SHM_UNLOCK */
	return false;
}

/* ipc_foreign returns whether the object the call names was not created by
 * the sandbox rooted at root; *creator is its creator's tgid when known. */
static __always_inline bool ipc_foreign(long nr, struct pt_regs *regs, __u64 root, __u32 *creator)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
	struct ipc_obj_key k = {
		.kind = (nr == NR_shmat || nr == NR_shmctl) ? IPC_KIND_SHM :
			(nr == NR_msgsnd || nr == NR_msgrcv || nr == NR_msgctl) ? IPC_KIND_MSG : IPC_KIND_SEM,
		.ns = BPF_CORE_READ(task, nsproxy, ipc_ns, ns.inum),
		.obj = (__u64)(__u32)BPF_CORE_READ(regs, di),
	};
	if (nr == NR_mq_timedsend || nr == NR_mq_timedreceive || nr == NR_mq_notify) {
		/* A POSIX message queue, by the descriptor's inode. */
		struct file *f = pw_fd_file((long)BPF_CORE_READ(regs, di));
		struct inode *inode = f ? BPF_CORE_READ(f, f_inode) : NULL;
		if (!inode || BPF_CORE_READ(inode, i_sb, s_magic) != MQUEUE_MAGIC_)
			return false; /* not a queue: the kernel fails the call */
		k.kind = IPC_KIND_MQUEUE;
		k.obj = BPF_CORE_READ(inode, i_ino);
	}
	struct ipc_obj *o = bpf_map_lookup_elem(&ipc_objects, &k);
	if (o && o->sandbox_cg == root)
		return false;
	*creator = o ? o->tgid : 0;
	return true;
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

/* fill_strings records the paths and names a syscall's arguments point to,
 * as the caller passed them, plus the cwd when a path is relative. */
static __always_inline void fill_strings(struct scratch *s, struct syscall_event *e, long nr, __u64 *a)
{
	const char *target = NULL, *aux = NULL, *fstype = NULL;
	long fd = -1;

	switch (nr) {
	case 165: /* mount(source, target, fstype, flags, data) */
		target = (const char *)a[1];
		aux = (const char *)a[0];
		fstype = (const char *)a[2];
		break;
	case 166: /* umount2(target, flags) */
	case 161: /* chroot(path) */
	case 155: /* pivot_root(new_root, put_old) */
		target = (const char *)a[0];
		break;
	case 429: /* move_mount(from_dfd, from_path, to_dfd, to_path, flags) */
		target = (const char *)a[3];
		aux = (const char *)a[1];
		break;
	case 428: /* open_tree(dfd, path, flags) */
	case 442: /* mount_setattr(dfd, path, flags, attr, size) */
		target = (const char *)a[1];
		break;
	case 430: /* fsopen(fs_name, flags) */
		fstype = (const char *)a[0];
		break;
	case 175: /* init_module(image, len, params) */
		aux = (const char *)a[2];
		break;
	case NR_finit_module: /* finit_module(fd, params, flags) */
		fd = a[0];
		aux = (const char *)a[1];
		break;
	case NR_kexec_file_load: /* kexec_file_load(kernel_fd, initrd_fd, cmdline_len, cmdline, flags) */
		fd = a[0];
		break;
	}
	if (target)
		bpf_probe_read_user_str(e->str, sizeof(e->str), target);
	if (fd >= 0) {
		struct file *f = pw_fd_file(fd);
		if (f) {
			pw_resolve_file(&s->pw, f);
			bpf_probe_read_kernel_str(e->str, sizeof(e->str), s->pw.buf);
		}
	}
	if (fstype)
		bpf_probe_read_user_str(e->fstype, sizeof(e->fstype), fstype);
	if (target && e->str[0] != '/' && e->str[0] != 0) {
		/* Relative target: record the cwd so the agent can undo. */
		struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
		struct path root = BPF_CORE_READ(task, fs, root);
		struct path pwd = BPF_CORE_READ(task, fs, pwd);
		pw_resolve(&s->pw, &pwd, &root);
		bpf_probe_read_kernel_str(e->aux, sizeof(e->aux), s->pw.buf);
	} else if (aux) {
		bpf_probe_read_user_str(e->aux, sizeof(e->aux), aux);
	}
}

static __always_inline __u32 target_of(long nr, __u64 *a)
{
	switch (nr) {
	case 101: /* ptrace(request, pid, ...) */
		return (__u32)a[1];
	case 310: case 311: /* process_vm_*(pid, ...) */
		return (__u32)a[0];
	case NR_pidfd_getfd:
		return pidfd_pid(a[0]);
	}
	return 0;
}

/* emit_syscall sends a syscall event, without its strings when all are
 * empty (SYSCALL_EVENT_COMPACT). */
static __always_inline void emit_syscall(struct syscall_event *e)
{
	if (e->str[0] || e->aux[0] || e->fstype[0]) {
		struct syscall_event *out = reserve_event(sizeof(*out), true);
		if (out) {
			__builtin_memcpy(out, e, sizeof(*out));
			submit_event(out, true);
		}
		return;
	}
	struct syscall_event *out = reserve_event(SYSCALL_EVENT_COMPACT, true);
	if (out) {
		__builtin_memcpy(out, e, SYSCALL_EVENT_COMPACT);
		submit_event(out, true);
	}
}

static __always_inline bool judge_file(struct file *file, __u32 ops, long nr, __u64 root,
				       struct sandbox *sb);

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

#define TS_COMPAT 0x0002            /* arch/x86: a 32-bit syscall is running */
#define X32_SYSCALL_BIT 0x40000000
#define COMPAT_NR_BASE 0x10000      /* event nr of i386 syscall n: BASE + n */
#define NR32_mount 21

static __always_inline bool in_compat_syscall(long id)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
	return (BPF_CORE_READ(task, thread_info.status) & TS_COMPAT) || (id & X32_SYSCALL_BIT);
}

/* --- Verdict cache ---------------------------------------------------------
 *
 * Judging an open walks its path (pathwalk.h) and matches the rules; most
 * opens of a sandbox are the same files again, allowed. The cache keeps
 * those "nothing to do" verdicts so a repeated open costs one lookup.
 *
 * A verdict depends on the name the file was reached by, so only files
 * whose inode has one name are cached: regular files with i_nlink == 1 and
 * directories, on filesystems whose names change only through local
 * operations on this kernel (ext2/3/4, xfs, tmpfs: no btrfs, whose
 * snapshots copy inode numbers and generations, no network, FUSE or
 * overlay filesystems). The key holds the inode (dev, ino, generation),
 * the mount (mnt_id_unique: never reused, unlike mnt_id), the task's root
 * (its mount and directory inode: paths are relative to it), the sandbox
 * and the access asked.
 *
 * An entry is valid while two generations are those it was stored under:
 * - rules (VC_RULES_GEN, written by the agent only): odd while a rule set
 *   is being written or while the cache is off (0 until an agent set it),
 *   so a half-written table never produces entries;
 * - names (VC_NAME_GEN, bumped here only): every change of a directory's
 *   ctime, from any task, syscall, io_uring request or kernel thread (an
 *   entry added, removed or renamed: rename, link, unlink, rmdir, ...;
 *   filesystems update the directories before the dcache shows the new
 *   name), and every mount-family syscall of any task, native or 32-bit,
 *   at entry and exit; while one runs (VC_BUSY) nothing is cached.
 * The generations are read before anything else, so a change that lands
 * during a judgement makes its entry stale at once.
 *
 * Only allowed, unrecorded verdicts are cached: a match still walks the
 * path (the event names it).
 */
#define S_IFMT_ 00170000
#define S_IFREG_ 0100000
#define S_IFDIR_ 0040000
#define S_IFLNK_ 0120000
#define EXT4_SUPER_MAGIC_ 0xEF53
#define XFS_SUPER_MAGIC_ 0x58465342
#define TMPFS_MAGIC_ 0x01021994

enum vc_ctl {
	VC_RULES_GEN = 0, /* agent-owned */
	VC_NAME_GEN = 1,  /* BPF-owned, atomic */
	VC_BUSY = 2,      /* mount-family syscalls running (BPF, atomic) */
	VC_CTL_MAX = 4,
};

enum vc_stat {
	VC_HITS = 0,
	VC_STORES = 1,
	VC_STAT_MAX = 4,
};

struct vc_key {
	__u64 ino;
	__u64 mnt;      /* mnt_id_unique of the file's mount */
	__u64 root_mnt; /* mnt_id_unique of the task root's mount */
	__u64 root_ino; /* the task root's directory */
	__u32 dev;
	__u32 generation; /* i_generation */
	__u32 sandbox_id;
	__u32 ops;
};

struct vc_entry {
	__u64 rules_gen;
	__u64 name_gen;
};

const struct vc_key *unused_vc_key __attribute__((unused));
const struct vc_entry *unused_vc_entry __attribute__((unused));

BS_MAP(bs_vcache, BPF_MAP_TYPE_LRU_HASH, struct vc_key, struct vc_entry, 16384);
BS_MAP(bs_vcache_ctl, BPF_MAP_TYPE_ARRAY, __u32, __u64, VC_CTL_MAX);

/* Hits and stores per CPU (tests check the cache is used). */
BS_MAP(bs_vcache_stats, BPF_MAP_TYPE_PERCPU_ARRAY, __u32, __u64, VC_STAT_MAX);

/* The key and generations of the open being judged, kept in map memory
 * across judge_file: a flag on the stack would double the states the
 * verifier explores there. */
struct vc_pending {
	struct vc_key k;
	struct vc_entry gens;
	__u32 ok;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct vc_pending);
} bs_vcache_pending SEC(".maps");

static __always_inline struct vc_pending *vc_pending(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&bs_vcache_pending, &zero);
}

/* Set while this task runs a mount-family syscall (its share of VC_BUSY). */
BS_TASK_STORAGE(bs_vcache_busy, __u32);

static __always_inline __u64 *vc_ctl(__u32 i)
{
	return bpf_map_lookup_elem(&bs_vcache_ctl, &i);
}

static __always_inline void vc_count(__u32 i)
{
	__u64 *n = bpf_map_lookup_elem(&bs_vcache_stats, &i);
	if (n)
		*n += 1;
}

static __always_inline void vc_bump_names(void)
{
	__u64 *g = vc_ctl(VC_NAME_GEN);
	if (g)
		__sync_fetch_and_add(g, 1);
}

/* The mount-family syscalls (they move, detach or cover mounts, or change
 * a root), by table: i386 numbers when i386, else x86_64 (x32 too). */
static __always_inline bool vc_mount_syscall(long id, bool compat)
{
	if (compat && !(id & X32_SYSCALL_BIT)) {
		switch (id) {
		case 21: case 22: case 52: case 61: case 217: /* mount umount umount2 chroot pivot_root */
		case 428: case 429: case 432: case 442: case 467: /* open_tree move_mount fsmount mount_setattr open_tree_attr */
			return true;
		}
		return false;
	}
	switch (id & ~X32_SYSCALL_BIT) {
	case 155: case 161: case 165: case 166: /* pivot_root chroot mount umount2 */
	case 428: case 429: case 432: case 442: case 467:
		return true;
	}
	return false;
}

static __always_inline void vc_mount_enter(void)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
	__u32 *busy = bpf_task_storage_get(&bs_vcache_busy, task, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	__u64 *b = vc_ctl(VC_BUSY);
	if (busy && b && !*busy) {
		*busy = 1;
		__sync_fetch_and_add(b, 1);
	}
	vc_bump_names();
}

static __always_inline void vc_mount_exit(void)
{
	vc_bump_names();
	struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
	__u32 *busy = bpf_task_storage_get(&bs_vcache_busy, task, 0, 0);
	__u64 *b = vc_ctl(VC_BUSY);
	if (busy && b && *busy) {
		*busy = 0;
		__sync_fetch_and_add(b, -1);
	}
}

static __always_inline __u64 vc_mnt_id(struct vfsmount *vm)
{
	struct mount *m = (struct mount *)((void *)vm - bpf_core_field_offset(struct mount, mnt));
	return BPF_CORE_READ(m, mnt_id_unique);
}

/* vc_prepare fills the key of an open's file and the generations now;
 * false when the verdict may not be cached. */
static __always_inline bool vc_prepare(struct file *file, __u32 ops, struct sandbox *sb, struct vc_key *k,
				       struct vc_entry *gens)
{
	if (!bpf_core_field_exists(struct mount, mnt_id_unique))
		return false; /* Linux < 6.8: mount ids are reused */
	__u64 *rg = vc_ctl(VC_RULES_GEN), *ng = vc_ctl(VC_NAME_GEN), *busy = vc_ctl(VC_BUSY);
	if (!rg || !ng || !busy)
		return false;
	gens->rules_gen = *(volatile __u64 *)rg;
	gens->name_gen = *(volatile __u64 *)ng;
	/* Odd: off or rules being written; 0: never set by an agent. */
	if ((gens->rules_gen & 1) || !gens->rules_gen || *(volatile __u64 *)busy)
		return false;
	struct inode *inode = BPF_CORE_READ(file, f_inode);
	__u32 mode = BPF_CORE_READ(inode, i_mode) & S_IFMT_;
	if (mode == S_IFREG_) {
		if (BPF_CORE_READ(inode, __i_nlink) != 1)
			return false; /* more names than the one judged, or none */
	} else if (mode != S_IFDIR_) {
		return false;
	}
	struct super_block *isb = BPF_CORE_READ(inode, i_sb);
	unsigned long magic = BPF_CORE_READ(isb, s_magic);
	if (magic != EXT4_SUPER_MAGIC_ && magic != XFS_SUPER_MAGIC_ && magic != TMPFS_MAGIC_)
		return false;
	struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
	struct path root = BPF_CORE_READ(task, fs, root);
	k->ino = BPF_CORE_READ(inode, i_ino);
	k->mnt = vc_mnt_id(BPF_CORE_READ(file, f_path.mnt));
	k->root_mnt = vc_mnt_id(root.mnt);
	k->root_ino = BPF_CORE_READ(root.dentry, d_inode, i_ino);
	k->dev = BPF_CORE_READ(isb, s_dev);
	k->generation = BPF_CORE_READ(inode, i_generation);
	k->sandbox_id = sb->id;
	k->ops = ops;
	return true;
}

/* vc_hit reports whether k has an entry valid under gens. */
static __always_inline bool vc_hit(struct vc_key *k, struct vc_entry *gens)
{
	struct vc_entry *e = bpf_map_lookup_elem(&bs_vcache, k);
	if (!e || e->rules_gen != gens->rules_gen || e->name_gen != gens->name_gen)
		return false;
	vc_count(VC_HITS);
	return true;
}

/* vc_store_pending keeps the allowed verdict of the pending open, when it
 * was cacheable and its walk (in the scratch) reached the task's root by
 * dentries that all have names. */
static __always_inline void vc_store_pending(void)
{
	struct vc_pending *vp = vc_pending();
	struct scratch *s = get_scratch();
	if (!vp || !s || !vp->ok)
		return;
	if (s->pw.flags & (PW_F_TRUNCATED | PW_F_DETACHED | PW_F_DISCONNECTED))
		return;
	if (!bpf_map_update_elem(&bs_vcache, &vp->k, &vp->gens, BPF_ANY))
		vc_count(VC_STORES);
}

/* compat_enter judges a 32-bit syscall: refused outright (CAT_COMPAT), or
 * by its i386 number. Sent at once (no return value): the pending slot and
 * sys_exit speak the x86_64 table. */
static __always_inline int compat_enter(struct pt_regs *regs, long id)
{
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb)
		return 0;
	__u32 rule_id = 0, cat = CAT_COMPAT;
	__u32 action = sandbox_category(sb->id, CAT_COMPAT, &rule_id);
	if (!action && (unsigned long)id < MAX_SYSCALLS) {
		__u32 nr = id;
		struct syscall_rule *r = bpf_map_lookup_elem(&bs_syscall_rules32, &nr);
		if (!r || !r->action)
			return 0;
		action = sandbox_rule(sb->id, SBR_SYSCALL32 | nr, &rule_id);
		cat = CAT_NONE;
	}
	if (action == ACTION_ALLOW)
		return 0;
	__u32 verdict = backstop_verdict(sb, action);
	if (verdict == VERDICT_KILLED)
		bpf_send_signal(SIGKILL);
	if (id == NR32_mount) {
		/* The mount happens before the kill lands: recorded as a mount,
		 * with its strings and return value, so the agent undoes it. */
		struct scratch *s = get_scratch();
		struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
		struct syscall_event *pe = bpf_task_storage_get(&bs_pending, task, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
		if (s && pe) {
			__builtin_memset(pe, 0, sizeof(*pe));
			fill_hdr(&pe->hdr, EV_KILL_SYSCALL, verdict, rule_id, root, sb);
			pe->nr = 165; /* x86_64 mount: the agent's undo reads it */
			pe->ret = RET_UNKNOWN;
			pe->args[0] = (__u32)BPF_CORE_READ(regs, bx);
			pe->args[1] = (__u32)BPF_CORE_READ(regs, cx);
			pe->args[2] = (__u32)BPF_CORE_READ(regs, dx);
			pe->args[3] = (__u32)BPF_CORE_READ(regs, si);
			pe->args[4] = (__u32)BPF_CORE_READ(regs, di);
			pe->category = cat;
			pe->mnt_ns = current_mnt_ns();
			fill_strings(s, pe, 165, pe->args);
			return 0;
		}
	}
	struct syscall_event *e = reserve_event(SYSCALL_EVENT_COMPACT, true);
	if (!e)
		return 0;
	__builtin_memset(e, 0, SYSCALL_EVENT_COMPACT);
	fill_hdr(&e->hdr, EV_KILL_SYSCALL, verdict, rule_id, root, sb);
	e->nr = COMPAT_NR_BASE + (id & 0xffff);
	e->ret = RET_UNKNOWN;
	/* i386 arguments: ebx, ecx, edx, esi, edi, ebp. */
	e->args[0] = (__u32)BPF_CORE_READ(regs, bx);
	e->args[1] = (__u32)BPF_CORE_READ(regs, cx);
	e->args[2] = (__u32)BPF_CORE_READ(regs, dx);
	e->args[3] = (__u32)BPF_CORE_READ(regs, si);
	e->args[4] = (__u32)BPF_CORE_READ(regs, di);
	e->args[5] = (__u32)BPF_CORE_READ(regs, bp);
	e->category = cat;
	e->mnt_ns = current_mnt_ns();
	submit_event(e, true);
	return 0;
}

SEC("tp_btf/sys_enter")
int BPF_PROG(backstop_sys_enter, struct pt_regs *regs, long id)
{
	bool compat = in_compat_syscall(id);
	if (vc_mount_syscall(id, compat))
		vc_mount_enter(); /* any task: see the verdict cache */
	if (compat)
		return compat_enter(regs, id);
	if ((unsigned long)id >= MAX_SYSCALLS)
		return 0;
	__u32 nr = id;
	struct syscall_rule *r = bpf_map_lookup_elem(&bs_syscall_rules, &nr);
	if (!r || (!r->action && !r->category))
		return 0;
	__u32 cat = r->category, rule_id = 0, target = 0;
	if (cat == CAT_MMAP_EXEC) {
		/* The category's action only turns the check on: the exec
		 * rule matching the file decides. */
		struct file *file = id == NR_mmap ? mmap_exec_file(regs) : mprotect_exec_file(regs);
		__u64 root = 0;
		struct sandbox *sb = file ? current_sandbox(&root) : NULL;
		if (sb && sandbox_rule(sb->id, SBR_CATEGORY | CAT_MMAP_EXEC, &rule_id))
			judge_file(file, OP_EXEC, id, root, sb);
		return 0;
	}

	if (cat) {
		cat = entry_category(cat, id, regs);
		if (!cat)
			return 0;
	}
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb)
		return 0;

	__u32 action;
	if (cat == CAT_OTHER_TASK && signal_nr(id) && target_is_agent(id, regs, &target)) {
		/* The agent: the first process outside the subtree, with a rule
		 * of its own (kill_agent). */
		cat = CAT_SIGNAL_AGENT;
		action = sandbox_category(sb->id, cat, &rule_id);
		if (!action)
			return 0;
	} else if (cat >= CAT_OTHER_TASK) {
		action = sandbox_category(sb->id, cat, &rule_id);
		if (!action)
			return 0;
		switch (cat) {
		case CAT_OTHER_TASK:
			target = subtree_target(id, regs, root);
			if (!target)
				return 0;
			break;
		case CAT_CLOCK_ADJUST:
			if (!clock_adjust_sets(id, regs))
				return 0;
			break;
		case CAT_NAMESPACES:
			if (id == NR_setns && !setns_foreign(BPF_CORE_READ(regs, di), root))
				return 0;
			break;
		case CAT_OTHER_IPC:
			if (!ipc_foreign(id, regs, root, &target))
				return 0;
			break;
		}
		int cap = host_cap_of(id, cat);
		if (cap >= 0 && !host_cap_held(cap))
			return 0;
	} else if (cat) {
		action = sandbox_rule(sb->id, SBR_CATEGORY | cat, &rule_id);
		if (!action)
			return 0;
		if (!category_matches(cat, id, regs, &target))
			return 0;
	} else {
		action = sandbox_rule(sb->id, SBR_SYSCALL | nr, &rule_id);
		int cap = host_cap_of(id, CAT_NONE);
		if (action && cap >= 0 && !host_cap_held(cap))
			return 0;
	}
	if (action == ACTION_ALLOW)
		return 0;
	__u32 verdict = backstop_verdict(sb, action);

	struct scratch *s = get_scratch();
	if (!s)
		return 0;
	/* Filled in place in the task's pending slot; when there is none
	 * (allocation failed), in the scratch, sent at once below. */
	struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
	struct syscall_event *e = bpf_task_storage_get(&bs_pending, task, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	bool stashed = e != NULL;
	if (!e)
		e = &s->ev;
	__builtin_memset(e, 0, sizeof(*e));
	fill_hdr(&e->hdr, EV_KILL_SYSCALL, verdict, rule_id, root, sb);
	e->nr = id;
	e->ret = RET_UNKNOWN;
	e->args[0] = BPF_CORE_READ(regs, di);
	e->args[1] = BPF_CORE_READ(regs, si);
	e->args[2] = BPF_CORE_READ(regs, dx);
	e->args[3] = BPF_CORE_READ(regs, r10);
	e->args[4] = BPF_CORE_READ(regs, r8);
	e->args[5] = BPF_CORE_READ(regs, r9);
	e->category = cat;
	e->mnt_ns = current_mnt_ns();
	e->target_pid = target ? target : target_of(id, e->args);
	fill_strings(s, e, id, e->args);

	if (verdict == VERDICT_KILLED)
		bpf_send_signal(SIGKILL);

	if (!stashed)
		emit_syscall(e); /* cannot stash: send now, without the return value */
	return 0;
}

#define O_CREAT_ 0100
#define O_TRUNC_ 01000
#define FMODE_CREATED_ (1 << 20)

/* open_changed reports whether an open created or truncated its file. The
 * flags of open/openat are registers saved at entry (kernel state); those
 * of openat2 live in user memory, so FMODE_CREATED (set by the kernel) is
 * checked too and a truncation raced past the re-read is left to the
 * inode-change hooks below. */
static __always_inline bool open_changed(long nr, struct pt_regs *regs, unsigned int fmode)
{
	__u64 flags = 0;
	if (fmode & FMODE_CREATED_)
		return true;
	switch (nr) {
	case NR_open:
		flags = BPF_CORE_READ(regs, si);
		break;
	case NR_openat:
		flags = BPF_CORE_READ(regs, dx);
		break;
	case NR_creat:
		return true;
	case NR_openat2: {
		struct open_how *how = (struct open_how *)BPF_CORE_READ(regs, dx);
		bpf_probe_read_user(&flags, sizeof(flags), &how->flags);
		break;
	}
	}
	return flags & (O_CREAT_ | O_TRUNC_);
}

struct cmp_ctx {
	const char *a, *b;
	__u32 differ;
};

static long cmp_step(__u64 i, void *arg)
{
	struct cmp_ctx *c = arg;
	char x = 0, y = 0;
	bpf_probe_read_kernel(&x, 1, c->a + (i & (PW_HALF - 1)));
	bpf_probe_read_kernel(&y, 1, c->b + (i & (PW_HALF - 1)));
	if (x != y) {
		c->differ = 1;
		return 1;
	}
	return x == 0;
}

/* script_open judges the interpreter's open of its script (the name the
 * exec went through) as an exec of the file opened. */
static __always_inline void script_open(struct file *file, long nr, struct pt_regs *regs, __u64 root,
					struct sandbox *sb)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
	struct script_pending *sp = bpf_task_storage_get(&bs_scripts, task, 0, 0);
	if (!sp || !sp->set)
		return;
	struct scratch *s = get_scratch();
	if (!s)
		return;
	const char *upath = (const char *)(nr == NR_open ? BPF_CORE_READ(regs, di) : BPF_CORE_READ(regs, si));
	if (bpf_probe_read_user_str(s->upath, sizeof(s->upath), upath) <= 0)
		return;
	struct cmp_ctx c = { .a = s->upath, .b = sp->name };
	bpf_loop(PW_HALF, cmp_step, &c, 0);
	if (c.differ)
		return;
	sp->set = 0;
	judge_file(file, OP_EXEC, NR_execve, root, sb);
}

static __always_inline bool is_open_nr(long nr)
{
	return nr == NR_openat || nr == NR_open || nr == NR_openat2 || nr == NR_creat ||
	       nr == NR_open_by_handle_at;
}

/* proc_mem_target returns the pid of a /proc/PID/mem file (0 if the file is
 * not one). */
static __always_inline __u32 proc_mem_target(struct file *file, struct inode *inode)
{
	const unsigned char *name = BPF_CORE_READ(file, f_path.dentry, d_name.name);
	char buf[4] = {};
	bpf_probe_read_kernel(buf, sizeof(buf), name);
	if (buf[0] != 'm' || buf[1] != 'e' || buf[2] != 'm' || buf[3] != 0)
		return 0;
	struct proc_inode *pi = (struct proc_inode *)((void *)inode -
						      bpf_core_field_offset(struct proc_inode, vfs_inode));
	struct pid *p = BPF_CORE_READ(pi, pid);
	if (!p)
		return 0;
	int nr = 0;
	bpf_probe_read_kernel(&nr, sizeof(nr), &p->numbers[0].nr);
	return nr > 0 ? nr : 0;
}

/* proc_ptrace_target returns the pid of a /proc/PID file procfs.h judges,
 * else 0. */
static __always_inline __u32 proc_ptrace_target(struct file *file, struct inode *inode)
{
	if (proc_judged_name(BPF_CORE_READ(file, f_path.dentry)) == PROC_NOT_JUDGED)
		return 0;
	struct pid *p = proc_inode_pid(inode);
	if (!p)
		return 0;
	int nr = 0;
	bpf_probe_read_kernel(&nr, sizeof(nr), &p->numbers[0].nr);
	return nr > 0 ? nr : 0;
}

static __always_inline struct path_rule *match_path(struct scratch *s, __u32 sandbox_id)
{
	__u32 len = s->pw.len + 1; /* with the NUL: exact rules match too */
	if (len > RULE_PATH_LEN)
		len = RULE_PATH_LEN;
	s->key.prefixlen = (4 + len) * 8;
	bpf_probe_read_kernel(s->key.path, sizeof(s->key.path), s->pw.buf);
	s->key.sandbox_id = sandbox_id;
	struct path_rule *pr = bpf_map_lookup_elem(&bs_path_rules, &s->key);
	if (pr)
		return pr;
	s->key.sandbox_id = 0;
	return bpf_map_lookup_elem(&bs_path_rules, &s->key);
}

static __always_inline struct path_rule *match_inode(struct inode *inode, __u32 sandbox_id)
{
	struct inode_key k = {
		.ino = BPF_CORE_READ(inode, i_ino),
		.dev = BPF_CORE_READ(inode, i_sb, s_dev),
		.sandbox_id = sandbox_id,
	};
	/* An entry of another file with this number is no entry: the
	 * sandbox's own first, then the every-sandbox one. */
	struct path_rule *pr = bpf_map_lookup_elem(&bs_inode_rules, &k);
	if (pr && same_generation(pr->generation, inode))
		return pr;
	k.sandbox_id = 0;
	pr = bpf_map_lookup_elem(&bs_inode_rules, &k);
	if (pr && same_generation(pr->generation, inode))
		return pr;
	return NULL;
}

/* file_ident is what a file event says of the file beside its path. */
struct file_ident {
	__u64 ino;
	__u32 dev;
	__u32 i_mode;
	__u32 f_flags;
	__u32 f_mode;
	__u32 target_pid;
};

/* send_file_event reports a judged file: its identity, and the path the
 * walk resolved into s->pw. */
static __always_inline void send_file_event(struct scratch *s, __u32 verdict, __u32 rule_id, __u64 root,
					    struct sandbox *sb, __s64 nr, __u32 cat, struct file_ident id)
{
	struct file_event *e = reserve_event(sizeof(*e), true);
	if (!e)
		return;
	fill_hdr(&e->hdr, EV_KILL_FILE, verdict, rule_id, root, sb);
	e->nr = nr;
	e->ino = id.ino;
	e->dev = id.dev;
	e->i_mode = id.i_mode;
	e->f_flags = id.f_flags;
	e->f_mode = id.f_mode;
	e->category = cat;
	e->path_flags = s->pw.flags;
	e->target_pid = id.target_pid;
	e->pad = 0;
	bpf_probe_read_kernel_str(e->path, sizeof(e->path), s->pw.buf);
	submit_event(e, true);
}

/* judge_file applies categories, path and inode rules to file for the
 * operations ops (OP_*), and emits and kills on a match. True: the path
 * was walked (flags in the scratch) and nothing applies. */
static __always_inline bool judge_file(struct file *file, __u32 ops, long nr, __u64 root,
				       struct sandbox *sb)
{
	struct inode *inode = BPF_CORE_READ(file, f_inode);
	unsigned long magic = BPF_CORE_READ(inode, i_sb, s_magic);
	__u32 cat = CAT_NONE, action = 0, rule_id = 0, target = 0;

	if ((ops & OP_EXEC) && !BPF_CORE_READ(inode, __i_nlink)) {
		/* No path a rule could name: memfd_create + execveat, or a file
		 * deleted after being opened. */
		cat = CAT_EXEC_FILELESS;
	} else if ((magic == CGROUP2_SUPER_MAGIC || magic == CGROUP_SUPER_MAGIC) && (ops & OP_WRITE)) {
		cat = CAT_CGROUP_WRITE;
	} else if (magic == PROC_SUPER_MAGIC && (ops & (OP_READ | OP_WRITE))) {
		target = proc_mem_target(file, inode);
		if (target && target != (bpf_get_current_pid_tgid() >> 32))
			cat = CAT_PROC_MEM;
	}
	/* Whether a terminal or a process is the sandbox's own changes with
	 * their state (a session, a cgroup move): never cached. */
	bool by_state = false;
	if (!cat && magic == PROC_SUPER_MAGIC && (ops & (OP_READ | OP_WRITE))) {
		__u32 pid = proc_ptrace_target(file, inode);
		if (pid) {
			by_state = true;
			target = st_pid_outside(pid, root);
			if (target)
				cat = CAT_OTHER_TASK; /* the other-processes rule */
		}
	}
	if (!cat && (ops & (OP_READ | OP_WRITE)) &&
	    tty_pts_slave(BPF_CORE_READ(inode, i_mode), BPF_CORE_READ(inode, i_rdev))) {
		by_state = true;
		struct tty_file_private *priv = BPF_CORE_READ(file, private_data);
		struct task_struct *leader = tty_foreign_leader(priv ? BPF_CORE_READ(priv, tty) : NULL);
		if (leader && !st_task_in(leader, root)) {
			cat = CAT_TTY_INJECT; /* the terminals rule */
			target = BPF_CORE_READ(leader, tgid);
		}
	}
	if (cat) {
		action = sandbox_category(sb->id, cat, &rule_id);
		if (!action)
			cat = CAT_NONE;
	}

	struct scratch *s = get_scratch();
	if (!s)
		return false;
	pw_resolve_file(&s->pw, file);
	if (!action) {
		struct path_rule *pr = match_path(s, sb->id);
		if (!pr || !(pr->ops & ops) || !pr->action) {
			/* Another name of a protected file (a hard link into
			 * an allowed place): its inode decides. */
			struct path_rule *ir = match_inode(inode, sb->id);
			if (ir && (ir->ops & ops) && ir->action)
				pr = ir;
		}
		if (!pr || !(pr->ops & ops) || !pr->action)
			return !by_state;
		action = pr->action;
		rule_id = pr->rule_id;
		cat = CAT_PATH;
	}
	__u32 verdict = backstop_verdict(sb, action);
	if (verdict == VERDICT_ALLOWED)
		return cat == CAT_PATH && !by_state;
	if (verdict == VERDICT_KILLED)
		bpf_send_signal(SIGKILL);

	send_file_event(s, verdict, rule_id, root, sb, nr, cat, (struct file_ident){
		.ino = BPF_CORE_READ(inode, i_ino),
		.dev = BPF_CORE_READ(inode, i_sb, s_dev),
		.i_mode = BPF_CORE_READ(inode, i_mode),
		.f_flags = BPF_CORE_READ(file, f_flags),
		.f_mode = BPF_CORE_READ(file, f_mode),
		.target_pid = target,
	});
	return false;
}

/* --- Unix peers -------------------------------------------------------------
 *
 * cgroup/connect_unix judges the path a process passes, before the kernel
 * resolves it: a symlink in the workspace to a host socket (the Docker
 * socket, D-Bus, a resolver's varlink) passes it. Where no LSM unix hook
 * runs, the socket the kernel connected to is judged when connect(2)
 * returns: its peer's bound path, walked like a file's (symlinks and bind
 * mounts already resolved by the kernel), must lie in one of the sandbox's
 * socket paths. After the fact: the connection exists when the process is
 * killed on its way back to user space, so the thread that connected sends
 * nothing, but another thread of the same process could write to the
 * descriptor in between (the layer table says so). Datagrams sent by name
 * (sendto) are delivered before any tracepoint could judge them.
 *
 * bs_unix_paths, per sandbox: an entry with only the sandbox id (prefixlen
 * 32) marks the sandbox as restricted (ops 0); entries with ops OP_CONNECT
 * are the allowed paths (prefix entries end in '/'; exact ones include the
 * NUL). No entry: the sandbox does not restrict unix sockets.
 */
#define OP_CONNECT 8
#define AF_UNIX_ 1
#define S_IFSOCK_ 0140000

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 4096);
	__type(key, struct path_key);
	__type(value, struct path_rule);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} bs_unix_paths SEC(".maps");

static __always_inline void unix_peer_connected(struct pt_regs *regs)
{
	if (!any_category(CAT_UNIX_PEER))
		return;
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb)
		return;
	__u32 cat_rule = 0;
	__u32 action = sandbox_rule(sb->id, SBR_CATEGORY | CAT_UNIX_PEER, &cat_rule);
	if (!action)
		return;
	struct file *file = pw_fd_file((long)BPF_CORE_READ(regs, di));
	if (!file)
		return;
	struct inode *inode = BPF_CORE_READ(file, f_inode);
	if ((BPF_CORE_READ(inode, i_mode) & 00170000) != S_IFSOCK_)
		return;
	struct socket *sock = BPF_CORE_READ(file, private_data);
	struct sock *sk = BPF_CORE_READ(sock, sk);
	if (!sk || BPF_CORE_READ(sk, __sk_common.skc_family) != AF_UNIX_)
		return;
	struct unix_sock *peer = (struct unix_sock *)BPF_CORE_READ((struct unix_sock *)sk, peer);
	if (!peer || !BPF_CORE_READ(peer, addr))
		return; /* unnamed peer (never bound): no name to judge */
	struct scratch *s = get_scratch();
	if (!s)
		return;
	s->key.prefixlen = 32;
	s->key.sandbox_id = sb->id;
	struct path_rule *marker = bpf_map_lookup_elem(&bs_unix_paths, &s->key);
	if (!marker)
		return; /* this sandbox does not restrict unix sockets */
	__u32 rule_id = marker->rule_id;
	struct path p = { .mnt = BPF_CORE_READ(peer, path.mnt), .dentry = BPF_CORE_READ(peer, path.dentry) };
	struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
	struct path troot = BPF_CORE_READ(task, fs, root);
	if (p.dentry) {
		pw_resolve(&s->pw, &p, &troot);
		if (!(s->pw.flags & PW_F_TRUNCATED)) {
			__u32 len = s->pw.len + 1;
			if (len > RULE_PATH_LEN)
				len = RULE_PATH_LEN;
			s->key.prefixlen = (4 + len) * 8;
			bpf_probe_read_kernel(s->key.path, sizeof(s->key.path), s->pw.buf);
			s->key.sandbox_id = sb->id;
			struct path_rule *pr = bpf_map_lookup_elem(&bs_unix_paths, &s->key);
			if (pr && (pr->ops & OP_CONNECT))
				return;
		}
	} else {
		/* Bound, but not in the filesystem: an abstract name. */
		s->pw.buf[0] = '@';
		s->pw.buf[1] = 0;
		s->pw.flags = 0;
	}
	__u32 verdict = backstop_verdict(sb, action);
	if (verdict == VERDICT_ALLOWED)
		return;
	if (verdict == VERDICT_KILLED)
		bpf_send_signal(SIGKILL);
	struct inode *pi = p.dentry ? BPF_CORE_READ(p.dentry, d_inode) : NULL;
	send_file_event(s, verdict, rule_id, root, sb, NR_connect, CAT_UNIX_PEER, (struct file_ident){
		.ino = pi ? BPF_CORE_READ(pi, i_ino) : 0,
		.dev = pi ? BPF_CORE_READ(pi, i_sb, s_dev) : 0,
		.i_mode = S_IFSOCK_,
	});
}

/* complete_pending sends the event sys_enter left for this syscall, with
 * its return value. */
static __always_inline void complete_pending(long nr, long ret)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
	struct syscall_event *pending = bpf_task_storage_get(&bs_pending, task, 0, 0);
	if (!pending || pending->hdr.kind != EV_KILL_SYSCALL || pending->nr != nr)
		return;
	pending->ret = ret;
	emit_syscall(pending);
	pending->hdr.kind = 0; /* sent (or its loss counted): never twice */
}

#include "backstop_lowmap.h"

#define NR_inotify_add_watch 254
static __always_inline void notify_mark_added(struct pt_regs *regs);

SEC("tp_btf/sys_exit")
int BPF_PROG(backstop_sys_exit, struct pt_regs *regs, long ret)
{
	long nr = BPF_CORE_READ(regs, orig_ax);
	bool compat = in_compat_syscall(nr);
	if (vc_mount_syscall(nr, compat))
		vc_mount_exit();
	if (compat) {
		lowmap_compat_exit(regs, nr, ret);
		/* Judged (refused outright or by number) at sys_enter; only an
		 * i386 mount waits for its return value (see compat_enter). */
		if (nr == NR32_mount)
			complete_pending(165, ret); /* stashed as the x86_64 mount */
		return 0;
	}
	if (is_open_nr(nr)) {
		if (nr == NR_open_by_handle_at)
			complete_pending(nr, ret); /* also a syscall rule of its own */
		if (ret < 0)
			return 0;
		__u64 root = 0;
		struct sandbox *sb = current_sandbox(&root);
		if (!sb)
			return 0;
		struct file *file = pw_fd_file(ret);
		if (!file)
			return 0;
		unsigned int fmode = BPF_CORE_READ(file, f_mode);
		if (fmode & FMODE_PATH)
			return 0; /* O_PATH: no access; a reopen is judged itself */
		__u32 ops = ((fmode & FMODE_READ) ? OP_READ : 0) | ((fmode & FMODE_WRITE) ? OP_WRITE : 0);
		/* O_TRUNC and O_CREAT change the file whatever the access mode
		 * (the kernel clears them from f_flags): a write. */
		if (open_changed(nr, regs, fmode))
			ops |= OP_WRITE;
		struct vc_pending *vp = vc_pending();
		if (!vp)
			return 0;
		vp->ok = vc_prepare(file, ops, sb, &vp->k, &vp->gens);
		if (!vp->ok || !vc_hit(&vp->k, &vp->gens)) {
			if (judge_file(file, ops, nr, root, sb))
				vc_store_pending();
		}
		script_open(file, nr, regs, root, sb);
		return 0;
	}
	if (nr == NR_connect && ret == 0)
		unix_peer_connected(regs);
	if (nr == NR_inotify_add_watch && ret >= 0)
		notify_mark_added(regs);
	if (nr == NR_mmap || nr == NR_mremap || nr == NR_shmat)
		lowmap_exit(nr, ret);
	if ((unsigned long)nr >= MAX_SYSCALLS)
		return 0;
	__u32 n = nr;
	struct syscall_rule *r = bpf_map_lookup_elem(&bs_syscall_rules, &n);
	if (!r || (!r->action && !r->category))
		return 0;
	struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
	struct syscall_event *pending = bpf_task_storage_get(&bs_pending, task, 0, 0);
	if (!pending || pending->hdr.kind != EV_KILL_SYSCALL || pending->nr != nr)
		return 0;
	pending->ret = ret;
	emit_syscall(pending);
	pending->hdr.kind = 0; /* sent (or its loss counted): never twice */
	return 0;
}

/* sched_prepare_exec runs before the new image replaces the old one: a kill
 * here means the exec'd program never runs. Optional: Linux >= 6.10. */
SEC("tp_btf/sched_prepare_exec")
int BPF_PROG(backstop_prepare_exec, struct task_struct *task, struct linux_binprm *bprm)
{
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb)
		return 0;
	struct file *file = BPF_CORE_READ(bprm, file);
	if (!file)
		return 0;
	judge_file(file, OP_EXEC, NR_execve, root, sb);
	/* A script: the kernel runs its interpreter (bprm->interp changed),
	 * which opens the script by the name the exec went through. */
	const char *fname = BPF_CORE_READ(bprm, filename);
	const char *interp = BPF_CORE_READ(bprm, interp);
	struct script_pending *sp = bpf_task_storage_get(&bs_scripts, task, 0,
							 fname != interp ? BPF_LOCAL_STORAGE_GET_F_CREATE : 0);
	if (!sp)
		return 0;
	sp->set = 0;
	if (fname != interp && bpf_probe_read_kernel_str(sp->name, sizeof(sp->name), fname) > 0)
		sp->set = 1;
	return 0;
}

/* io_uring_submit_req runs before the request is issued, in the submitter
 * or its SQPOLL thread (same process and cgroup). Only reached when the
 * policy allows io_uring_setup. Optional: Linux >= 6.4 signature. */
SEC("tp_btf/io_uring_submit_req")
int BPF_PROG(backstop_io_uring_submit, struct io_kiocb *req)
{
	__u8 op = BPF_CORE_READ(req, opcode);
	if (op != IORING_OP_OPENAT && op != IORING_OP_OPENAT2)
		return 0;
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb)
		return 0;
	__u32 rule_id = 0;
	__u32 action = sandbox_category(sb->id, CAT_IO_URING_OPEN, &rule_id);
	if (!action)
		return 0;
	__u32 verdict = backstop_verdict(sb, action);
	if (verdict == VERDICT_ALLOWED)
		return 0;
	if (verdict == VERDICT_KILLED)
		bpf_send_signal(SIGKILL);
	/* No strings: only the compact part is reserved and written. */
	struct syscall_event *e = reserve_event(SYSCALL_EVENT_COMPACT, true);
	if (!e)
		return 0;
	__builtin_memset(e, 0, SYSCALL_EVENT_COMPACT);
	fill_hdr(&e->hdr, EV_KILL_SYSCALL, verdict, rule_id, root, sb);
	e->nr = NR_io_uring_enter;
	e->ret = RET_UNKNOWN;
	e->args[0] = op;
	e->category = CAT_IO_URING_OPEN;
	e->mnt_ns = current_mnt_ns();
	submit_event(e, true);
	return 0;
}

/* cgroup_sandbox returns the sandbox root id cg is in (0 for none), outermost
 * first like lookup_sandbox_cg. */
static __always_inline __u64 cgroup_sandbox(struct cgroup *cg, struct sandbox **out)
{
	int level = BPF_CORE_READ(cg, level);
	for (int i = 1; i <= MAX_CGROUP_DEPTH; i++) {
		if (i > level)
			break;
		struct cgroup *anc = NULL;
		bpf_probe_read_kernel(&anc, sizeof(anc), &cg->ancestors[i]);
		if (!anc)
			break;
		__u64 id = BPF_CORE_READ(anc, kn, id);
		struct sandbox *s = bpf_map_lookup_elem(&sandboxes, &id);
		if (s) {
			*out = s;
			return id;
		}
	}
	return 0;
}

/* kill_task kills another task's process (bpf_send_signal_task, Linux >=
 * 6.13); false where this kernel lacks it. */
static __always_inline bool kill_task(struct task_struct *t)
{
	if (!bpf_ksym_exists(bpf_send_signal_task))
		return false;
	bpf_send_signal_task(t, SIGKILL, PIDTYPE_TGID, 0);
	return true;
}

/* fork_judged applies the fork-time checks on the new task, from kernel
 * state (the clone arguments in user memory may have changed since any
 * check at sys_enter): a child of a sandboxed parent that starts outside
 * the sandbox (clone3 CLONE_INTO_CGROUP), or a new process sharing the
 * parent's file table. Both are killed before they run, the parent too. */
static __always_inline void fork_judged(struct task_struct *parent, struct task_struct *child,
					 __u64 child_sb)
{
	__u64 root = 0;
	struct sandbox *psb = current_sandbox(&root);
	if (!psb)
		return;
	__u32 cat = CAT_NONE;
	if (child_sb != root)
		cat = CAT_CGROUP_ESCAPE;
	else if (BPF_CORE_READ(child, files) == BPF_CORE_READ(parent, files) &&
		 BPF_CORE_READ(child, tgid) != BPF_CORE_READ(parent, tgid))
		cat = CAT_CLONE_FILES;
	if (!cat)
		return;
	__u32 rule_id = 0;
	__u32 action = sandbox_category(psb->id, cat, &rule_id);
	if (cat == CAT_CGROUP_ESCAPE && !action)
		action = ACTION_RECORD; /* leaving the sandbox is always an alert */
	if (!action)
		return;
	__u32 verdict = backstop_verdict(psb, action);
	if (verdict == VERDICT_KILLED) {
		if (!kill_task(child) && cat == CAT_CGROUP_ESCAPE)
			verdict = VERDICT_RECORDED;
		bpf_send_signal(SIGKILL);
	}
	if (cat == CAT_CGROUP_ESCAPE) {
		struct cgroup_event *e = reserve_event(sizeof(*e), true);
		if (!e)
			return;
		fill_hdr(&e->hdr, EV_KILL_CGROUP, verdict, rule_id, root, psb);
		struct cgroup *cg = BPF_CORE_READ(child, cgroups, dfl_cgrp);
		e->dst_cgroup = BPF_CORE_READ(cg, kn, id);
		e->from_sandbox = root;
		e->moved_pid = BPF_CORE_READ(child, tgid);
		e->mover_pid = bpf_get_current_pid_tgid() >> 32;
		BPF_CORE_READ_STR_INTO(&e->moved_comm, child, comm);
		__builtin_memcpy(e->dst_path, "(created there: clone3 CLONE_INTO_CGROUP)", 42);
		submit_event(e, true);
		return;
	}
	struct syscall_event *e = reserve_event(SYSCALL_EVENT_COMPACT, true);
	if (!e)
		return;
	__builtin_memset(e, 0, SYSCALL_EVENT_COMPACT);
	fill_hdr(&e->hdr, EV_KILL_SYSCALL, verdict, rule_id, root, psb);
	e->nr = NR_clone3;
	e->ret = BPF_CORE_READ(child, tgid);
	e->category = cat;
	e->target_pid = BPF_CORE_READ(child, tgid);
	e->mnt_ns = current_mnt_ns();
	submit_event(e, true);
}

/* A child inherits its parent's sandbox; with CLONE_INTO_CGROUP it may start
 * elsewhere, so the child's own cgroup decides. */
SEC("tp_btf/sched_process_fork")
int BPF_PROG(backstop_fork, struct task_struct *parent, struct task_struct *child)
{
	struct cgroup *cg = BPF_CORE_READ(child, cgroups, dfl_cgrp);
	struct sandbox *sb = NULL;
	__u64 sbcg = cgroup_sandbox(cg, &sb);
	fork_judged(parent, child, sbcg);
	if (!sbcg || !sb)
		return 0;
	struct task_sandbox *ts = bpf_task_storage_get(&bs_tasks, child, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (ts) {
		ts->sandbox_cg = sbcg;
		ts->sandbox_id = sb->id;
	}
	return 0;
}

SEC("tp_btf/cgroup_attach_task")
int BPF_PROG(backstop_cgroup_attach, struct cgroup *dst, const char *path, struct task_struct *task,
	     bool threadgroup)
{
	/* Only the default (v2) hierarchy defines sandboxes. */
	if (BPF_CORE_READ(dst, root, hierarchy_id) != 0)
		return 0;
	struct sandbox *dsb = NULL;
	__u64 dst_sb = cgroup_sandbox(dst, &dsb);
	struct task_sandbox *ts = bpf_task_storage_get(&bs_tasks, task, 0,
						       dst_sb ? BPF_LOCAL_STORAGE_GET_F_CREATE : 0);
	if (!ts)
		return 0;
	__u64 from = ts->sandbox_cg;
	__u32 from_id = ts->sandbox_id;
	ts->sandbox_cg = dst_sb;
	ts->sandbox_id = dsb ? dsb->id : 0;
	if (!from || from == dst_sb)
		return 0;
	/* The agent itself moves tasks when it tears a sandbox down. */
	if (is_agent(bpf_get_current_pid_tgid() >> 32))
		return 0;

	struct sandbox from_sb = { .id = from_id };
	struct sandbox *fsb = bpf_map_lookup_elem(&sandboxes, &from);
	if (fsb)
		from_sb = *fsb;
	__u32 rule_id = 0;
	__u32 action = sandbox_category(from_sb.id, CAT_CGROUP_ESCAPE, &rule_id);
	if (!action)
		action = ACTION_RECORD; /* a move out is always an alert */
	__u32 verdict = backstop_verdict(&from_sb, action);
	if (verdict == VERDICT_KILLED) {
		__u32 task_tgid = BPF_CORE_READ(task, tgid);
		if (task_tgid == (bpf_get_current_pid_tgid() >> 32))
			bpf_send_signal(SIGKILL);
		else if (bpf_ksym_exists(bpf_send_signal_task))
			bpf_send_signal_task(task, SIGKILL, PIDTYPE_TGID, 0);
		else
			verdict = VERDICT_RECORDED; /* cannot signal another task here */
	}
	struct cgroup_event *e = reserve_event(sizeof(*e), true);
	if (!e)
		return 0;
	fill_hdr(&e->hdr, EV_KILL_CGROUP, verdict, rule_id, from, &from_sb);
	e->dst_cgroup = BPF_CORE_READ(dst, kn, id);
	e->from_sandbox = from;
	e->moved_pid = BPF_CORE_READ(task, tgid);
	e->mover_pid = bpf_get_current_pid_tgid() >> 32;
	BPF_CORE_READ_STR_INTO(&e->moved_comm, task, comm);
	if (path)
		bpf_probe_read_kernel_str(e->dst_path, sizeof(e->dst_path), path);
	else
		e->dst_path[0] = 0;
	submit_event(e, true);
	return 0;
}

/* --- Changes of inodes outside writable places ----------------------------
 *
 * truncate, chmod, chown, setxattr, utimensat, link, unlink, rename,
 * symlink, mknod, mkdir and O_TRUNC all set the changed inode's ctime (the
 * directory's for entries added or removed), whatever the syscall, entry
 * point or name used. Judged on the inode: the deepest bs_dirs entry among
 * its dentry's ancestors decides, by inode number, so every name of a file
 * is judged alike. Stopped after the fact: the change is made when the
 * process dies.
 */

#define PIPEFS_MAGIC 0x50495045
#define SOCKFS_MAGIC 0x534F434B
#define SYSFS_MAGIC 0x62656572
#define DEVPTS_SUPER_MAGIC 0x1cd1
#define BPF_FS_MAGIC 0xcafe4a11
#define TRACEFS_MAGIC 0x74726163
#define DEBUGFS_MAGIC 0x64626720
#define NSFS_MAGIC 0x6e736673
#define SECURITYFS_MAGIC 0x73636673
#define OVERLAYFS_SUPER_MAGIC 0x794c7630

struct dir_walk {
	struct dentry *d;
	__u32 dev;
	__u32 sandbox_id;
	struct dir_rule found;
	__u32 hit;
};

static long dir_walk_step(__u64 i, void *arg)
{
	struct dir_walk *w = arg;
	struct dentry *d = w->d;
	if (!d)
		return 1;
	struct inode *inode = BPF_CORE_READ(d, d_inode);
	struct dir_key k = {
		.ino = BPF_CORE_READ(inode, i_ino),
		.dev = w->dev,
		.sandbox_id = w->sandbox_id,
	};
	/* An entry of another file with this number is no entry. */
	struct dir_rule *r = bpf_map_lookup_elem(&bs_dirs, &k);
	if (r && !same_generation(r->generation, inode))
		r = NULL;
	if (!r) {
		k.sandbox_id = 0; /* rules of every sandbox */
		r = bpf_map_lookup_elem(&bs_dirs, &k);
		if (r && !same_generation(r->generation, inode))
			r = NULL;
	}
	if (r) {
		w->found = *r;
		w->hit = 1;
		return 1;
	}
	struct dentry *parent = BPF_CORE_READ(d, d_parent);
	if (parent == d)
		return 1;
	w->d = parent;
	return 0;
}

static __always_inline void inode_changed(struct inode *inode)
{
	/* A directory changed (an entry added, removed or renamed), on any
	 * filesystem and by any task: names may have changed. One without a
	 * dentry is being set up (read from disk, a new /proc entry): no path
	 * runs through it yet. */
	if ((BPF_CORE_READ(inode, i_mode) & S_IFMT_) == S_IFDIR_ && BPF_CORE_READ(inode, i_dentry.first))
		vc_bump_names();
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb)
		return;
	/* Overridden credentials: a filesystem acting for the task on a layer
	 * below (overlayfs writing its upper directory). The change is judged
	 * on the inode the task sees (overlayfs copies the times up). */
	struct task_struct *cur = (struct task_struct *)bpf_get_current_task_btf();
	if (BPF_CORE_READ(cur, cred) != BPF_CORE_READ(cur, real_cred))
		return;
	__u32 mode = BPF_CORE_READ(inode, i_mode) & S_IFMT_;
	if (mode != S_IFREG_ && mode != S_IFDIR_ && mode != S_IFLNK_)
		return;
	if (!BPF_CORE_READ(inode, __i_nlink))
		return; /* unlinked (memfd, O_TMPFILE, deleted): the directory's change decides */
	struct super_block *isb = BPF_CORE_READ(inode, i_sb);
	switch (BPF_CORE_READ(isb, s_magic)) {
	case PROC_SUPER_MAGIC: case SYSFS_MAGIC: case CGROUP_SUPER_MAGIC: case CGROUP2_SUPER_MAGIC:
	case PIPEFS_MAGIC: case SOCKFS_MAGIC: case ANON_INODE_FS_MAGIC: case PIDFS_MAGIC:
	case DEVPTS_SUPER_MAGIC: case BPF_FS_MAGIC: case TRACEFS_MAGIC: case DEBUGFS_MAGIC:
	case NSFS_MAGIC: case SECURITYFS_MAGIC:
		return;
	case OVERLAYFS_SUPER_MAGIC:
		/* Its dentries are not the paths the rules name (a workspace
		 * overlay mounted in the command's own namespace, a container's
		 * root): overlays are judged at open only. */
		return;
	}
	struct dir_walk w = { .dev = BPF_CORE_READ(isb, s_dev), .sandbox_id = sb->id };
	/* Only filesystems mounted where the agent resolved the rules: a
	 * tmpfs a command mounted in its own namespace holds no rule's path. */
	struct dir_key mk = { .dev = w.dev, .sandbox_id = DIR_MOUNTED_SB };
	if (!bpf_map_lookup_elem(&bs_dirs, &mk))
		return;
	struct hlist_node *first = BPF_CORE_READ(inode, i_dentry.first);
	if (!first)
		return;
	w.d = (struct dentry *)((void *)first - bpf_core_field_offset(struct dentry, d_u.d_alias));
	struct dentry *start = w.d;
	bpf_loop(PW_MAX_STEPS, dir_walk_step, &w, 0);
	if (!w.hit) {
		/* The sandbox's write default. */
		struct dir_key dk = { .sandbox_id = sb->id };
		struct dir_rule *r = bpf_map_lookup_elem(&bs_dirs, &dk);
		if (!r)
			return;
		w.found = *r;
	}
	if (w.found.kind == DIR_WRITABLE || !w.found.action)
		return;
	__u32 verdict = backstop_verdict(sb, w.found.action);
	if (verdict == VERDICT_ALLOWED)
		return;
	if (verdict == VERDICT_KILLED)
		bpf_send_signal(SIGKILL);
	struct scratch *s = get_scratch();
	if (!s)
		return;
	struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
	struct path fp = { .dentry = start, .mnt = NULL };
	struct path troot = BPF_CORE_READ(task, fs, root);
	pw_resolve(&s->pw, &fp, &troot);
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task);
	__s64 nr = regs ? BPF_CORE_READ(regs, orig_ax) : -1;
	if (in_compat_syscall(nr))
		nr += COMPAT_NR_BASE;
	send_file_event(s, verdict, w.found.rule_id, root, sb, nr, CAT_MODIFY, (struct file_ident){
		.ino = BPF_CORE_READ(inode, i_ino),
		.dev = w.dev,
		.i_mode = BPF_CORE_READ(inode, i_mode),
	});
}

/* --- inotify marks outside the sandbox's writable places -------------------
 *
 * A mark tells when a file is opened, read or written and which names are
 * made in a directory. Without the LSM's path_notify hook, the mark
 * inotify_add_watch just added (the head of its group's list) is judged
 * when the call returns, on its inode, by the walk above: a mark outside
 * the writable places kills the caller, and the mark dies with its inotify
 * descriptor (unless the descriptor was passed on first). */
#define FSNOTIFY_OBJ_TYPE_INODE_ 0

/* mark_inode is the inode a mark's connector is attached to, checked
 * against the inode's own pointer to that connector (the connector's
 * object is the inode since Linux 6.10, the inode's i_fsnotify_marks
 * before): NULL when neither holds. */
static __always_inline struct inode *mark_inode(struct fsnotify_mark_connector *conn)
{
	void *obj = BPF_CORE_READ(conn, obj);
	if (!obj)
		return NULL;
	struct inode *inode = obj;
	if (BPF_CORE_READ(inode, i_fsnotify_marks) == conn)
		return inode;
	void *held = NULL;
	bpf_probe_read_kernel(&held, sizeof(held), obj);
	if (held == conn)
		return (struct inode *)(obj - bpf_core_field_offset(struct inode, i_fsnotify_marks));
	return NULL;
}

static __always_inline void notify_mark_added(struct pt_regs *regs)
{
	if (!any_category(CAT_NOTIFY_MARK))
		return;
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb)
		return;
	__u32 rule_id = 0;
	__u32 action = sandbox_category(sb->id, CAT_NOTIFY_MARK, &rule_id);
	if (!action)
		return;
	struct file *f = pw_fd_file((long)BPF_CORE_READ(regs, di));
	if (!f)
		return;
	struct fsnotify_group *group = BPF_CORE_READ(f, private_data);
	if (!group)
		return;
	struct list_head *first = BPF_CORE_READ(group, marks_list.next);
	if (!first || first == &group->marks_list)
		return;
	struct fsnotify_mark *mark = (struct fsnotify_mark *)((void *)first - bpf_core_field_offset(struct fsnotify_mark, g_list));
	struct fsnotify_mark_connector *conn = BPF_CORE_READ(mark, connector);
	if (!conn || BPF_CORE_READ_BITFIELD_PROBED(conn, type) != FSNOTIFY_OBJ_TYPE_INODE_)
		return;
	struct inode *inode = mark_inode(conn);
	if (!inode)
		return;
	struct super_block *isb = BPF_CORE_READ(inode, i_sb);
	struct dir_walk w = { .dev = BPF_CORE_READ(isb, s_dev), .sandbox_id = sb->id };
	struct hlist_node *alias = BPF_CORE_READ(inode, i_dentry.first);
	if (!alias)
		return;
	w.d = (struct dentry *)((void *)alias - bpf_core_field_offset(struct dentry, d_u.d_alias));
	struct dentry *start = w.d;
	/* Only filesystems mounted where the agent resolved the rules (as
	 * for changes: a tmpfs of the command's own holds no rule's path). */
	struct dir_key mk = { .dev = w.dev, .sandbox_id = DIR_MOUNTED_SB };
	if (!bpf_map_lookup_elem(&bs_dirs, &mk))
		return;
	bpf_loop(PW_MAX_STEPS, dir_walk_step, &w, 0);
	if (w.hit && w.found.kind == DIR_WRITABLE)
		return;
	__u32 verdict = backstop_verdict(sb, action);
	if (verdict == VERDICT_ALLOWED)
		return;
	if (verdict == VERDICT_KILLED)
		bpf_send_signal(SIGKILL);
	struct scratch *s = get_scratch();
	if (!s)
		return;
	struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
	struct path fp = { .dentry = start, .mnt = NULL };
	struct path troot = BPF_CORE_READ(task, fs, root);
	pw_resolve(&s->pw, &fp, &troot);
	send_file_event(s, verdict, rule_id, root, sb, NR_inotify_add_watch, CAT_NOTIFY_MARK, (struct file_ident){
		.ino = BPF_CORE_READ(inode, i_ino),
		.dev = w.dev,
		.i_mode = BPF_CORE_READ(inode, i_mode),
	});
}

/* Filesystems without multigrain timestamps set ctime here... */
SEC("tp_btf/inode_set_ctime_to_ts")
int BPF_PROG(backstop_ctime_set, struct inode *inode, struct timespec64 *ctime)
{
	inode_changed(inode);
	return 0;
}

/* ...multigrain ones (ext4, xfs, btrfs, tmpfs on Linux >= 6.13) swap it
 * here, or skip the swap when the coarse clock has not moved. */
SEC("tp_btf/ctime_ns_xchg")
int BPF_PROG(backstop_ctime_xchg, struct inode *inode, __u32 old, __u32 new, __u32 cur)
{
	inode_changed(inode);
	return 0;
}

SEC("tp_btf/ctime_xchg_skip")
int BPF_PROG(backstop_ctime_skip, struct inode *inode, struct timespec64 *ctime)
{
	inode_changed(inode);
	return 0;
}

/* --- Signals to the agent, by any route ------------------------------------
 *
 * signal_generate sees every signal the kernel queues, whatever sent it:
 * kill, tgkill, pidfd_send_signal, process groups, kill(-1), SIGIO/SIGURG
 * of a file owner, the SIGSTOP of a ptrace attach. A tracepoint cannot
 * refuse it: the sender is killed, a stop is undone with SIGCONT, and the
 * count per signal lets the agent ignore a termination request it did not
 * get from its operator.
 */
#define SIGNAL_GROUP_EXIT_ 0x4

/* dying: the caller's process is exiting already (killed at sys_enter):
 * one event per refusal. */
static __always_inline bool dying(void)
{
	struct task_struct *cur = (struct task_struct *)bpf_get_current_task_btf();
	return BPF_CORE_READ(cur, signal, flags) & SIGNAL_GROUP_EXIT_;
}

/* send_after is the event of a refusal seen after the fact (a signal
 * queued, a capability granted): the caller is killed, the call done. */
static __always_inline void send_after(struct sandbox *sb, __u64 root, __u32 verdict, __u32 rule_id, __u32 cat,
				       __u64 arg0, __u32 target, long ret)
{
	struct syscall_event *e = reserve_event(SYSCALL_EVENT_COMPACT, true);
	if (!e)
		return;
	__builtin_memset(e, 0, SYSCALL_EVENT_COMPACT);
	fill_hdr(&e->hdr, EV_KILL_SYSCALL, verdict, rule_id, root, sb);
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs((struct task_struct *)bpf_get_current_task_btf());
	e->nr = regs ? BPF_CORE_READ(regs, orig_ax) : -1;
	e->ret = ret;
	e->args[0] = arg0;
	e->category = cat;
	e->target_pid = target;
	e->mnt_ns = current_mnt_ns();
	submit_event(e, true);
}

/* other_signal: a signal a sandboxed process sent (kill, sigqueue,
 * tgkill, pidfd, process groups, kill(-1)) to a process outside its
 * subtree, judged on the task the kernel picked. The signal is queued:
 * the sender is killed after the fact (calls aimed at one process were
 * killed at sys_enter already, also after their one call). Signals the
 * kernel sends (SEND_SIG_NOINFO/PRIV, positive codes: SIGCHLD, a file
 * owner's SIGIO, faults) are not the sender's doing. */
static __always_inline void other_signal(int sig, struct kernel_siginfo *info, struct task_struct *task, int result)
{
	if (sig <= 0 || sig > 64 || (unsigned long)info <= 1 || !any_category(CAT_OTHER_TASK))
		return;
	int code = 1;
	bpf_probe_read_kernel(&code, sizeof(code), (void *)info + bpf_core_field_offset(struct kernel_siginfo, si_code));
	if (code != 0 && code != -1 && code != -6) /* SI_USER, SI_QUEUE, SI_TKILL */
		return;
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	if (!sb || st_task_in(task, root) || dying())
		return;
	__u32 rule_id = 0;
	__u32 action = sandbox_category(sb->id, CAT_OTHER_TASK, &rule_id);
	if (!action)
		return;
	__u32 verdict = backstop_verdict(sb, action);
	if (verdict == VERDICT_KILLED)
		bpf_send_signal(SIGKILL);
	send_after(sb, root, verdict, rule_id, CAT_OTHER_TASK, sig, BPF_CORE_READ(task, tgid), result);
}

SEC("tp_btf/signal_generate")
int BPF_PROG(backstop_signal, int sig, struct kernel_siginfo *info, struct task_struct *task,
	     int group, int result)
{
	__u32 tgid = BPF_CORE_READ(task, tgid);
	if (!is_agent(tgid)) {
		other_signal(sig, info, task, result);
		return 0;
	}
	/* SIGCHLD: the kernel tells a parent (watcher exec's private agent)
	 * that its sandboxed child ended; harmless from any sender. */
	if (sig <= 0 || sig > 64 || sig == 17)
		return 0;
	__u64 root = 0;
	struct sandbox *sb = current_sandbox(&root);
	__u32 signo = sig;
	if (!sb) {
		/* SEND_SIG_NOINFO and SEND_SIG_PRIV (0, 1) fail the read: code 0. */
		int code = 0;
		bpf_probe_read_kernel(&code, sizeof(code), (void *)info + bpf_core_field_offset(struct kernel_siginfo, si_code));
		__u64 *oc = bpf_map_lookup_elem(&bs_operator_signals, &signo);
		if (oc && code <= 0)
			__sync_fetch_and_add(oc, 1);
		return 0;
	}
	__u64 *cnt = bpf_map_lookup_elem(&bs_agent_signals, &signo);
	if (cnt)
		__sync_fetch_and_add(cnt, 1);
	__u32 rule_id = 0;
	__u32 action = sandbox_category(sb->id, CAT_SIGNAL_AGENT, &rule_id);
	if (!action)
		action = ACTION_RECORD;
	__u32 verdict = backstop_verdict(sb, action);
	bool stop = sig == 19 || sig == 20 || sig == 21 || sig == 22;
	/* Both sends go through one per-CPU irq_work here (interrupts are off
	 * under the siglock): for a stop signal, undoing the stop comes first;
	 * its sender (kill-family syscall, ptrace) was killed at sys_enter. */
	if (stop && bpf_ksym_exists(bpf_send_signal_task))
		bpf_send_signal_task(task, 18 /* SIGCONT */, PIDTYPE_TGID, 0);
	else if (verdict == VERDICT_KILLED)
		bpf_send_signal(SIGKILL);
	struct syscall_event *e = reserve_event(SYSCALL_EVENT_COMPACT, true);
	if (!e)
		return 0;
	__builtin_memset(e, 0, SYSCALL_EVENT_COMPACT);
	fill_hdr(&e->hdr, EV_KILL_SYSCALL, verdict, rule_id, root, sb);
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs((struct task_struct *)bpf_get_current_task_btf());
	e->nr = regs ? BPF_CORE_READ(regs, orig_ax) : -1;
	e->ret = result;
	e->args[0] = sig;
	e->args[1] = sig;
	e->args[2] = sig;
	e->category = CAT_SIGNAL_AGENT;
	e->target_pid = tgid;
	e->mnt_ns = current_mnt_ns();
	submit_event(e, true);
	return 0;
}

/* --- Capabilities used, after the check -----------------------------------
 *
 * cap_capable (Linux >= 6.14) fires after every capability check with its
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
