package main

//go:generate go tool bpf2go -tags linux -target amd64 probes probes.c -- -I../../bpf/include -O2 -g -Wall -Werror
