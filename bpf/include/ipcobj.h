/* IPC objects sandboxes created (bpf/ipc.c records them; the backstop
 * reads them to tell a sandbox's own System V objects from the host's).
 * One definition: both objects adopt the pinned map by name. */
#ifndef WATCHER_IPCOBJ_H
#define WATCHER_IPCOBJ_H

/* Kinds, also the index into ipc_namespace.ids for System V (IPC_SEM_IDS
 * 0, IPC_MSG_IDS 1, IPC_SHM_IDS 2) plus one. */
enum ipc_kind {
	IPC_KIND_SEM = 1,
	IPC_KIND_MSG = 2,
	IPC_KIND_SHM = 3,
	IPC_KIND_SHM_FILE = 4, /* a file under /dev/shm */
	IPC_KIND_MQUEUE = 5,   /* a POSIX message queue */
};

struct ipc_obj_key {
	__u32 kind;  /* enum ipc_kind */
	__u32 ns;    /* System V, mqueue: the IPC namespace's inode; file: kernel dev_t (MAJOR<<20|MINOR) */
	__u64 obj;   /* System V: the id; file, mqueue: the inode number */
};

struct ipc_obj {
	__u64 sandbox_cg; /* root cgroup of the sandbox that created it */
	__u64 ts_ns;      /* bpf_ktime_get_boot_ns at creation */
	__u32 sandbox_id;
	__u32 tgid;       /* creator */
	__s32 key;        /* System V key */
	__u32 uid;
	__u8 comm[TASK_COMM_LEN];
	char name[64];    /* file: path at creation, /dev/shm/...; mqueue: /name */
};

/* Objects by kernel identity: the creating sandbox. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct ipc_obj_key);
	__type(value, struct ipc_obj);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ipc_objects SEC(".maps");

#endif
