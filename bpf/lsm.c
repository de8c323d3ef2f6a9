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
#include "kdefs.h"
#include "pathwalk.h"
#include "lsm_hook.h"
#include "tty.h"
#include "procfs.h"
#include "subtree.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* The hooks, one header per concern; each uses what the ones above it define. */
#include "lsm_rules.h"
#include "lsm_events.h"
#include "lsm_decide.h"
#include "lsm_syscall.h"
#include "lsm_task.h"
#include "lsm_module.h"
#include "lsm_mount.h"
#include "lsm_ipc.h"
#include "lsm_file.h"
#include "lsm_path.h"
#include "lsm_create.h"
#include "lsm_entry.h"
#include "lsm_sigio.h"
#include "lsm_exec.h"
#include "lsm_anon.h"
#include "lsm_socket.h"
#include "lsm_tty.h"
#include "lsm_notify.h"
