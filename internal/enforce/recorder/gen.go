package recorder

//go:generate go tool bpf2go -tags linux -target amd64 -type exec_event -type exit_event -type syscall_event -type trace_config -type count_key -type denial -type denial_watch -type deny_flag recorder ../../../bpf/recorder.c -- -I../../../bpf/include -O2 -g -Wall -Werror
