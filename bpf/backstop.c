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
 *   LSM unix hook runs (backstop_unix.h).
 * - sys_exit of mmap/mremap/shmat, i386 mapping calls and
 *   sched_process_exec: mappings below vm.mmap_min_addr, where no
 *   mmap_addr hook runs (include/backstop_lowmap.h).
 */
#include "common.h"
#include "kdefs.h"
#include "pathwalk.h"
#include "subtree.h"
#include "tty.h"
#include "ipcobj.h"
#include "procfs.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* The programs, one header per concern; each uses what the ones above it define. */
#include "backstop_defs.h"
#include "backstop_maps.h"
#include "backstop_rules.h"
#include "backstop_ipc.h"
#include "backstop_entry.h"
#include "backstop_btf.h"
#include "backstop_syscall_event.h"
#include "backstop_mmap_exec.h"
#include "backstop_compat.h"
#include "backstop_vcache.h"
#include "backstop_sys_enter.h"
#include "backstop_file.h"
#include "backstop_unix.h"
#include "backstop_lowmap.h"
#include "backstop_sys_exit.h"
#include "backstop_fork.h"
#include "backstop_inode.h"
#include "backstop_notify.h"
#include "backstop_signal.h"
#include "backstop_cap.h"
