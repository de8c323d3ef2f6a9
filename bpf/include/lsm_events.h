/* LSM events: what file, task, mount and module decisions report. */
#pragma once

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
