/* Backstop rule, event and per-task types, and the maps that hold them. */
#pragma once

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
 * GEN_ANY (kdefs.h) where the agent could not read it (procfs, overlayfs,
 * btrfs, network filesystems): the number alone decides there. 0 is a real
 * generation (files written by mkfs, such as an image's /etc/shadow). See
 * internal/enforce/fileident.go. The field was padding before: the
 * programs of an older agent, attached until this agent's replace them,
 * read the same layout and ignore it. */
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
