package cgroupbpf

//go:generate go tool bpf2go -tags linux -target amd64 -type dev_event -type sysctl_event -type sock_event -type dev_key -type sysctl_key -type sock_key -type rule -type listen_cfg -type listen_event cgroup ../../../bpf/cgroup.c -- -I../../../bpf/include -O2 -g -Wall -Werror
