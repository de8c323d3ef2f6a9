/* LSM rule tables: operations, keys, values and the pinned maps the Go loader fills. */
#pragma once

/* From include/linux/fs.h and uapi headers (macros are not in BTF). */
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
 * GEN_ANY (kdefs.h) where the agent could not read it (procfs, overlayfs,
 * btrfs, network filesystems): the number alone decides there. 0 is a
 * real generation (files written by mkfs). See
 * internal/enforce/fileident.go.
 * (lsm_ino_rules, the table before, held no generation: a new name, so
 * an older agent's pin is never adopted with the wrong layout.) */
struct ino_rule {
	struct access_rule rule;
	__u32 generation; /* i_generation of the file, or GEN_ANY */
	/* S_IFMT of the file, or 0 (any type: padding before). On overlayfs
	 * over two filesystems a directory's number is drawn by overlayfs
	 * and a file's is its layer's, both under the overlay's device: a
	 * protected directory's entry matched a workspace file given the
	 * same number (a benign exec refused in the qemu guest). */
	__u32 ftype;
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
