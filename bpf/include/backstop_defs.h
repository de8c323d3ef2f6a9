/* Backstop constants: map declaration macros, x86_64 syscall numbers, categories. */
#pragma once

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

#define MAX_SYSCALLS 512

#define FMODE_READ 0x1
#define FMODE_PATH 0x4000

#define CGROUP_SUPER_MAGIC 0x27e0eb
#define CGROUP2_SUPER_MAGIC 0x63677270

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
