package lsm

//go:generate go tool bpf2go -tags linux -target amd64 -type file_event -type task_event -type mount_event -type module_event -type path_key -type ino_key -type ino_rule -type fs_key -type dev_key -type access_rule -type op_key -type decision -type cap_rules -type sock_key -type sock_event -type syscall_check_key lsm ../../../bpf/lsm.c -- -I../../../bpf/include -O2 -g -Wall -Werror
