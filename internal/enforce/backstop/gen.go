package backstop

//go:generate go tool bpf2go -tags linux -target amd64 -type file_event -type syscall_event -type cgroup_event -type path_key -type path_rule -type inode_key -type syscall_rule -type category_rule -type sb_rule_key -type task_sandbox -type vc_key -type vc_entry backstop ../../../bpf/backstop.c -- -I../../../bpf/include -O2 -g -Wall -Werror
