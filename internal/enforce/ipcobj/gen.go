package ipcobj

//go:generate go tool bpf2go -tags linux -target amd64 -type ipc_obj_key -type ipc_obj -type ipc_config -type ipc_root_name ipc ../../../bpf/ipc.c -- -I../../../bpf/include -O2 -g -Wall -Werror
