package enforce

//go:generate go tool bpf2go -tags linux -target amd64 -type event_hdr -type sandbox core ../../bpf/core.c -- -I../../bpf/include -O2 -g -Wall -Werror
