//go:build ignore

/* Empty programs on the syscall tracepoints, to measure what each attach
 * mechanism costs by itself (bench/syscall). */
#include "common.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

SEC("tp_btf/sys_enter")
int BPF_PROG(empty_tp_btf_enter, struct pt_regs *regs, long id) { return 0; }

SEC("tp_btf/sys_exit")
int BPF_PROG(empty_tp_btf_exit, struct pt_regs *regs, long ret) { return 0; }

SEC("raw_tp/sys_enter")
int empty_raw_tp_enter(void *ctx) { return 0; }

SEC("raw_tp/sys_exit")
int empty_raw_tp_exit(void *ctx) { return 0; }

SEC("tracepoint/syscalls/sys_enter_openat")
int empty_tp_openat_enter(void *ctx) { return 0; }

SEC("tracepoint/syscalls/sys_exit_openat")
int empty_tp_openat_exit(void *ctx) { return 0; }
